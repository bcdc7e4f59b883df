"""Configuration: the documented shape, environment overrides, and readable errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate import ConfigError, load_config, parse_config

EXAMPLE = """
kafka:
  bootstrap.servers: "127.0.0.1:9092"   # any librdkafka property passes through
  security.protocol: SASL_SSL
  sasl.mechanism: PLAIN
  sasl.username: svc
  sasl.password: hunter2
poll_interval_ms: 200
gates:
  service-a:
    topics: [payments]
    depends_on: [service-b, service-c]
redis:
  url: redis://127.0.0.1:6379/0
http:
  host: 127.0.0.1
  port: 8080
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    return path


def test_the_documented_example_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, EXAMPLE), env={})
    assert config.poll_interval_ms == 200
    assert config.gates["service-a"].depends_on == ["service-b", "service-c"]
    assert config.kafka_properties()["sasl.password"] == "hunter2"
    assert config.redis is not None and config.redis.url.get_secret_value().startswith("redis://")
    assert config.http.port == 8080
    assert config.readiness_max_age_ms == 10_000
    assert "hunter2" not in str(config.redacted())
    assert "hunter2" not in repr(config.redis)


def test_environment_overrides(tmp_path: Path) -> None:
    env = {
        "GATE_BOOTSTRAP_SERVERS": "kafka-1:9093",
        "GATE_POLL_INTERVAL_MS": "500",
        "GATE_REDIS_URL": "rediss://:secret@redis:6380/1",
        "GATE_HTTP_PORT": "9000",
        "GATE_KAFKA_SASL_PASSWORD": "from-env",
        "GATE_API_TOKEN": "t0ken",
    }
    config = load_config(write(tmp_path, EXAMPLE), env=env)
    assert config.kafka["bootstrap.servers"] == "kafka-1:9093"
    assert config.kafka["sasl.password"] == "from-env"
    assert config.poll_interval_ms == 500
    assert config.http.port == 9000
    assert config.http.api_token is not None and config.http.api_token.get_secret_value() == "t0ken"
    assert config.redis is not None and config.redis.url.get_secret_value().startswith("rediss://")


def test_the_redis_password_comes_from_the_environment_and_stays_secret(tmp_path: Path) -> None:
    env = {"GATE_REDIS_URL": "redis://redis:6379/0", "GATE_REDIS_PASSWORD": "hunter2-redis"}
    config = load_config(write(tmp_path, EXAMPLE), env=env)
    assert config.redis is not None and config.redis.password is not None
    assert config.redis.password.get_secret_value() == "hunter2-redis"
    assert "hunter2-redis" not in repr(config.redacted()) + repr(config)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("gates: {}\n", ["kafka: is required", "gates: must define at least one gate"]),
        (
            "kafka: {bootstrap.servers: x}\ngates: {a: {topics: [t], depends_on: []}}\n",
            ["gates.a.depends_on: must list at least one consumer group"],
        ),
        (
            "kafka: {bootstrap.servers: x}\ngates: {a: {topics: [t], depends_on: [b], wat: 1}}\n",
            ["gates.a.wat: is not a known setting"],
        ),
        (
            "kafka: {bootstrap.servers: x}\npoll_interval_ms: fast\ngates: {a: {topics: [t], depends_on: [b]}}\n",
            ["poll_interval_ms: Input should be a valid integer"],
        ),
        (
            "kafka: {bootstrap.servers: x}\ngates: {a: {topics: ['bad topic'], depends_on: [b]}}\n",
            ["gates.a.topics.0: may only contain letters, digits"],
        ),
        (
            "kafka: {}\ngates: {a: {topics: [t], depends_on: [b]}}\n",
            ["kafka: must set 'bootstrap.servers'"],
        ),
        (
            "kafka: {bootstrap.servers: x, Bad Prop: 1}\ngates: {a: {topics: [t], depends_on: [b]}}\n",
            ["kafka: 'Bad Prop' is not a librdkafka property name"],
        ),
        (
            "kafka: {bootstrap.servers: x}\nredis: {url: http://x}\ngates: {a: {topics: [t], depends_on: [b]}}\n",
            ["redis.url: must start with redis://"],
        ),
        (
            "kafka: {bootstrap.servers: x}\ngates: {a: {topics: [t, t], depends_on: [b]}}\n",
            ["gates.a.topics: lists t more than once"],
        ),
        ("kafka: [\n", ["invalid YAML"]),
        ("- just\n- a list\n", ["must be a mapping of settings"]),
    ],
)
def test_invalid_configs_give_one_line_per_problem(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), env={})
    lines = caught.value.problems
    assert len(lines) == len(expected), lines
    for line, fragment in zip(lines, expected, strict=True):
        assert fragment in line
        assert line.startswith(str(tmp_path))
        assert "\n" not in line


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml", env={})


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)
documents = st.recursive(
    scalars,
    lambda children: st.dictionaries(
        st.sampled_from(
            [
                "kafka",
                "gates",
                "topics",
                "depends_on",
                "redis",
                "http",
                "port",
                "url",
                "a",
                "poll_interval_ms",
            ]
        ),
        children,
        max_size=4,
    ),
    max_leaves=12,
)


@settings(max_examples=200)
@given(documents)
def test_any_document_is_either_valid_or_a_config_error(document) -> None:
    try:
        config = parse_config(document, env={})
    except ConfigError as exc:
        assert exc.problems and all(line.strip() and "\n" not in line for line in exc.problems)
    else:
        assert config.gates
