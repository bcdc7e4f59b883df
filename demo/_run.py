"""``gate demo``: the whole story on one machine.

A local broker and Redis (unless given), a ``payments`` topic with a steady producer, two
dependency services (``service-b`` fast, ``service-c`` slower with periodic hiccups) that
commit as they process, the gate watching them for ``service-a`` with its HTTP API on
``http://127.0.0.1:8080``, and ``service-a`` itself on the SDK's parallel consumer, holding
every payment until both dependencies have committed past it, with a live view of it all.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from demo._local import LocalNoida, LocalRedis
from gate import GateService, GateState, KafkaLog, parse_config, watermarks_key

# Beyond the gate's public API: the service with its HTTP API in a thread, and the verdict
# as the status page words it.
from gate.report._report import verdict_json
from gate.serve._serve import ListenError, ServedGate
from gate.service._service import present

TOPIC = "payments"
PARTITIONS = 3
LOG = KafkaLog("gate.demo.kafka")


@dataclass(frozen=True)
class DemoOptions:
    bootstrap: str | None = None
    redis_url: str | None = None
    use_redis: bool = True
    port: int = 8080
    kafka_port: int = 9092
    """The local broker's port when free (else any free port)."""
    redis_port: int = 6379
    """The local Redis's port when free (else any free port)."""
    duration: float = 0.0
    """Seconds to run; 0 runs until interrupted."""
    rate: float = 50.0
    """Records produced per second."""
    live: bool = True


class _Worker(threading.Thread):
    def __init__(self, name: str, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.stop_event = stop
        self.error: str | None = None


class PaymentsProducer(_Worker):
    def __init__(self, bootstrap: str, rate: float, stop: threading.Event) -> None:
        super().__init__("producer", stop)
        self.bootstrap = bootstrap
        self.rate = rate
        self.produced = 0

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0, "logger": LOG})
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            i = self.produced
            value = json.dumps({"payment": i, "amount": (i * 37) % 1000}).encode()
            try:
                producer.produce(TOPIC, key=f"account-{i % 97}".encode(), value=value)
            except BufferError:
                producer.poll(0.1)
                continue
            producer.poll(0)
            self.produced += 1
            next_at += interval
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))
        producer.flush(5)


class DependencyService(_Worker):
    """A plain consumer that processes each record for a while and commits as it goes."""

    def __init__(
        self,
        group: str,
        bootstrap: str,
        per_record: float,
        stop: threading.Event,
        hiccup_every: float = 0.0,
        hiccup_for: float = 0.0,
    ) -> None:
        super().__init__(group, stop)
        self.group = group
        self.bootstrap = bootstrap
        self.per_record = per_record
        self.hiccup_every = hiccup_every
        self.hiccup_for = hiccup_for
        self.processed = 0
        self.paused = False

    def run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "logger": LOG,
            }
        )
        try:
            committed = consumer.committed(
                [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], 10
            )
            consumer.assign(committed)
            started = last_commit = time.monotonic()
            pending: dict[int, int] = {}
            while not self.stop_event.is_set():
                now = time.monotonic()
                if self.hiccup_every:
                    phase = (now - started) % self.hiccup_every
                    self.paused = phase > self.hiccup_every - self.hiccup_for
                if self.paused:
                    self.stop_event.wait(0.05)
                    continue
                message = consumer.poll(0.05)
                if message is not None and message.error() is None:
                    time.sleep(self.per_record)  # the "work"
                    pending[message.partition()] = message.offset() + 1
                    self.processed += 1
                if pending and now - last_commit >= 0.2:
                    offsets = [TopicPartition(TOPIC, p, o) for p, o in pending.items()]
                    consumer.commit(offsets=offsets, asynchronous=False)
                    pending.clear()
                    last_commit = now
        except KafkaException as exc:
            self.error = str(exc)
        finally:
            consumer.close()


