"""The ``gate`` command as a user runs it: exit codes and one readable line per problem."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
from confluent_kafka.admin import AdminClient

from demo._local import free_port
from gate._check import _group_ids
from tests.support import Kafka, gate_config, interruptible, serve_gate, unique, wait_until

GATE = [sys.executable, "-m", "gate.cli"]


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GATE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def config_file(tmp_path: Path, bootstrap: str, gates: str, extra: str = "") -> Path:
    path = tmp_path / "gate.yaml"
    path.write_text(
        f'kafka:\n  bootstrap.servers: "{bootstrap}"\ngates:\n{textwrap.indent(gates, "  ")}{extra}'
    )
    return path


def assert_no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr + result.stdout


def test_invalid_config_exits_2_with_one_line_per_problem(tmp_path: Path) -> None:
    path = config_file(tmp_path, "x:1", "a:\n  topics: []\n  depends_on: []\n  nope: 1\n")
    result = run("check", "--config", str(path), "--offline")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3
    assert any(
        "gates.a.depends_on: must list at least one consumer group" in line for line in lines
    )
    assert any("gates.a.nope: is not a known setting" in line for line in lines)
    assert_no_traceback(result)


def test_missing_config_file(tmp_path: Path) -> None:
    result = run("serve", "--config", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2 and "no such file" in result.stderr
    assert_no_traceback(result)


def test_cycle_is_an_error(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        "x:1",
        "a:\n  topics: [t]\n  depends_on: [b]\nb:\n  topics: [t]\n  depends_on: [a]\n",
    )
    result = run("check", "--config", str(path), "--offline")
    assert result.returncode == 1
    assert "dependency cycle on topic 't': a -> b -> a" in result.stderr


def test_unreachable_kafka_is_one_line(tmp_path: Path) -> None:
    path = config_file(
        tmp_path, f"127.0.0.1:{free_port()}", "a:\n  topics: [t]\n  depends_on: [b]\n"
    )
    result = run("check", "--config", str(path), "--timeout", "1")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach bootstrap servers" in lines[0]
    assert_no_traceback(result)


def test_check_against_the_live_cluster(tmp_path: Path, kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    committed, silent = unique("CG"), unique("CG")
    kafka.commit(committed, topic, {0: 1, 1: 1})
    gates = f"a:\n  topics: [{topic}]\n  depends_on: [{committed}]\n"
    assert (
        run("check", "--config", str(config_file(tmp_path, kafka.bootstrap, gates))).returncode == 0
    )

    gates = f"a:\n  topics: [{topic}, {unique('absent')}]\n  depends_on: [{committed}, {silent}]\n"
    result = run("check", "--config", str(config_file(tmp_path, kafka.bootstrap, gates)))
    assert result.returncode == 1
    assert "does not exist" in result.stderr
    assert f"group '{silent}' has not committed" in result.stdout

    gates = f"a:\n  topics: [{topic}]\n  depends_on: [{silent}]\n"
    path = config_file(tmp_path, kafka.bootstrap, gates)
    assert run("check", "--config", str(path)).returncode == 0  # a warning only
    assert run("check", "--config", str(path), "--strict").returncode == 1


def test_serve_answers_and_stops_on_sigterm(tmp_path: Path, kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    group = unique("CG")
    kafka.commit(group, topic, {0: 4})
    port = free_port()
    path = config_file(
        tmp_path,
        kafka.bootstrap,
        f"a:\n  topics: [{topic}]\n  depends_on: [{group}]\n",
        f"poll_interval_ms: 50\nhttp:\n  port: {port}\n",
    )
    process = subprocess.Popen(
        [*GATE, "serve", "--config", str(path)], stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def answered() -> dict | None:
            try:
                response = httpx.get(f"{url}/watermarks/a", timeout=1)
            except httpx.HTTPError:
                return None
            return response.json() if response.status_code == 200 else None

        body = wait_until(answered, timeout=30, what="gate serve")
        assert body["topics"][topic] == {"0": 4}
        second = run("serve", "--config", str(path))  # same port: busy
        assert second.returncode == 1 and "cannot listen on 127.0.0.1" in second.stderr
        assert_no_traceback(second)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0  # a graceful stop

    assert stderr.rstrip().endswith("gate: stopped")
    assert "Traceback" not in stderr


def test_serve_with_a_bad_kafka_property_is_one_line(tmp_path: Path) -> None:
    path = config_file(
        tmp_path, "127.0.0.1:1", "a:\n  topics: [t]\n  depends_on: [b]\n", "http:\n  port: 0\n"
    )
    path.write_text(path.read_text().replace("kafka:\n", "kafka:\n  no.such.property: 1\n"))
    started = time.monotonic()
    result = run("serve", "--config", str(path))
    assert result.returncode == 1
    assert "kafka: " in result.stderr and "no.such.property" in result.stderr
    assert time.monotonic() - started < 30
    assert_no_traceback(result)


def test_demo_runs_the_whole_story_and_stops_by_itself() -> None:
    result = run("demo", "--duration", "12", "--no-live", "--port", "0", timeout=120)
    assert result.returncode == 0, result.stderr
    output = result.stdout
    assert "gate service-a on topic payments" in output
    lines = output.splitlines()
    header = next(line for line in lines if line.startswith("┃") and "watermark" in line)
    columns = [cell.strip() for cell in header.split("┃")[1:-1]]
    rows = [
        [cell.strip().replace(",", "") for cell in line.split("│")[1:-1]]
        for line in lines
        if line.startswith("│") and line.split("│")[1].strip().isdigit()
    ]
    assert len(rows) == 3
    for row in rows:
        cells = dict(zip(columns, row, strict=True))
        watermark = int(cells["watermark"])
        assert watermark > 0, row
        # service-a, on the SDK behind the gate, never passes the watermark it was given
        # (it may lag behind it by a poll) and has processed something.
        assert cells["service-a"].isdigit() and 0 < int(cells["service-a"]) <= watermark, row
    assert "service-a processed" in output
    assert_no_traceback(result)


def test_status_explains_who_holds_which_partition(kafka: Kafka) -> None:
    topic = kafka.create_topic(3)
    kafka.produce(topic, {0: 40, 1: 40, 2: 40})
    b, c = unique("service-b"), unique("service-c")
    kafka.commit(b, topic, {0: 40, 1: 40, 2: 12})
    kafka.commit(c, topic, {0: 40, 1: 25, 2: 30})
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b, c]}},
        http={"host": "127.0.0.1", "port": 0, "api_token": "cli-token"},
    )
    with serve_gate(config) as gate:
        wait_until(
            lambda: (
                httpx.get(
                    f"{gate.url}/status/service-a", headers={"Authorization": "Bearer cli-token"}
                ).status_code
                == 200
            )
        )
        result = run("status", "--url", gate.url, env={"GATE_API_TOKEN": "cli-token"})
        refused = run("status", "--url", gate.url, env={"GATE_API_TOKEN": ""})
        unknown = run("status", "--url", gate.url, "--gate", "nope", "--token", "cli-token")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "service-a: flowing: 43 records in transit" in out
    assert "3 partitions · 2 held back" in out
    lines = {line.split("│")[2].strip(): line for line in out.splitlines() if topic in line}
    assert set(lines) == {"0", "1", "2"}
    # Partition 2: watermark 12 held by B; partition 1: 25 held by C; 0: released.
    assert lines["2"].split("│")[4].strip() == "12" and lines["2"].rstrip(" │").endswith(b)
    assert lines["1"].split("│")[4].strip() == "25" and lines["1"].rstrip(" │").endswith(c)
    assert not lines["0"].rstrip(" │").endswith((b, c))
    assert out.index(f"│ {topic} │         2") < out.index(f"│ {topic} │         1")  # most first
    assert refused.returncode == 1
    assert (
        refused.stderr.strip() == "gate: the gate requires an API token (--token or GATE_API_TOKEN)"
    )
    assert unknown.returncode == 1 and "no gate named 'nope' (gates: service-a)" in unknown.stderr
    for each in (result, refused, unknown):
        assert_no_traceback(each)


def test_status_of_a_fleet_asks_for_the_holding_groups_and_names_them(kafka: Kafka) -> None:
    """More than 12 groups: no column per group (the terminal would be 13 columns wider), the
    detail asked for the groups holding each partition back alone."""
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 10, 1: 10})
    groups = [unique(f"fleet{i:02}") for i in range(13)]
    for group in groups[1:]:
        kafka.commit(group, topic, {0: 10, 1: 10})
    kafka.commit(groups[0], topic, {0: 10, 1: 4})
    config = gate_config(kafka.bootstrap, {"fleet": {"topics": [topic], "depends_on": groups}})
    with serve_gate(config) as gate:
        wait_until(lambda: httpx.get(f"{gate.url}/status/fleet").status_code == 200)
        result = run("status", "--url", gate.url)
    assert result.returncode == 0, result.stderr
    assert_no_traceback(result)
    rows = {
        line.split("│")[2].strip(): line for line in result.stdout.splitlines() if topic in line
    }
    assert set(rows) == {"0", "1"}
    assert rows["1"].rstrip(" │").endswith(groups[0])
    assert len(rows["1"].split("│")) == len(rows["0"].split("│")) == 9  # 7 columns, no group's
    header = next(line for line in result.stdout.splitlines() if "watermark" in line)
    assert not any(group in header for group in groups)
    assert f"{groups[5]}" in result.stdout  # the groups table lists every group


def test_status_shows_a_missing_topic_and_a_group_far_behind(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 30})
    b, c = unique("service-b"), unique("service-c")
    kafka.commit(b, topic, {0: 30})
    kafka.commit(c, topic, {0: 12})  # far behind, and its lag does not grow
    missing = unique("no-such-topic")
    config = gate_config(
        kafka.bootstrap,
        {
            "lost": {"topics": [missing], "depends_on": [b]},
            "behind": {"topics": [topic], "depends_on": [b, c]},
        },
        poll_interval_ms=100,
        status={"stall_after_ms": 600_000, "behind_after_ms": 1000},
    )
    with serve_gate(config) as gate:

        def c_is_behind() -> bool:
            body = httpx.get(f"{gate.url}/status/behind").json()
            return body.get("groups", {}).get(c, {}).get("status") == "BEHIND"

        wait_until(c_is_behind, timeout=15, what="service-c BEHIND")
        lost = run("status", "--url", gate.url, "--gate", "lost")
        behind = run("status", "--url", gate.url, "--gate", "behind")
    assert lost.returncode == 0, lost.stderr
    assert f"lost: missing: topic {missing} does not exist on the cluster" in lost.stdout
    assert "every record is released" not in lost.stdout
    assert behind.returncode == 0, behind.stderr
    assert "behind: flowing: 18 records in transit" in behind.stdout
    assert f"held back by {c}" in behind.stdout
    row = next(line for line in behind.stdout.splitlines() if line.startswith(f"│ {c}"))
    assert row.split("│")[2].strip() == "BEHIND", row
    for each in (lost, behind):
        assert_no_traceback(each)


def test_serve_logs_a_missing_topic_once_and_once_when_it_appears(
    tmp_path: Path, kafka: Kafka
) -> None:
    topic = unique("later")
    group = unique("CG")
    path = config_file(
        tmp_path,
        kafka.bootstrap,
        f"a:\n  topics: [{topic}]\n  depends_on: [{group}]\n",
        f"poll_interval_ms: 50\nmetadata_interval_ms: 100\nhttp:\n  port: {free_port()}\n",
    )
    process = subprocess.Popen(
        [*GATE, "serve", "--config", str(path)], stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr or []), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("not exist" in line for line in lines), timeout=30)
        time.sleep(2)  # some 40 polls more, the topic still missing
        kafka.create_topic(1, name=topic)
        wait_until(lambda: any("exist(s) now" in line for line in lines), timeout=30)
        time.sleep(1)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        reader.join(10)
    missing = [line for line in lines if "not exist" in line]
    assert len(missing) == 1, lines
    assert f"gate a: {topic} does not exist on the cluster" in missing[0]
    assert "WARNING" in missing[0]
    assert len([line for line in lines if "exist(s) now" in line]) == 1, lines


def test_status_of_an_unreachable_gate_is_one_line() -> None:
    result = run("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert result.stderr.startswith("gate: cannot reach the gate at http://127.0.0.1:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert_no_traceback(result)


def test_status_of_a_gate_answering_another_shape_is_one_line() -> None:
    """A gate of another version: what it answers lacks fields this status view reads."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class OlderGate(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            gates = {"a": {"version": 1, "groups": {}}}
            body = {"ready": True, "gates": gates} if self.path == "/status" else {"gate": "a"}
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), OlderGate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = run("status", "--url", f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert result.returncode == 1
    assert "answered in a shape this gate status does not know" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert_no_traceback(result)


def test_check_names_a_kafka_security_value_librdkafka_refuses(tmp_path: Path) -> None:
    path = config_file(tmp_path, "127.0.0.1:1", "a:\n  topics: [t]\n  depends_on: [b]\n")
    path.write_text(
        path.read_text().replace(
            "kafka:\n", "kafka:\n  security.protocol: SASL_WHAT\n  sasl.password: hunter2\n"
        )
    )
    result = run("check", "--config", str(path))
    assert result.returncode == 1
    assert 'Invalid value "SASL_WHAT" for configuration property "security.protocol"' in (
        result.stderr
    )
    assert "hunter2" not in result.stderr + result.stdout
    assert_no_traceback(result)


def test_status_watch_follows_the_gate_until_interrupted(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 20})
    group = unique("dep")
    kafka.commit(group, topic, {0: 5})
    config = gate_config(kafka.bootstrap, {"w": {"topics": [topic], "depends_on": [group]}})
    with serve_gate(config) as gate:
        wait_until(lambda: httpx.get(f"{gate.url}/status/w").status_code == 200)
        process = subprocess.Popen(
            [*GATE, "status", "--url", gate.url, "--watch", "--interval", "0.3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=interruptible,
        )
        time.sleep(2.0)
        kafka.commit(group, topic, {0: 20})  # the dependency catches up while watched
        time.sleep(2.0)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    # Not a terminal: the last frame is printed. It was drawn after the commit, so the view
    # refreshed (the first one, drawn before it, said the partition was held back).
    assert "w: every record is released" in out
    assert "waits on" not in out.split("w: every record is released")[-1]
    assert "Traceback" not in out + err


# ---- conventions ----------------------------------------------------------------------------


def test_version_help_completion_and_usage_errors() -> None:
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("gate ")
    for args in (["-h"], ["status", "-h"], ["serve", "--help"]):
        shown = run(*args)
        assert shown.returncode == 0 and "Usage:" in shown.stdout, args
    assert "--install-completion" in run("-h").stdout
    for args in (["status", "--bogus"], ["nosuchcommand"], ["status", "--limit", "zero"]):
        wrong = run(*args)
        assert wrong.returncode == 2, (args, wrong.stderr)
        assert_no_traceback(wrong)


def test_a_setting_from_the_environment_is_named_and_typos_get_a_suggestion(
    tmp_path: Path,
) -> None:
    path = config_file(
        tmp_path, "x:1", "a:\n  topics: [t]\n  depend_on: [b]\n", "poll_intervall_ms: 100\n"
    )
    result = run("check", "--config", str(path), "--offline", env={"GATE_HTTP_PORT": "eighty"})
    assert result.returncode == 2
    err = result.stderr
    assert "gates.a.depend_on: is not a known setting (did you mean 'gates.a.depends_on'?)" in err
    assert "poll_intervall_ms: is not a known setting (did you mean 'poll_interval_ms'?)" in err
    assert "http.port (from the environment variable GATE_HTTP_PORT)" in err
    assert_no_traceback(result)


def test_check_suggests_close_topics_and_groups_and_probes_redis(
    kafka: Kafka, tmp_path: Path
) -> None:
    topic = kafka.create_topic(1, name=unique("payments"))
    group = unique("service-b")
    kafka.commit(group, topic, {0: 1})
    # A consumer group the broker lists (a member that joined and committed).
    from confluent_kafka import Consumer

    member = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": group, "session.timeout.ms": 6000}
    )
    member.subscribe([topic])
    deadline = time.monotonic() + 30
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(0.2)
    try:
        path = config_file(
            tmp_path,
            kafka.bootstrap,
            f"a:\n  topics: [{topic}x]\n  depends_on: [{group}]\n"
            f"b:\n  topics: [{topic}]\n  depends_on: [{group}-x]\n",
            f"redis:\n  url: redis://127.0.0.1:{free_port()}/0\n",
        )
        result = run("check", "--config", str(path), "--timeout", "3")
        listed = group in _group_ids(AdminClient({"bootstrap.servers": kafka.bootstrap}), 5)
    finally:
        member.close()
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert f"topic '{topic}x' does not exist; did you mean '{topic}'?" in out
    assert "error: redis.url: cannot reach Redis at redis://127.0.0.1:" in out
    # A group is suggested exactly when the broker lists it among its consumer groups.
    assert (f"did you mean '{group}'?" in out) is listed
    assert_no_traceback(result)


