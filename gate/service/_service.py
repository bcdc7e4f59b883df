"""The gate service: poll, evaluate and publish, forever, surviving Kafka and Redis outages."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from gate.evaluate._state import GateState, PollResult
from gate.evaluate._status import GateEvaluator
from gate.poll._isolated import IsolatedPoller, make_poller
from gate.poll._poller import OffsetPoller, describe_kafka_error
from gate.poll._record_times import seed_record_times
from gate.publish._publish import RedisPublisher, SnapshotStore
from gate.service._config import GateConfig, GateSpec
from gate.service._events import GateEvents, Overruns, cycle_timing
from gate.service._metrics import GateMetrics

log = logging.getLogger("gate")


class StartupError(Exception):
    """The service cannot start; the message says why in one line."""


class GateService:
    """Runs the poll loop for every configured gate and publishes what it finds."""

    def __init__(
        self,
        config: GateConfig,
        *,
        registry: CollectorRegistry | None = None,
        admin: AdminClient | None = None,
    ) -> None:
        self.config = config
        self.store = SnapshotStore(
            config.gates,
            heartbeat=config.heartbeat_ms / 1000,
            history_step=config.status.history_step_ms / 1000,
        )
        self.registry = registry or CollectorRegistry()
        self.metrics = GateMetrics(self.registry)
        self.metrics.watch(self)
        policy = config.status.policy()
        self.evaluators = {
            name: GateEvaluator(
                name, spec.topics, spec.depends_on, policy, dependent=spec.group or name
            )
            for name, spec in config.gates.items()
        }
        self.redis = (
            RedisPublisher(
                config.redis.url.get_secret_value(),
                prefix=config.redis.prefix,
                password=config.redis.password.get_secret_value()
                if config.redis.password
                else None,
            )
            if config.redis
            else None
        )
        self._admin = admin
        self.poller: OffsetPoller | IsolatedPoller | None = None
        self.answered_at: float | None = None
        """When the last poll cycle the cluster answered started, on the monotonic clock
        (None: none yet)."""
        self.last_poll: PollResult | None = None
        self.last_evaluation: float = 0.0
        """Seconds the last poll cycle spent evaluating the gates."""
        self.last_record_read: float = 0.0
        """Seconds the last poll cycle spent reading the timestamps of records older than
        the gate (none once they are read)."""
        self.schedule = Overruns(self.metrics)
        """How poll cycles fit the poll interval."""
        self.events = GateEvents(self.metrics, config.status.rewind_policy)
        self.failing: dict[str, tuple[str, ...]] = {}
        """The gates the last poll cycle could not refresh, with what kept it from it."""
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.stopping = asyncio.Event()
        """Set when the service begins to stop: streams and long-polls end at once."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._logged_errors: tuple[str, ...] = ()
        self._logged_dependent_errors: tuple[str, ...] = ()
        dependencies = {g for spec in config.gates.values() for g in spec.depends_on}
        # Dependents' own groups that no gate depends on: read for their progress only, so a
        # failure to read them (e.g. an ACL covering just the dependencies) is no poll error.
        self.dependent_only = {
            spec.group or name for name, spec in config.gates.items()
        } - dependencies

    @property
    def poll_interval(self) -> float:
        return self.config.poll_interval_ms / 1000

    def topics_by_group(self) -> dict[str, list[str]]:
        """The dependency groups' topics, and each gate's dependent group (its own progress
        is shown against the watermarks; its offsets are read alongside)."""
        result: dict[str, list[str]] = {}
        for name, spec in self.config.gates.items():
            for group in [*spec.depends_on, spec.group or name]:
                topics = result.setdefault(group, [])
                topics.extend(t for t in spec.topics if t not in topics)
        return result

    def prepare(self) -> None:
        """Create the Kafka admin client; raises :class:`StartupError` on bad properties."""
        if self.poller is not None:
            return
        config = self.config
        options = {
            "request_timeout": config.request_timeout_ms / 1000,
            "metadata_interval": config.metadata_interval_ms / 1000,
            "idle_interval": config.idle_poll_interval_ms / 1000,
        }
        try:
            if self._admin is not None:
                self.poller = OffsetPoller(
                    config.kafka_properties(), self.topics_by_group(), admin=self._admin, **options
                )
            else:
                self.poller = make_poller(
                    config.kafka_properties(),
                    self.topics_by_group(),
                    niceness=config.poller_niceness,
                    **options,
                )
        except KafkaException as exc:
            raise StartupError(f"kafka: {describe_kafka_error(exc)}") from None
        if isinstance(self.poller, IsolatedPoller):
            # The gates are evaluated in the admin client's process: at 1,000 groups an
            # evaluation takes a quarter of a second of an interpreter, not this one's.
            self.poller.evaluate(self.evaluators)

    async def start(self) -> None:
        """Start polling (and publishing to Redis) in background tasks."""
        self.prepare()
        self._loop = asyncio.get_running_loop()
        if self.redis is not None:
            await self._continue_redis_versions()
            self._tasks.append(asyncio.create_task(self.redis.run(self.store), name="redis"))
        self._tasks.append(asyncio.create_task(self._poll_loop(), name="poll"))

    async def _continue_redis_versions(self) -> None:
        assert self.redis is not None
        try:
            stored = await asyncio.wait_for(self.redis.stored_versions(self.config.gates), 3.0)
        except Exception as exc:  # Redis down at start: versions are time-based anyway
            if isinstance(exc, TimeoutError):
                self.redis.healthy, self.redis.last_error = False, "no answer within 3 s"
            log.warning(
                "redis unreachable at start (%s); publishing when it returns",
                self.redis.last_error or exc,
            )
            return
        for gate, version in stored.items():
            self.evaluators[gate].version_floor = version

    def begin_stopping(self) -> None:
        """The service is about to stop (from any thread): it evaluates no more polls (a
        dependency stopping meanwhile is no news), and its streams and long-polls end now
        instead of holding the shutdown until they time out."""
        self._stopping = True
        loop = self._loop
        if loop is None or loop.is_closed():
            self.stopping.set()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.stopping.set()
        else:
            loop.call_soon_threadsafe(self.stopping.set)

    async def stop(self) -> None:
        self.begin_stopping()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.redis is not None:
            await self.redis.close()
        if self.poller is not None:
            self.poller.close()

    async def poll_once(self) -> list[GateState]:
        """Poll once and publish; returns the new states (empty if the poll failed)."""
        states = await asyncio.to_thread(self._poll_and_evaluate)
        for state in states:
            self.store.update(state)
        return states

    def _poll_and_evaluate(self) -> list[GateState]:
        assert self.poller is not None
        poll = self.poller.poll()
        if self._stopping:
            return []  # a poll the shutdown cut short
        poll = self._set_dependent_errors_apart(poll)
        self.last_poll = poll
        self.metrics.polls.inc()
        self.metrics.poll_duration.observe(poll.duration)
        self.metrics.groups_carried.set(len(poll.carried))
        self.metrics.groups_read.set(len(poll.committed) - len(poll.carried))
        states: list[GateState] = []
        failing: dict[str, tuple[str, ...]] = {}
        evaluating = time.perf_counter()
        poller = self.poller
        child = poller if isinstance(poller, IsolatedPoller) and poller.evaluates else None
        for name, evaluator in self.evaluators.items():
            errors = read_errors(poll, self.config.gates[name])
            if errors:
                failing[name] = errors
                continue
            try:
                state = evaluator.observe(poll) if child is None else _evaluated(child, name)
            except Exception as exc:  # one gate's failure stays that gate's
                failing[name] = (f"internal: {exc}",)
                self.metrics.poll_errors.labels("internal").inc()
                if self.failing.get(name) != failing[name] and child is None:
                    # (the admin client's process logs its own, with the traceback)
                    log.exception("gate %s: unexpected error while evaluating a poll", name)
                continue
            states.append(state)
            self.events.record(state, present(state))
        self.last_evaluation = time.perf_counter() - evaluating
        if isinstance(poller, IsolatedPoller):
            self.last_evaluation += poller.evaluation
        self.metrics.evaluation_duration.observe(self.last_evaluation)
        self.last_record_read = 0.0
        if child is None and not self._stopping:  # (else the admin client's process reads them)
            reading = time.perf_counter()
            try:
                seed_record_times(self.evaluators.values(), poller.record_times)
            except Exception:  # the ages stay lower bounds: no reason to lose this poll
                log.exception("unexpected error while reading record timestamps")
            self.last_record_read = time.perf_counter() - reading
        self.failing = failing
        self._report_errors(poll, list(failing))
        if poll.answered:
            self.answered_at = time.monotonic() if poll.monotonic is None else poll.monotonic
        return states

    def _set_dependent_errors_apart(self, poll: PollResult) -> PollResult:
        """Failures to read only a dependent's own group are logged (once per change), not
        counted as poll errors: its progress is then the last known."""
        failed = poll.failed_groups & self.dependent_only
        prefixes = tuple(f"group {group}:" for group in failed)
        apart = tuple(e for e in poll.errors if prefixes and e.startswith(prefixes))
        if apart != self._logged_dependent_errors:
            if apart:
                log.warning(
                    "cannot read the dependent's own group (%s); its progress shows the last "
                    "offsets read",
                    "; ".join(apart),
                )
            self._logged_dependent_errors = apart
        if not apart:
            return poll
        return dataclasses.replace(poll, errors=tuple(e for e in poll.errors if e not in apart))

    def _report_errors(self, poll: PollResult, skipped: list[str]) -> None:
        for error in poll.errors:
            self.metrics.poll_errors.labels(error.split(":", 1)[0].split(" ", 1)[0]).inc()
        if poll.errors != self._logged_errors:
            if poll.errors:
                kept = [gate for gate in skipped if self.store.latest(gate) is not None]
                pending = [gate for gate in skipped if gate not in kept]
                said = []
                if kept:
                    said.append(f"serving the last snapshot of {', '.join(kept)}")
                if pending:
                    said.append(f"no snapshot yet of {', '.join(pending)}")
                log.warning(
                    "poll failed (%s)%s",
                    "; ".join(poll.errors),
                    f"; {'; '.join(said)}" if said else "",
                )
            else:
                log.info("poll recovered")
            self._logged_errors = poll.errors

    async def _poll_loop(self) -> None:
        interval = self.poll_interval
        next_at = time.monotonic()
        while True:
            started = time.monotonic()
            try:
                await self.poll_once()
            except Exception:  # never let one bad poll end the loop
                self.metrics.poll_errors.labels("internal").inc()
                log.exception("unexpected error while polling")
            ended = time.monotonic()
            poll = self.last_poll
            timing = cycle_timing(
                interval,
                next_at,
                started,
                ended,
                self.last_record_read + (0.0 if poll is None else poll.duration),
                self.last_evaluation,
            )
            self.schedule.note(timing)
            next_at += interval
            delay = next_at - ended
            if timing.late or delay < 0:  # none queued: the next starts now, the schedule too
                next_at = ended
                delay = 0
            await asyncio.sleep(delay)

    @property
    def overruns(self) -> int:
        """Poll cycles that took longer than the poll interval (the next started late)."""
        return self.schedule.count

    @property
    def overrunning(self) -> bool:
        """Whether poll cycles take longer than the poll interval (from the first that does
        to the last of FIT_AGAIN_CYCLES that fit again in a row)."""
        return self.schedule.overrunning

    @property
    def stale_after(self) -> float:
        """Seconds without an answer from the cluster after which the service is not ready,
        and without a successful poll of a gate after which its verdict is unknown."""
        return (self.config.readiness_max_age_ms or 0) / 1000

    def readiness(self, now: float | None = None) -> tuple[bool, str]:
        """Whether the service can serve, with a reason: it has completed a poll cycle the
        cluster answered, and the cluster answered within ``stale_after``. One gate that
        cannot read its dependencies (or has no topic, or fails to evaluate) leaves the
        service ready: that shows in the gate's own answers, status and metrics. ``now`` is
        on the monotonic clock."""
        now = time.monotonic() if now is None else now
        last = self.last_poll
        why = f" (the last poll: {'; '.join(last.errors)})" if last and last.errors else ""
        if self.answered_at is None:
            if last is None:
                return False, "no poll cycle completed yet"
            return False, f"the cluster has not answered a poll yet{why}"
        age = max(0.0, now - self.answered_at)
        limit = self.stale_after
        if age > limit:
            return False, f"the cluster has not answered for {age:.1f}s (limit {limit:.1f}s){why}"
        detail = f"the cluster answered {age:.1f}s ago"
        if self.failing:
            detail += f"; the last poll did not refresh: {', '.join(self.failing)} (see /status)"
        redis = self.redis
        if redis is not None and not redis.healthy:
            # Still ready: HTTP serves the watermarks; Redis followers keep their last ones.
            detail += f"; redis unreachable: {redis.last_error or 'not connected yet'}"
        return True, detail


def _evaluated(poller: IsolatedPoller, gate: str) -> GateState:
    """The state the admin client's process evaluated for ``gate`` from its last poll;
    raises with the message of what its evaluation raised there."""
    state = poller.evaluated.get(gate, "the admin client's process did not evaluate it")
    if isinstance(state, str):
        raise RuntimeError(state)
    return state


def read_errors(poll: PollResult, spec: GateSpec) -> tuple[str, ...]:
    """Why ``poll`` cannot refresh the gate of ``spec`` (empty when it can): reading its
    dependency groups' offsets, or its topics' partitions, failed."""
    if poll.refreshes(spec.topics, spec.depends_on):
        return ()
    groups = poll.failed_groups.intersection(spec.depends_on)
    topics = poll.failed_topics.intersection(spec.topics)
    prefixes = tuple(f"group {group}:" for group in sorted(groups))
    if topics:
        prefixes += ("metadata:",)
    own = tuple(error for error in poll.errors if error.startswith(prefixes))
    return own or poll.errors or ("its dependencies could not be read",)


def present(state: GateState) -> float:
    """Now, on the wall clock of ``state``'s poll: ages computed from it are the time that
    passed since, even when the system clock has been stepped meanwhile."""
    return state.now(time.monotonic(), time.time())
