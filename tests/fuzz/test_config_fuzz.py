"""Hypothesis-generated configurations through ``gate check --offline``: every valid one is
accepted, and every broken one exits 2 with one readable line naming the broken field."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gate.cli import app

NAME = st.from_regex(r"[a-z][a-z0-9._-]{0,20}", fullmatch=True)
runner = CliRunner()


@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    gates = draw(st.dictionaries(NAME, st.just(None), min_size=1, max_size=4))
    config: dict[str, Any] = {
        "kafka": {"bootstrap.servers": draw(st.sampled_from(["kafka:9092", "a:1,b:2"]))},
        "poll_interval_ms": draw(st.integers(10, 600_000)),
        "gates": {
            # Dependencies are named apart from the gates, so no cycle can form.
            name: {
                "topics": draw(st.lists(NAME, min_size=1, max_size=3, unique=True)),
                "depends_on": draw(
                    st.lists(NAME.map(lambda n: f"dep-{n}"), min_size=1, max_size=3, unique=True)
                ),
            }
            for name in gates
        },
    }
    if draw(st.booleans()):
        config["redis"] = {"url": "redis://redis:6379/0", "prefix": draw(NAME)}
    if draw(st.booleans()):
        config["http"] = {"host": "0.0.0.0", "port": draw(st.integers(0, 65535))}
    if draw(st.booleans()):
        config["status"] = {"rewind_policy": draw(st.sampled_from(["follow", "keep_highest"]))}
    return config


def _gate(config: dict[str, Any]) -> str:
    return next(iter(config["gates"]))


# (setting to overwrite, bad values, the field the message must name); ``gate.X`` is setting
# X of one gate, whose message names ``gates.<gate>.<field>``.
BREAKAGES: list[tuple[str, Any, Any]] = [
    ("poll_interval_ms", st.sampled_from(["fast", -1, 0, 5, 10**9, None]), "poll_interval_ms"),
    ("metadata_interval_ms", st.sampled_from(["x", 0, -5]), "metadata_interval_ms"),
    (
        "idle_poll_interval_ms",
        st.sampled_from(["often", -1, 10**9, None]),
        "idle_poll_interval_ms",
    ),
    ("poller_niceness", st.sampled_from(["low", -1, 20, None]), "poller_niceness"),
    ("gates", st.sampled_from([{}, [], "service-a", None]), "gates"),
    ("kafka", st.sampled_from([{}, {"bootstrap.servers": ""}, "kafka:9092", None]), "kafka"),
    ("redis", st.sampled_from([{"url": "http://redis"}, {"url": 5}, {}]), "redis"),
    ("http", st.sampled_from([{"port": 70000}, {"port": "eighty"}, {"port": -1}]), "http.port"),
    ("status", st.sampled_from([{"rewind_policy": "sometimes"}]), "status.rewind_policy"),
    ("gate.topics", st.sampled_from([[], ["bad topic!"], "payments", [""], None]), "topics"),
    ("gate.depends_on", st.sampled_from([[], [""], ["a", "a"], None, "b"]), "depends_on"),
    ("gate.extra", st.sampled_from([1, "x"]), "extra"),
    ("unknown", st.sampled_from([1, "x", {}]), "unknown"),
]


def _break(config: dict[str, Any], where: str, value: Any, field: str) -> str:
    """Overwrite one field; returns the dotted name the error must start with."""
    if where.startswith("gate."):
        gate = _gate(config)
        config["gates"][gate][where[5:]] = value
        return f"gates.{gate}.{field}"
    config[where] = value
    return field


def check(config: dict[str, Any] | str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gate.yaml"
        path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
        result = runner.invoke(app, ["check", "--offline", "--config", str(path)])
    return result.exit_code, result.output


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(valid_configs())
def test_valid_configurations_pass(config: dict[str, Any]) -> None:
    code, output = check(config)
    assert code == 0, output
    assert output.startswith("ok: ")


@FUZZ
@given(valid_configs(), st.data())
def test_each_broken_field_is_named_in_one_line(
    config: dict[str, Any], data: st.DataObject
) -> None:
    where, values, field = data.draw(st.sampled_from(BREAKAGES))
    expected = _break(config, where, data.draw(values), field)
    code, output = check(config)
    assert code == 2, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, "no message"
    assert all(line.startswith("gate: ") for line in lines), output
    assert "Traceback" not in output
    assert any(f": {expected}" in line for line in lines), f"{expected} not named in: {output}"


@FUZZ
@given(st.text(max_size=200))
def test_any_text_is_a_config_or_one_readable_error(text: str) -> None:
    code, output = check(text)
    assert code in (0, 2), output
    assert "Traceback" not in output
    if code == 2:
        assert all(line.startswith("gate: ") for line in output.splitlines() if line.strip())