def test_serve_with_kafka_unreachable_says_so_in_a_few_lines(tmp_path: Path) -> None:
    port = free_port()
    path = config_file(
        tmp_path,
        f"127.0.0.1:{free_port()}",
        "a:\n  topics: [t]\n  depends_on: [b]\n",
        f"http:\n  host: 127.0.0.1\n  port: {port}\npoll_interval_ms: 100\n",
    )
    process = subprocess.Popen(
        [*GATE, "serve", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(12)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    unreachable = [line for line in lines if "unreachable" in line]
    assert unreachable and len(unreachable) <= 4, lines
    assert len(lines) <= 25, "\n".join(lines)
    assert "Traceback" not in stderr


def test_sigterm_stops_the_demo_gracefully() -> None:
    process = subprocess.Popen(
        [*GATE, "demo", "--no-live", "--port", "0", "--kafka-port", "0", "--redis-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(10)
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "export KAFKA_BOOTSTRAP=" in stdout and "service-a processed" in stdout
    assert "Traceback" not in stderr


def test_the_demo_cannot_reach_the_given_broker_in_one_line() -> None:
    result = run("demo", "--bootstrap", f"127.0.0.1:{free_port()}", "--no-redis", "--no-live")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("gate: cannot reach the broker at")
    assert_no_traceback(result)
