"""Real services for the tests, started once per run and always stopped.

Kafka: ``KAFKA_BOOTSTRAP`` if set, else a testcontainers Kafka container when a Docker engine
answers, else a local Tansu broker process. Redis: ``REDIS_URL``, else testcontainers, else a
local ``redis-server`` process. Tests that need to kill, suspend or restart a service start a
dedicated local process of their own (see ``local_broker`` and ``local_redis``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from gate._local import LocalBroker, LocalRedis, LocalServiceError
from tests.support import Kafka


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run long-running variants")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long-running variant: use --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    if docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as container:
            yield container.get_bootstrap_server()
        return
    with LocalBroker() as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def kafka(kafka_bootstrap: str) -> Kafka:
    return Kafka(kafka_bootstrap)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    if docker_answers():
        from testcontainers.redis import RedisContainer

        with RedisContainer() as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        return
    with LocalRedis() as server:
        yield server.url


@pytest.fixture
def local_broker() -> Iterator[LocalBroker]:
    """A broker of this test's own, for suspending or killing it."""
    broker = LocalBroker()
    try:
        broker.start()
    except LocalServiceError as exc:
        pytest.skip(f"needs a local broker process: {exc}")
    with contextlib.closing(broker):
        yield broker


@pytest.fixture
def local_redis() -> Iterator[LocalRedis]:
    """A redis-server of this test's own, for killing and restarting it."""
    server = LocalRedis()
    try:
        server.start()
    except LocalServiceError as exc:
        pytest.skip(f"needs a local redis-server process: {exc}")
    with contextlib.closing(server):
        yield server
