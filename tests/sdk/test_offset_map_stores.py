"""Offset maps kept in Redis: read back in one request per assignment, never trusted blindly,
and never allowed to stall an assignment when Redis is unwell."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from demo._local import LocalRedis
from sdk import Options
from sdk.consumer._maps import OffsetMaps, choose_store
from sdk.engine._offsets import encode_offset_map


class CountingClient:
    """The real Redis client, counting the requests made through it."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.requests = 0

    def mget(self, keys: list[str]) -> Any:
        self.requests += 1
        return self.client.mget(keys)

    def pipeline(self, **kwargs: Any) -> Any:
        self.requests += 1
        return self.client.pipeline(**kwargs)

    def close(self) -> None:
        self.client.close()


def redis_maps(url: str) -> tuple[OffsetMaps, CountingClient]:
    maps = choose_store(
        Options(offset_map_store="redis", offset_map_redis_url=url),
        {},
        "g",
        "t",
        None,  # type: ignore[arg-type]
    )
    counting = CountingClient(maps._redis)
    maps._redis = counting
    return maps, counting


def test_maps_are_read_in_one_request_and_garbage_is_ignored(local_redis: LocalRedis) -> None:
    maps, client = redis_maps(local_redis.url)
    good = encode_offset_map(5, [7, 8, 9])
    assert good
    raw = client.client
    raw.set(maps.redis_key(("t", 0)), f"5|{good}")
    raw.set(maps.redis_key(("t", 1)), b"\xff\xfe|not ascii")
    raw.set(maps.redis_key(("t", 2)), "4|" + good)  # written for another commit
    raw.set(maps.redis_key(("t", 3)), "5|om1:\u00b2:r:AQE")
    found = [TopicPartition("t", p, 5) for p in range(6)]
    restored = maps.restore(found)
    assert restored == {("t", 0): [(7, 10)]}
    assert client.requests == 1


def test_an_unresponsive_redis_costs_one_short_wait_per_assignment_then_none(
    local_redis: LocalRedis,
) -> None:
    maps, client = redis_maps(local_redis.url)
    partitions = [TopicPartition("t", p, 5) for p in range(50)]
    local_redis.suspend()
    try:
        assert maps.restore(partitions) == {}
        assert client.requests == 1, "one request for all partitions"
        assert maps.restore(partitions) == {}
        assert client.requests == 1, "Redis is left alone for a while after a failure"
        maps.store([(("t", 0), 6, "")])
        assert client.requests == 1
    finally:
        local_redis.resume()
