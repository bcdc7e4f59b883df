"""The Helm chart, rendered by Helm's own engine (helm-python-sdk), validated against the
Kubernetes schemas, and its configuration wired into a real gate."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gate import parse_config
from tests.support import Kafka, serve_gate, unique, wait_until

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kafka-gate"
FULL = yaml.safe_load((CHART / "ci" / "full-values.yaml").read_text())
# The chart has no gate by default: the documented example values name one.
EXAMPLE = yaml.safe_load((CHART / "examples" / "values-example.yaml").read_text())
INLINE_SECRETS = {
    **EXAMPLE,
    "apiToken": {"value": "api-t0ken-inline"},
    "redis": {"enabled": True, "url": "redis://redis:6379/0", "password": "redis-pass-inline"},
}
KUBERNETES = "1.30"


def render_files(values: dict[str, Any]) -> dict[str, str]:
    """Rendered templates by path, NOTES.txt included."""
    chart = helm.Chart.load(str(CHART))
    return chart.render(values, name="rel", namespace="apps")


def render(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Rendered manifests by ``Kind/name``."""
    manifests: dict[str, dict[str, Any]] = {}
    for path, text in render_files(values).items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                manifests[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return manifests


def one(manifests: dict[str, dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [m for key, m in manifests.items() if key.startswith(f"{kind}/")]
    assert len(found) == 1, f"expected one {kind}, got {sorted(manifests)}"
    return found[0]


def gate_container(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    containers = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "gate")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def rendered_config(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(one(manifests, "ConfigMap")["data"]["config.yaml"])


VARIANTS = {"example": EXAMPLE, "full": FULL, "inline-secrets": INLINE_SECRETS}


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_chart_lints_clean(values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_manifest_validates_against_the_kubernetes_schemas(values: dict[str, Any]) -> None:
    manifests = render(values)
    assert manifests
    for key, manifest in manifests.items():
        if manifest["kind"] == "ServiceMonitor":  # a CRD: not in the Kubernetes schemas
            assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
            assert {e["port"] for e in manifest["spec"]["endpoints"]} == {"http"}
            continue
        try:
            kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{key}: {exc.message}")


def test_default_values_render_what_a_cluster_needs() -> None:
    kinds = sorted(key.split("/")[0] for key in render(EXAMPLE))
    # The Pod is the `helm test` hook; opt-in resources are absent by default.
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Pod",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]


def test_every_option_renders_its_resource() -> None:
    kinds = {key.split("/")[0] for key in render(FULL)}
    assert kinds >= {
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
        "NetworkPolicy",
        "Pod",
    }
    assert "Secret" not in kinds, "existing secrets are referenced, never copied"


@pytest.mark.parametrize("values", [EXAMPLE, FULL], ids=["example", "full"])
def test_the_pods_run_locked_down(values: dict[str, Any]) -> None:
    manifests = render(values)
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for container in [*pod["containers"], *one(manifests, "Pod")["spec"]["containers"]]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context.get("privileged", False) is False
        assert "limits" in container["resources"]


def test_probes_use_the_health_endpoints() -> None:
    container = gate_container(render(EXAMPLE))
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]


def test_the_helm_test_hook_calls_readyz_on_the_service() -> None:
    manifests = render(FULL)
    hook = one(manifests, "Pod")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = " ".join(hook["spec"]["containers"][0]["command"])
    service = one(manifests, "Service")
    assert f"http://{service['metadata']['name']}:9090/readyz" in script
    assert service["spec"]["ports"][0]["port"] == 9090


@pytest.mark.parametrize("values", [EXAMPLE, FULL], ids=["example", "full"])
def test_the_config_map_is_a_valid_gate_configuration(values: dict[str, Any]) -> None:
    manifests = render(values)
    data = rendered_config(manifests)
    # The secrets the Deployment injects, as the container would see them.
    env = {name: "from-secret" for name, v in env_of(gate_container(manifests)).items() if v}
    config = parse_config(data, source="configmap", env=env)
    gates = values["gates"]
    assert set(config.gates) == set(gates)
    for name, gate in gates.items():
        assert config.gates[name].topics == gate["topics"]
    assert config.http.host == "0.0.0.0"
    assert config.http.port == (values.get("service", {}).get("port") or 8080)
    if values is FULL:
        assert config.gates["service-a"].depends_on == ["service-b", "service-c"]
        assert config.poll_interval_ms == 200
        assert config.idle_poll_interval_ms == 10_000
        assert config.poller_niceness == 5
        assert config.status.rewind_policy == "keep_highest"
        assert config.status.metrics_group_partitions_max == 50_000
        assert config.kafka["security.protocol"] == "SASL_SSL"
        assert config.kafka["sasl.password"] == "from-secret"
        assert config.kafka["ssl.key.password"] == "from-secret"
        assert config.redis is not None and config.redis.prefix == "payments-gate"
        assert config.redis.password is not None
        assert config.http.api_token is not None
        assert config.http.cors_origins == ["https://ops.example.com"]
        assert config.http.max_body_bytes == 262144
        assert config.http.rate_limit_per_s == 2000


def test_secrets_are_referenced_never_written_into_the_config() -> None:
    manifests = render(FULL)
    env = env_of(gate_container(manifests))
    refs = {name: value["secretKeyRef"] for name, value in env.items() if isinstance(value, dict)}
    assert refs == {
        "GATE_API_TOKEN": {"name": "gate-api", "key": "token"},
        "GATE_REDIS_PASSWORD": {"name": "redis-credentials", "key": "password"},
        "GATE_KAFKA_SASL_PASSWORD": {"name": "kafka-credentials", "key": "password"},
        "GATE_KAFKA_SSL_KEY_PASSWORD": {"name": "kafka-credentials", "key": "key-password"},
    }
    assert "password" not in one(manifests, "ConfigMap")["data"]["config.yaml"]
    mounts = {m["name"]: m for m in gate_container(manifests)["volumeMounts"]}
    assert mounts["kafka-tls"]["readOnly"] is True
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"] == {
        "name": "gate-api",
        "key": "token",
    }


def test_inline_secrets_go_into_the_charts_own_secret() -> None:
    manifests = render(INLINE_SECRETS)
    secret = one(manifests, "Secret")
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {"api-token": "api-t0ken-inline", "redis-password": "redis-pass-inline"}
    env = env_of(gate_container(manifests))
    assert env["GATE_API_TOKEN"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert env["GATE_REDIS_PASSWORD"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    for kind in ("ConfigMap", "Deployment"):
        text = yaml.safe_dump(one(manifests, kind))
        assert "inline" not in text, f"a secret leaked into the {kind}"


def test_the_rate_limit_can_be_turned_off() -> None:
    data = rendered_config(render({**EXAMPLE, "http": {"rateLimitPerSecond": None}}))
    assert parse_config(data, env={}).http.rate_limit_per_s is None
    assert parse_config(rendered_config(render(EXAMPLE)), env={}).http.rate_limit_per_s == 5000


def test_a_config_change_rolls_the_pods() -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = one(render({**EXAMPLE, **values}), "Deployment")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"pollIntervalMs": 500})


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"replicaCount": "two"}, "at '/replicaCount': got string, want integer"),
        ({"replicaCount": 0}, "at '/replicaCount': minimum"),
        ({"pollIntervalMs": 1}, "at '/pollIntervalMs': minimum"),
        ({"gates": {"a": {"topics": ["t"]}}}, "at '/gates/a': missing property 'dependsOn'"),
        ({"gates": {"a": {"topics": [], "dependsOn": ["b"]}}}, "at '/gates/a/topics'"),
        ({"redis": {"url": "http://redis:6379"}}, "at '/redis/url'"),
        ({"logLevel": "loud"}, "at '/logLevel'"),
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        (
            {"kafka": {"secretProperties": {"sasl.password": {"secretName": "s"}}}},
            "missing property 'key'",
        ),
    ],
)
def test_invalid_values_are_rejected_naming_the_field(values: dict, fragment: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render({**EXAMPLE, **values})
    assert fragment in str(caught.value)


def test_a_missing_gate_list_names_the_value() -> None:
    with pytest.raises(helm.HelmError, match="gates"):
        render({"gates": None})


def test_without_gates_the_chart_says_what_to_set() -> None:
    with pytest.raises(helm.HelmError) as caught:
        render({})
    message = str(caught.value)
    assert "no gate is configured" in message
    assert "gates.<name>.topics" in message and "gates.<name>.dependsOn" in message
    assert "examples/values-example.yaml" in message


def test_the_chart_deploys_exactly_the_gates_the_user_sets() -> None:
    values = {"gates": {"ledger": {"topics": ["refunds"], "dependsOn": ["billing"]}}}
    files = render_files(values)
    config = parse_config(rendered_config(render(values)), env={})
    assert set(config.gates) == {"ledger"}
    assert config.gates["ledger"].topics == ["refunds"]
    assert config.gates["ledger"].depends_on == ["billing"]
    notes = next(text for path, text in files.items() if path.endswith("NOTES.txt"))
    assert "watching 1 gate(s)" in notes
    assert "service-a" not in notes


def test_the_rendered_configuration_runs_a_gate_on_the_real_broker(kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    b, c = unique("service-b"), unique("service-c")
    kafka.commit(b, topic, {0: 7, 1: 3})
    kafka.commit(c, topic, {0: 4, 1: 9})
    values = {
        "kafka": {"bootstrapServers": kafka.bootstrap},
        "gates": {"service-a": {"topics": [topic], "dependsOn": [b, c]}},
        "pollIntervalMs": 50,
        "apiToken": {"value": "chart-token"},
    }
    manifests = render(values)
    secret = one(manifests, "Secret")
    env = {
        name: base64.b64decode(secret["data"][ref["secretKeyRef"]["key"]]).decode()
        for name, ref in env_of(gate_container(manifests)).items()
    }
    config = parse_config(
        rendered_config(manifests),
        env={**env, "GATE_HTTP_HOST": "127.0.0.1", "GATE_HTTP_PORT": "0"},
    )
    with serve_gate(config) as gate:
        wait_until(lambda: httpx.get(f"{gate.url}/readyz").status_code == 200, what="readyz")
        assert httpx.get(f"{gate.url}/watermarks/service-a").status_code == 401
        body = wait_until(
            lambda: httpx.get(
                f"{gate.url}/watermarks/service-a",
                headers={"Authorization": "Bearer chart-token"},
            ).json(),
            what="watermarks",
        )
    assert body["topics"][topic] == {"0": 4, "1": 3}


def test_the_image_runs_the_gate_unprivileged_without_compilers() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) >= 2, "multi-stage build"
    final = stages[-1]
    assert re.match(r"python:\$\{PYTHON_VERSION\}-slim\s", final)
    user = re.search(r"^USER (\S+)", final, flags=re.M)
    assert user and user.group(1).split(":")[0] not in ("root", "0")
    assert not re.search(r"\b(gcc|g\+\+|build-essential|apt-get install)\b", final)
    assert 'ENTRYPOINT ["gate", "serve"]' in final
    assert "GATE_CONFIG=/etc/gate/config.yaml" in final
    deployment = one(render(EXAMPLE), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["--config", "/etc/gate/config.yaml"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/etc/gate" in mounts and "/tmp" in mounts
