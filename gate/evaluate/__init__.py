"""Evaluation, pure: from what a poll saw to each gate's state. The watermarks
(``_watermark``, shared with the SDK), what a state holds (``_state``), one dependency group
across polls (``_group``), a gate's evaluator (``_status``), its verdict (``_verdict``), lag in
seconds (``_lag``) and the bounded history behind the status page's charts (``_history``).

The bottom layer: nothing here performs I/O or imports a Kafka, Redis or HTTP client
(a contract in pyproject.toml). Nothing is imported here: the poller's child process and the
Spark source's executors import what they need of it alone.
"""
