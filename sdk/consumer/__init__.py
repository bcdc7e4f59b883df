"""The shell around one Kafka consumer, with :class:`ParallelConsumer` at its top.

The facade (``_parallel``), on its clients (``_clients``: made, opened, closed), starts the
consumer's thread (``_loop``), which alone touches the Kafka consumer and the engine's core:
results and commands (``_inbox``), rebalances (``_rebalance``), commits and where offset
maps are kept (``_commits``, ``_maps``), exactly-once transactions (``_transactions``), the
gate's release limits (``_holds``); handlers run in ``_runners`` (threads or an asyncio
loop) by ``_work``; what the consumer publishes: ``_stats`` and ``_metrics``. Imports go
downward: to ``sdk.produce``, ``sdk.gating`` and ``sdk.engine``.
"""
