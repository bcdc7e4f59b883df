"""Polling Kafka's admin API: the offset poller (``_poller``), the same in a child process of
its own (``_isolated``, the parent's side; ``_pollproc``, the child; ``_frames``, what they say
over the pipe), the reader of a few records' timestamps (``_record_times``) and librdkafka's log
lines (``_kafkalog``, which the SDK uses too).

It reads the cluster and hands what it saw to the evaluation below it, which the child runs
too; it knows nothing of publishing or serving. Nothing is imported here.
"""
