"""Secrets stay secret: not in logs (at debug level), error bodies, /status or /metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from demo._local import LocalRedis, LocalServiceError, free_port
from tests.support import Kafka, unique, wait_until

SECRETS = {
    "kafka": "kafka-pa55word-x1",
    "redis": "redis-pa55word-x2",
    "token": "api-t0ken-x3",
}


def test_no_secret_reaches_logs_errors_or_metrics(kafka: Kafka, tmp_path: Path) -> None:
    redis = LocalRedis(password=SECRETS["redis"])
    try:
        redis.start()
    except LocalServiceError as exc:
        pytest.skip(f"needs a local redis-server process: {exc}")
    topic = kafka.create_topic(1)
    group = unique("dep")
    kafka.commit(group, topic, {0: 4})
    port = free_port()
    config = tmp_path / "gate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {
                    "bootstrap.servers": kafka.bootstrap,
                    "sasl.username": "gate",
                    "sasl.password": SECRETS["kafka"],
                },
                "poll_interval_ms": 100,
                "gates": {"a": {"topics": [topic], "depends_on": [group]}},
                "redis": {"url": redis.url},  # the password is in the URL
                "http": {"host": "127.0.0.1", "port": port, "api_token": SECRETS["token"]},
            }
        )
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gate.cli",
            "serve",
            "--config",
            str(config),
            "--log-level",
            "debug",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )
    base = f"http://127.0.0.1:{port}"
    good = {"Authorization": f"Bearer {SECRETS['token']}"}
    seen: list[str] = []
    try:
        wait_until(lambda: _get(f"{base}/readyz") == 200, timeout=30, what="readyz")
        for path in ("/status", "/status/a", "/metrics", "/watermarks/a", "/ready?gate=a"):
            for headers in (good, {"Authorization": "Bearer wrong"}, {}):
                response = httpx.get(base + path, headers=headers)
                assert response.status_code < 500
                seen.append(response.text + str(response.headers))
        seen.append(httpx.post(f"{base}/ready", headers=good, content=b"{not json").text)
        redis.kill()  # errors about Redis must not print its URL with the password
        wait_until(
            lambda: "gate_redis_healthy 0.0" in httpx.get(f"{base}/metrics", headers=good).text,
            timeout=20,
        )
        seen.append(httpx.get(f"{base}/status", headers=good).text)
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
        redis.close()
    logs = output.decode(errors="replace")
    assert "DEBUG" in logs or "INFO" in logs, "expected a verbose log to inspect"
    for name, secret in SECRETS.items():
        assert secret not in logs, f"the {name} secret is in the log"
        for text in seen:
            assert secret not in text, f"the {name} secret is in a response"


def _get(url: str) -> int:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return 0