def _ensure_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": LOG})
    try:
        topics = admin.list_topics(timeout=10).topics
    except KafkaException as exc:
        raise DemoError(f"cannot reach the broker at {bootstrap}: {exc.args[0].str()}") from None
    if TOPIC in topics:
        return
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        with contextlib.suppress(KafkaException):
            future.result(10)


def _port(wanted: int) -> int | None:
    """``wanted`` when nothing listens there, else None (any free port)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", wanted))
        except OSError:
            return None
    return wanted


@contextlib.contextmanager
def _local_services(options: DemoOptions, moved: list[str]) -> Iterator[tuple[str, str | None]]:
    """The broker and Redis to use, started here unless given; a port that was busy and
    replaced by another is noted in ``moved``.

    The local broker is noida-db: a consumer group's first join there takes well under a
    second, and a static member (``group.instance.id``) restarted after a crash is assigned its
    partitions at once, so the docs' examples answer in seconds, also right after a Ctrl-C.
    """
    with contextlib.ExitStack() as stack:
        bootstrap = options.bootstrap
        if not bootstrap:
            port = _port(options.kafka_port)
            bootstrap = stack.enter_context(LocalNoida(port)).bootstrap
            if port is None:
                moved.append(
                    f"port {options.kafka_port} is busy: the broker listens on {bootstrap}"
                )
        redis_url = options.redis_url if options.use_redis else None
        if options.use_redis and not redis_url:
            port = _port(options.redis_port)
            redis = stack.enter_context(LocalRedis(port))
            redis_url = redis.url
            if port is None:
                moved.append(
                    f"port {options.redis_port} is busy: Redis listens on port {redis.port}"
                )
        yield bootstrap, redis_url


class DemoError(Exception):
    """The demo cannot run; the message says why in one line."""


def _table(
    state: GateState | None, services: list[DependencyService], service_a: dict[str, Any]
) -> Table:
    table = Table(title=f"gate service-a on topic {TOPIC}", expand=False)
    table.add_column("partition", justify="right")
    table.add_column("end", justify="right")
    for service in services:
        table.add_column(service.group, justify="right")
    table.add_column("watermark", justify="right", style="bold green")
    table.add_column("held by")
    table.add_column("service-a", justify="right", style="cyan")
    table.add_column("a: held", justify="right")
    if state is None:
        table.add_row("…", *["" for _ in range(len(services) + 5)])
        return table
    views = service_a.get("partitions", {})
    for (topic, partition), part in sorted(state.partitions.items()):
        cells = [str(partition), _num(part.end_offset)]
        for service in services:
            position = part.groups.get(service.group)
            status = position.status.value if position else "?"
            committed = _num(position.committed if position else None)
            cells.append(committed if status == "OK" else f"{committed} [yellow]{status}[/]")
        view = views.get((topic, partition), {})
        cells += [
            _num(part.watermark),
            ", ".join(part.holding),
            _num(view.get("committed")),
            _num(view.get("gate_held")),
        ]
        table.add_row(*cells)
    return table


def _num(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


class PaymentHandler:
    """service-a's work: a little time per payment, counted."""

    def __init__(self) -> None:
        self.processed = 0

    def __call__(self, record: Any) -> None:
        time.sleep(0.002)
        self.processed += 1


def _service_a(bootstrap: str, redis_url: str | None, gate_url: str) -> Any:
    """The dependent service on the SDK, gated from Redis (or the gate's HTTP stream)."""
    from sdk import Gate, HttpSource, Options, Ordering, ParallelConsumer, RedisSource

    source = RedisSource(redis_url) if redis_url else HttpSource(gate_url)
    return ParallelConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "service-a",
            "session.timeout.ms": 6000,
            "auto.offset.reset": "earliest",
        },
        [TOPIC],
        PaymentHandler(),
        Options(ordering=Ordering.KEY, max_concurrency=8),
        gate=Gate("service-a", [source]),
        registry=None,
    )


