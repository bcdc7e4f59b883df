"""The gate's configuration: a YAML file plus environment overrides, validated up front.

Every problem is reported as one readable line naming the field, e.g.
``gates.service-a.depends_on: must list at least one consumer group``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from gate.evaluate._group import StatusPolicy

TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
NAME_PATTERN = r"^[A-Za-z0-9._-]{1,200}$"
_KAFKA_PROPERTY = re.compile(r"^[a-z0-9]+(\.[a-z0-9_]+)*$")

TopicName = Annotated[str, StringConstraints(pattern=TOPIC_PATTERN)]
GateName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
GroupId = Annotated[str, StringConstraints(min_length=1, max_length=255)]
KafkaValue = str | int | float | bool


class ConfigError(Exception):
    """The configuration is invalid; ``problems`` holds one readable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GateSpec(_Strict):
    """One dependent service: the topics it consumes and the groups it waits for."""

    topics: list[TopicName] = Field(min_length=1)
    depends_on: list[GroupId] = Field(min_length=1)
    group: GroupId | None = None
    """The dependent service's own consumer group (defaults to the gate's name): its progress
    is shown against the watermarks (is the dependent or a dependency the bottleneck?), and
    it is used to detect dependency cycles between gates."""

    @field_validator("topics", "depends_on")
    @classmethod
    def _unique(cls, values: list[str]) -> list[str]:
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            raise ValueError(f"lists {', '.join(duplicates)} more than once")
        return values


class RedisSettings(_Strict):
    url: SecretStr
    """``redis://``, ``rediss://`` (TLS) or ``unix://``; may carry a password."""
    prefix: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:-]{1,100}$")] = "gate"
    password: SecretStr | None = None
    """Used when the URL carries none (e.g. from a Kubernetes Secret via GATE_REDIS_PASSWORD)."""

    @field_validator("url")
    @classmethod
    def _scheme(cls, url: SecretStr) -> SecretStr:
        text = url.get_secret_value()
        if not text.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        from redis.connection import parse_url

        try:
            parse_url(text)
        except ValueError as exc:
            raise ValueError(f"not a valid Redis URL: {exc}") from None
        return url


class HttpSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    api_token: SecretStr | None = None
    """When set, every endpoint but /healthz and /readyz requires ``Authorization: Bearer``."""
    cors_origins: list[str] = Field(default_factory=list)
    max_wait_s: float = Field(default=300.0, gt=0, le=3600)
    """Upper bound of a long-poll's ``wait`` parameter."""
    max_batch: int = Field(default=10_000, ge=1)
    """Most records a batch readiness request may ask about."""
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Larger request bodies are refused with 413."""
    rate_limit_per_s: float | None = Field(default=5_000.0, gt=0)
    """Requests per second per client address (null: no limit); beyond it, 429."""
    rate_limit_burst: float | None = Field(default=None, gt=0)
    """Requests a client may send at once (default: two seconds' worth)."""


class StatusSettings(_Strict):
    stall_after_ms: int = Field(default=60_000, ge=1)
    lag_window_ms: int = Field(default=30_000, ge=1)
    lag_threshold_ms: int = Field(default=10_000, ge=0)
    behind_after_ms: int = Field(default=60_000, ge=1)
    """A group whose oldest unprocessed record is older than this is BEHIND (never OK),
    whether its lag grows or not."""
    rewind_window_ms: int = Field(default=300_000, ge=0)
    rewind_policy: Literal["follow", "keep_highest"] = "follow"
    history_step_ms: int = Field(default=5_000, ge=100)
    """One point of the status page's charts per step (15 minutes are kept)."""
    metrics_group_partitions_max: int = Field(default=1_000, ge=0)
    """The series per partition (a gate's watermark, end offset and waiting time; each
    dependency group's committed offset, lag, lag in seconds, commit age and status) are
    exposed for at most this many partition rows over the whole service, a gate's partitions
    counting one row each for the gate and one for each of its groups: each gate, in the
    configuration's order, has them while its partitions x (groups + 1) fit in what is left;
    beyond, its own series and its groups' over all partitions alone (1,000 groups on 64
    partitions would be 320,000 series, 28 MB a scrape; at the default a scrape stays near
    1 MB however many gates)."""

    def policy(self) -> StatusPolicy:
        return StatusPolicy(
            stall_after=self.stall_after_ms / 1000,
            lag_window=self.lag_window_ms / 1000,
            lag_threshold=self.lag_threshold_ms / 1000,
            behind_after=self.behind_after_ms / 1000,
            rewind_window=self.rewind_window_ms / 1000,
            rewind_policy=self.rewind_policy,
        )


class GateConfig(_Strict):
    """The whole configuration file."""

    kafka: dict[str, KafkaValue]
    """librdkafka properties passed to the admin client as they are (SASL/SSL included)."""
    poll_interval_ms: int = Field(default=1000, ge=10, le=600_000)
    idle_poll_interval_ms: int = Field(default=0, ge=0, le=600_000)
    """0: every poll reads every group. Otherwise a group whose last read found it at the end
    of every partition it is read on is not read again for up to this long while it stays
    there (no record arrives past it; each group is read again at a random point of the
    interval's second half, so reads spread over polls); its last read counts meanwhile.
    Records that arrive, or an end offset that goes down, wake it in the same poll, so no
    watermark rises on an old read; a rewind or lost offsets of an idle group are seen up to
    this late."""
    poller_niceness: int = Field(default=10, ge=0, le=19)
    """How much lower the CPU priority of the admin client's process (it polls and evaluates
    the gates) is than that of the process serving HTTP (a Unix niceness increment; 0: the
    same). When CPU is short, requests are served first and poll cycles take longer (counted
    as overruns); with CPU to spare it changes nothing."""
    metadata_interval_ms: int = Field(default=10_000, ge=10)
    """How often partition counts are refreshed (added partitions are picked up then)."""
    request_timeout_ms: int = Field(default=5_000, ge=100)
    heartbeat_ms: int = Field(default=5_000, ge=100)
    """Unchanged snapshots are still published this often, so clients can measure age."""
    readiness_max_age_ms: int | None = Field(default=None, ge=100)
    """/readyz fails when the cluster has not answered a poll for longer (default: max(10
    polls, 10 s)); a gate's verdict turns unknown when its snapshot is older."""
    gates: dict[GateName, GateSpec] = Field(min_length=1)
    redis: RedisSettings | None = None
    http: HttpSettings = Field(default_factory=HttpSettings)
    status: StatusSettings = Field(default_factory=StatusSettings)

    @field_validator("kafka")
    @classmethod
    def _kafka(cls, props: dict[str, KafkaValue]) -> dict[str, KafkaValue]:
        for key in props:
            if not _KAFKA_PROPERTY.match(key):
                raise ValueError(f"{key!r} is not a librdkafka property name")
        if not str(props.get("bootstrap.servers", "")).strip():
            raise ValueError("must set 'bootstrap.servers'")
        return props

    @model_validator(mode="after")
    def _readiness(self) -> GateConfig:
        if self.readiness_max_age_ms is None:
            object.__setattr__(
                self, "readiness_max_age_ms", max(10 * self.poll_interval_ms, 10_000)
            )
        return self

    @property
    def groups(self) -> list[str]:
        """Every dependency group of every gate, each once, in configuration order."""
        return list(dict.fromkeys(g for spec in self.gates.values() for g in spec.depends_on))

    @property
    def topics(self) -> list[str]:
        return list(dict.fromkeys(t for spec in self.gates.values() for t in spec.topics))

    def kafka_properties(self) -> dict[str, str]:
        return {key: _kafka_value(value) for key, value in self.kafka.items()}

    def redacted(self) -> dict[str, Any]:
        """The configuration as a dict with secrets masked (safe to log or show)."""
        data = self.model_dump(mode="json")
        data["kafka"] = {
            k: ("**********" if is_secret_property(k) else v) for k, v in self.kafka.items()
        }
        return data


def is_secret_property(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in ("password", "secret", "jaas", "token", ".key.pem"))


def _kafka_value(value: KafkaValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Environment variables that override the file (or stand in for it).
ENV_OVERRIDES: Mapping[str, tuple[str, ...]] = {
    "GATE_BOOTSTRAP_SERVERS": ("kafka", "bootstrap.servers"),
    "GATE_POLL_INTERVAL_MS": ("poll_interval_ms",),
    "GATE_IDLE_POLL_INTERVAL_MS": ("idle_poll_interval_ms",),
    "GATE_POLLER_NICENESS": ("poller_niceness",),
    "GATE_REDIS_URL": ("redis", "url"),
    "GATE_REDIS_PREFIX": ("redis", "prefix"),
    "GATE_REDIS_PASSWORD": ("redis", "password"),
    "GATE_HTTP_HOST": ("http", "host"),
    "GATE_HTTP_PORT": ("http", "port"),
    "GATE_API_TOKEN": ("http", "api_token"),
}
KAFKA_ENV_PREFIX = "GATE_KAFKA_"
"""``GATE_KAFKA_SASL_PASSWORD=...`` sets the librdkafka property ``sasl.password``."""


def apply_env(
    data: dict[str, Any], env: Mapping[str, str], origins: dict[tuple[str, ...], str] | None = None
) -> dict[str, Any]:
    """``data`` with the environment's overrides; ``origins`` collects which setting came from
    which variable (so an error names the variable)."""
    merged: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    origins = {} if origins is None else origins
    for var, path in ENV_OVERRIDES.items():
        if var in env:
            section: dict[str, Any] = merged
            for key in path[:-1]:
                if not isinstance(section.get(key), dict):
                    section[key] = {}
                section = section[key]
            section[path[-1]] = env[var]
            origins[path] = var
    for var, value in env.items():
        if var.startswith(KAFKA_ENV_PREFIX) and len(var) > len(KAFKA_ENV_PREFIX):
            prop = var[len(KAFKA_ENV_PREFIX) :].lower().replace("_", ".")
            if not isinstance(merged.get("kafka"), dict):
                merged["kafka"] = {}
            merged["kafka"][prop] = value
            origins[("kafka", prop)] = var
    return merged


def parse_config(
    data: Any, *, source: str = "config", env: Mapping[str, str] | None = None
) -> GateConfig:
    """Validate an already-parsed document (plus environment overrides)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: must be a mapping of settings, not {type(data).__name__}"])
    origins: dict[tuple[str, ...], str] = {}
    data = apply_env(data, os.environ if env is None else env, origins)
    try:
        return GateConfig.model_validate(data)
    except ValidationError as exc:
        lines = describe_errors(exc, origins)
        raise ConfigError([f"{source}: {line}" for line in lines]) from None


def load_config(path: str | Path, *, env: Mapping[str, str] | None = None) -> GateConfig:
    """Read, merge with the environment and validate a configuration file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read ({exc})"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line
        raise ConfigError([f"{path}: {where}invalid YAML ({problem})"]) from None
    return parse_config(data, source=str(path), env=env)


def _known_settings(section: tuple[str, ...]) -> list[str]:
    """The setting names allowed in a section of the file (for "did you mean")."""
    model: type[BaseModel] = GateConfig
    path = list(section)
    if path[:1] == ["gates"] and len(path) == 2:
        return list(GateSpec.model_fields)
    for key in path:
        field = model.model_fields.get(key)
        annotation = getattr(field, "annotation", None)
        nested = [a for a in (annotation, *getattr(annotation, "__args__", ())) if a]
        found = next((a for a in nested if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if found is None:
            return []
        model = found
    return list(model.model_fields)


_MESSAGES = {
    "missing": "is required",
    "extra_forbidden": "is not a known setting",
}


def describe_errors(
    exc: ValidationError, origins: Mapping[tuple[str, ...], str] | None = None
) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = tuple(str(part) for part in error["loc"])
        where = ".".join(loc) or "(top level)"
        for path, var in (origins or {}).items():
            if loc[: len(path)] == path:
                where += f" (from the environment variable {var})"
                break
        kind = error["type"]
        message = _MESSAGES.get(kind)
        if kind == "extra_forbidden":
            close = difflib.get_close_matches(loc[-1], _known_settings(loc[:-1]), n=1)
            if close:
                message += f" (did you mean {'.'.join((*loc[:-1], close[0]))!r}?)"
        if message is None:
            message = error["msg"]
            if kind == "string_pattern_mismatch":
                message = "may only contain letters, digits, '.', '_' and '-'"
            elif kind == "too_short" and error["loc"][-1] == "depends_on":
                message = "must list at least one consumer group"
            elif kind == "too_short" and error["loc"][-1] == "gates":
                message = "must define at least one gate"
            elif kind == "too_short" and error["loc"][-1] == "topics":
                message = "must list at least one topic"
            message = message.removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return lines
