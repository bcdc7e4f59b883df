"""Publishing gate states: in process, for the HTTP API's waiters (``_publish``'s
``SnapshotStore``), and to Redis (``_publish``'s ``RedisPublisher``, on the hash and channel
layout of ``_redis``, which the SDK reads through the gate's public API).

Below the service, beside polling and reports. Nothing is imported here.
"""