def run_demo(options: DemoOptions, console: Console | None = None) -> int:
    # Not a terminal (a file, a test): wide enough for the table not to wrap.
    console = console or (Console() if sys.stdout.isatty() else Console(width=160))
    stop = threading.Event()
    moved: list[str] = []  # said after the export line, which comes first
    with _local_services(options, moved) as (bootstrap, redis_url):
        _ensure_topic(bootstrap)
        data = {
            "kafka": {"bootstrap.servers": bootstrap},
            "poll_interval_ms": 200,
            "status": {"stall_after_ms": 5000, "lag_window_ms": 5000, "lag_threshold_ms": 2000},
            "gates": {"service-a": {"topics": [TOPIC], "depends_on": ["service-b", "service-c"]}},
        }
        if redis_url:
            data["redis"] = {"url": redis_url}
        service = GateService(parse_config(data, source="demo", env={}))
        try:
            served = ServedGate(service, port=options.port)
        except ListenError:
            served = ServedGate(service, port=0)
            moved.append(f"port {options.port} is busy: the gate listens on {served.url}")
        producer = PaymentsProducer(bootstrap, options.rate, stop)
        service_a = _service_a(bootstrap, redis_url, served.url)
        services = [
            DependencyService("service-b", bootstrap, 0.004, stop),
            DependencyService("service-c", bootstrap, 0.012, stop, hiccup_every=15, hiccup_for=4),
        ]
        workers: list[_Worker] = [producer, *services]
        with served:
            service_a.start()
            for worker in workers:
                worker.start()
            exports = f"export KAFKA_BOOTSTRAP={bootstrap} GATE_URL={served.url}" + (
                f" REDIS_URL={redis_url}" if redis_url else ""
            )
            console.print(exports, soft_wrap=True, highlight=False)
            console.print("# paste it into another terminal for the docs' examples", style="dim")
            for line in moved:
                console.print(line, style="yellow", soft_wrap=True)
            header = Text.assemble(
                ("broker ", "dim"),
                bootstrap,
                ("   redis ", "dim"),
                redis_url or "off",
                ("   status page ", "dim"),
                f"{served.url}/",
                ("   API ", "dim"),
                f"{served.url}/docs",
                ("   watermarks ", "dim"),
                f"{served.url}/watermarks/service-a",
            )
            if redis_url:
                header.append(f"\nredis hash {watermarks_key('gate', 'service-a')}", "dim")
            console.print(header)
            started = time.monotonic()

            def view(stopped: bool = False) -> Group:
                elapsed = time.monotonic() - started
                footer = Text(
                    f"{elapsed:5.1f}s  produced {producer.produced:,}  "
                    + "  ".join(f"{s.group} processed {s.processed:,}" for s in services)
                    + f"  service-a processed {service_a.handler.processed:,}"
                    + ("" if options.duration or stopped else "   (Ctrl-C to stop)"),
                    style="dim",
                )
                latest = service.store.latest("service-a")
                parts: list[Any] = [_table(latest, services, service_a.stats())]
                if latest is not None:
                    verdict = verdict_json(latest, present(latest))
                    style = "bold red" if verdict["state"] in ("stuck", "missing") else "green"
                    parts.append(Text(f"service-a: {verdict['text']}", style=style))
                return Group(*parts, footer)

            interrupted = False
            try:
                with Live(
                    view(), console=console, refresh_per_second=4, transient=not options.live
                ) as live:
                    while not options.duration or time.monotonic() - started < options.duration:
                        time.sleep(0.25)
                        if options.live:
                            live.update(view())
            except KeyboardInterrupt:
                interrupted = True
            finally:
                # The gate first: the services stopping next is not a stall to report.
                served.begin_stopping()
                stop.set()
                for worker in workers:
                    worker.join(10)
                service_a.stop(timeout=10)
            # Stopped by Ctrl-C or SIGTERM: one line of totals; at the end of --duration: all.
            console.print(view(True).renderables[-1] if interrupted else view(True))
        failures = [f"{w.name}: {w.error}" for w in workers if w.error]
        for failure in failures:
            console.print(f"[red]{failure}[/]")
        return 1 if failures else 0
