"""Writing records: handlers' outputs (``_output``), the engine's producer of them
(``_producer``), what an item's outputs wait for (their acknowledgement and the transaction lock,
``_deliveries``), and dead-letter copies (``_dead_letters``). Below the consumer's shell, above
the engine's core."""
