"""Client SDK: consume Kafka records only once the services you depend on have processed them."""
