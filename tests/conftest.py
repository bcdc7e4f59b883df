"""Real services for the tests, started once per run and always stopped.

Kafka: ``KAFKA_BOOTSTRAP`` if set, else a testcontainers Kafka container when a Docker engine
answers, else local broker processes: every broker-dependent test runs on both local brokers,
Tansu and noida-db (``--broker tansu`` or ``--broker noida`` runs one). Redis: ``REDIS_URL``,
else testcontainers, else a local ``redis-server`` process. Tests that need to kill, suspend
or restart a service start a dedicated local process of their own (see ``local_broker`` and
``local_redis``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings
from xdist.scheduler import LoadScopeScheduling

from demo._local import BROKERS, LocalBroker, LocalRedis, LocalServiceError
from tests.support import Broker, Kafka

# No time limit per example: a loaded machine (CI's two cores running brokers and Spark
# beside the tests) must not fail a property for its speed. Properties assert outcomes only.
settings.register_profile("outcomes", deadline=None)
settings.load_profile("outcomes")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run long-running variants")
    parser.addoption(
        "--broker",
        action="append",
        choices=sorted(BROKERS),
        help="run the broker-dependent tests on this local broker only (repeatable; "
        "default: every one)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that needs a broker runs once per broker."""
    if "broker" not in metafunc.fixturenames:
        return
    if os.environ.get("KAFKA_BOOTSTRAP") or docker_answers():
        names = ["external"]
    else:
        names = metafunc.config.getoption("--broker") or sorted(BROKERS, reverse=True)
    metafunc.parametrize("broker", names, indirect=True, scope="session")


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> Broker:
    """Which broker this test runs on, and what that broker can do."""
    name = request.param
    if name == "external":
        return Broker("external", keeps_metadata=True, adds_partitions=True, keeps_data=True)
    kind = BROKERS[name]
    return Broker(
        name,
        keeps_metadata=kind.keeps_metadata,
        adds_partitions=kind.adds_partitions,
        keeps_data=kind.keeps_data,
        cooperative_rebalances=kind.cooperative_rebalances,
        evicts_dead_members=kind.evicts_dead_members,
        ends_every_round=kind.ends_every_round,
    )


# Run in parallel (``make test``: ``pytest -n 3 --dist loadgroup``), each
# process with services of its own (the session's fixtures). A file's tests run in one process,
# one after the other, sharing their module's fixtures; the files of these groups, one after the
# other in one process too: the Spark tests (a Spark session is a JVM that takes a core) and the
# fault scenarios (they stop and suspend brokers and time what follows).
SERIAL_GROUPS = {"tests/sdk/test_spark": "spark", "tests/faults/": "faults"}


def xdist_group(path: str) -> str:
    """The group of the tests of the file at ``path`` (relative to the checkout)."""
    for prefix, group in SERIAL_GROUPS.items():
        if path.startswith(prefix):
            return group
    return path


def spark_master(item: pytest.Item) -> str:
    """The Spark master a test's session runs on ("" without one)."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "spark" in callspec.params:
        return str(callspec.params["spark"])
    if "spark" not in getattr(item, "fixturenames", ()):
        return ""
    return "local-cluster" if item.path.name == "test_spark_cluster.py" else "local"


SPARK_WORKER_LATE = pytest.mark.flaky(reruns=1, only_rerun=["Python worker failed to connect back"])
"""A Spark test runs once more (pytest-rerunfailures) when, and only when, Spark gave up on a
Python worker it started: it waits a fixed 10 s for one to connect back (not configurable),
which a saturated machine can exceed (the worker needs about 0.4 s of CPU to get there)."""


FIRST = ("spark", "faults", "tests/test_docs.py", "tests/sdk/test_outputs.py")
"""The longest groups, handed out first (in this order): pytest-xdist gives each process
the next group when it runs out, so one of these begun last would finish long after the
rest."""


class GroupScheduling(LoadScopeScheduling):
    """pytest-xdist's scheduling by scope, a scope being a test's group (:func:`xdist_group`),
    told from its node id: pytest-xdist's own ``loadgroup`` reads ``xdist_group`` marks into
    node ids, which pytest 9 no longer lets it change (every test was then scheduled alone)."""

    def _split_scope(self, nodeid: str) -> str:
        return xdist_group(nodeid.split("::", 1)[0])


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling | None:
    if config.getvalue("dist") != "loadgroup":
        return None
    config.option.loadscopereorder = False  # (its default hands out the most tests first)
    return GroupScheduling(config, log)


@pytest.hookimpl(trylast=True)  # (after pytest has ordered them by their fixtures' parameters)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = {}
    for item in items:
        path = item.path.relative_to(config.rootpath).as_posix()
        groups[item] = xdist_group(path)
        item.add_marker(pytest.mark.xdist_group(groups[item]))
        if groups[item] == "spark":
            item.add_marker(SPARK_WORKER_LATE)
    rank = {group: place for place, group in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(groups[item], len(FIRST)))  # (stable)
    # The Spark tests share one session per master (tests/sdk/test_spark.py): one after the
    # other by broker, then by master, each session started once per broker.
    spark = [item for item in items if groups[item] == "spark"]
    if spark:

        def order(item: pytest.Item) -> tuple[str, int]:
            callspec = getattr(item, "callspec", None)
            broker = str(callspec.params.get("broker", "")) if callspec is not None else ""
            master = spark_master(item)
            return broker, 0 if not master else 1 if master.startswith("local[") else 2

        first = items.index(spark[0])
        rest = [item for item in items if groups[item] != "spark"]
        items[:] = rest[:first] + sorted(spark, key=order) + rest[first:]
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long-running variant: use --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _group(item: pytest.Item | None) -> str | None:
    marker = item.get_closest_marker("xdist_group") if item is not None else None
    return marker.args[0] if marker is not None else None


def _stop_spark() -> None:
    spark_tests = sys.modules.get("tests.sdk.test_spark")
    if spark_tests is not None:
        spark_tests.stop_spark()  # the session the Spark tests shared


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _group(item) == "spark" and _group(nextitem) != "spark":
        _stop_spark()  # (the tests after them need not share the machine with its JVMs)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _stop_spark()


def docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def kafka_bootstrap(broker: Broker) -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    if docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as container:
            yield container.get_bootstrap_server()
        return
    with BROKERS[broker.name]() as process:
        yield process.bootstrap


@pytest.fixture(scope="session")
def kafka(kafka_bootstrap: str, broker: Broker) -> Kafka:
    return Kafka(kafka_bootstrap, broker)


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
def local_broker(broker: Broker) -> Iterator[LocalBroker]:
    """A broker process of this test's own (of the kind under test), for suspending, killing
    or restarting it."""
    if broker.name not in BROKERS:
        pytest.skip("needs a local broker process (KAFKA_BOOTSTRAP points elsewhere)")
    process = BROKERS[broker.name]()
    try:
        process.start()
    except LocalServiceError as exc:
        pytest.skip(f"needs a local broker process: {exc}")
    with contextlib.closing(process):
        yield process


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
