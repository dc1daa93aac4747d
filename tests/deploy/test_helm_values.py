"""deploy/helm/values-{celery,kubernetes}.yaml for the official Apache Airflow chart: S3 task
logs, the run store on S3, secrets from Kubernetes Secrets only, an external PostgreSQL.

The chart itself is not in this repository. The checks against it (its values.schema.json,
and `helm template`) run when a chart folder is found: $ONNXCAST_AIRFLOW_CHART, else
shared/deploy/airflow-chart beside or inside the repository (tests/deploy/README.md); they
skip, saying so, otherwise. The other checks always run.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HELM = REPO / "deploy" / "helm"
VALUES = {"CeleryExecutor": HELM / "values-celery.yaml", "KubernetesExecutor": HELM / "values-kubernetes.yaml"}
CHART_VERSION = "1.22.0"  # the chart version the values were written and checked against
SECRET_NAMES = {  # values key -> the Kubernetes Secret it names (made before the install)
    ("data", "metadataSecretName"): "onnxcast-airflow-metadata",
    ("fernetKeySecretName",): "onnxcast-airflow-fernet-key",
    ("apiSecretKeySecretName",): "onnxcast-airflow-api-secret-key",
    ("jwtSecretName",): "onnxcast-airflow-jwt-secret",
}
CELERY_SECRET_NAMES = {
    ("data", "resultBackendSecretName"): "onnxcast-airflow-result-backend",
    ("data", "brokerUrlSecretName"): "onnxcast-airflow-broker-url",
    ("redis", "passwordSecretName"): "onnxcast-airflow-redis-password",
}


def chart_dir() -> Path | None:
    candidates = [os.environ.get("ONNXCAST_AIRFLOW_CHART"), REPO / "shared" / "deploy" / "airflow-chart",
                  REPO.parent / "shared" / "deploy" / "airflow-chart"]
    return next((Path(c) for c in candidates if c and (Path(c) / "values.schema.json").is_file()), None)


NO_CHART = ("the Apache Airflow chart is not here: set ONNXCAST_AIRFLOW_CHART to an unpacked chart "
            f"{CHART_VERSION} (tests/deploy/README.md)")


class UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        duplicates = sorted({str(k) for k in keys if keys.count(k) > 1})
        if duplicates:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {duplicates}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load(executor: str) -> dict:
    return yaml.load(VALUES[executor].read_text(), Loader=UniqueKeyLoader)


def get(values: dict, path: tuple[str, ...]):
    for key in path:
        values = values.get(key, {}) if isinstance(values, dict) else {}
    return values


def env_of(values: dict) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in values.get("env", [])}


@pytest.fixture(params=sorted(VALUES))
def executor(request) -> str:
    return request.param


def test_executor_image_and_version(executor):
    values = load(executor)
    assert values["executor"] == executor
    assert values["airflowVersion"] == "3.3.2"
    image = values["images"]["airflow"]
    assert image["repository"] == values["defaultAirflowRepository"] == "onnxcast-airflow"
    assert image["tag"] == values["defaultAirflowTag"] and image["tag"] != "latest"


def test_task_logs_go_to_s3(executor):
    logging = load(executor)["config"]["logging"]
    assert logging["remote_logging"] == "True"
    assert re.fullmatch(r"s3://[a-z0-9.-]+/\S+", logging["remote_base_log_folder"])
    assert logging["remote_log_conn_id"] == "aws_logs"


def test_the_run_store_and_rollout_store_are_on_s3(executor):
    env = env_of(load(executor))
    assert env["ONNXCAST_MODE"] == "deployed"
    assert env["ONNXCAST_RUN_ROOT"].startswith("s3://") and env["ONNXCAST_STORE_URI"].startswith("s3://")
    # the image's AIRFLOW_CONFIG names its embedded airflow.cfg; the chart's must win
    assert env["AIRFLOW_CONFIG"] == "/opt/airflow/airflow.cfg"


def test_every_secret_comes_from_a_kubernetes_secret(executor):
    values = load(executor)
    wanted = {**SECRET_NAMES, **(CELERY_SECRET_NAMES if executor == "CeleryExecutor" else {})}
    for path, name in wanted.items():
        assert get(values, path) == name, f"{'.'.join(path)}"
    for inline in ("fernetKey", "apiSecretKey", "jwtSecret"):
        assert values.get(inline) is None, f"{inline} given inline"
    assert not values.get("extraSecrets"), "secrets are made outside the chart"
    signing = {s["envName"]: s for s in values["secret"]}["ONNXCAST_SIGNING_KEY"]
    assert signing["secretName"] == "onnxcast-release"
    mounted = {v["name"]: v["secret"]["secretName"] for v in values["volumes"] if "secret" in v}
    assert mounted == {"airflow-connections": "onnxcast-airflow-connections"}
    kwargs = json.loads(values["config"]["secrets"]["backend_kwargs"])
    mount = {m["name"]: m["mountPath"] for m in values["volumeMounts"]}["airflow-connections"]
    assert kwargs["connections_file_path"].startswith(mount + "/")
    assert values["config"]["secrets"]["backend"] == "airflow.secrets.local_filesystem.LocalFilesystemBackend"


def test_external_postgresql_and_no_default_password(executor):
    values = load(executor)
    assert values["postgresql"]["enabled"] is False
    assert "metadataConnection" not in values.get("data", {})
    text = VALUES[executor].read_text()
    offenders = [line for line in text.splitlines()
                 if re.search(r"(?i)^\s*[\w-]*(pass|password|secret|token|key)\s*:\s*\S", line)
                 and not re.search(r"(?i)(SecretName|secretKey|secretName|_key_id|Key(Secret)?Name)\s*:", line)]
    assert offenders == []
    assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", text), "a URL with credentials"


def test_users_and_roles_without_the_fab_create_user_job(executor):
    values = load(executor)
    core = values["config"]["core"]
    assert core["auth_manager"].endswith("SimpleAuthManager")
    assert core["simple_auth_manager_users"] == "admin:admin,engineer:user,viewer:viewer"
    assert core["simple_auth_manager_all_admins"] == "False"
    assert values["createUserJob"]["enabled"] is False
    init = {c["name"]: c for c in values["apiServer"]["extraInitContainers"]}["airflow-users"]
    assert init["command"][0] == "airflow-users"
    out = init["command"][init["command"].index("--out") + 1]
    assert out == core["simple_auth_manager_passwords_file"]
    volumes = {v["name"]: v for v in values["apiServer"]["extraVolumes"]}
    assert volumes["airflow-users"]["secret"]["secretName"] == "onnxcast-airflow-users"
    assert "emptyDir" in volumes["airflow-auth"]


def test_workers_share_no_volume(executor):
    values = load(executor)
    if executor == "CeleryExecutor":
        assert values["workers"]["celery"]["replicas"] >= 2
        assert values["workers"]["celery"]["persistence"]["enabled"] is False
        assert values["redis"]["enabled"] is True
    else:
        assert values["redis"]["enabled"] is False
    assert not values.get("dags", {}).get("persistence", {}).get("enabled")
    assert not values.get("logs", {}).get("persistence", {}).get("enabled")


# --- against the chart (skipped without it) ----------------------------------------------------

@pytest.fixture(scope="module")
def chart() -> Path:
    folder = chart_dir()
    if folder is None:
        pytest.skip(NO_CHART)
    meta = yaml.safe_load((folder / "Chart.yaml").read_text())
    assert meta["name"] == "airflow", f"{folder} is not the Apache Airflow chart"
    return folder


def test_values_are_valid_against_the_chart_schema(chart, executor):
    import jsonschema

    schema = json.loads((chart / "values.schema.json").read_text())
    values = load(executor)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(values)]
    assert errors == []
    # The schema lets unknown top-level keys through (a typo there would be ignored silently).
    unknown = sorted(set(values) - set(schema["properties"]))
    assert unknown == [], f"keys the chart does not know: {unknown}"


def test_the_schema_check_rejects_a_wrong_value(chart):
    import jsonschema

    schema = json.loads((chart / "values.schema.json").read_text())
    values = load("CeleryExecutor")
    values["workers"]["celery"]["replicas"] = "two"
    values["postgresql"]["enabled"] = "no"
    assert len(list(jsonschema.Draft7Validator(schema).iter_errors(values))) >= 2


def load_render():
    spec = importlib.util.spec_from_file_location("render", HELM / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def manifests(chart) -> dict[str, list[dict]]:
    render = load_render()
    if render.helm_binary() is None:
        pytest.skip("no helm binary: set ONNXCAST_HELM or run deploy/helm/install-helm.sh")
    return {executor: [d for d in yaml.safe_load_all(render.render(chart, [path])) if d]
            for executor, path in VALUES.items()}


def pod_specs(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects
            if o["kind"] in ("Deployment", "StatefulSet", "Job")}


def test_helm_renders_the_values(manifests, executor):
    objects = manifests[executor]
    config = next(o for o in objects if o["kind"] == "ConfigMap" and "airflow.cfg" in o.get("data", {}))
    cfg = config["data"]["airflow.cfg"]
    assert f"executor = {executor}" in cfg
    assert "remote_base_log_folder = s3://onnxcast-logs/airflow" in cfg
    assert "remote_log_conn_id = aws_logs" in cfg
    specs = pod_specs(objects)
    for name, spec in specs.items():
        for container in spec["containers"]:
            if container["image"].startswith("onnxcast-airflow:") and not container["name"].endswith("log-groomer"):
                env = {e["name"]: e for e in container.get("env", [])}
                assert env["ONNXCAST_RUN_ROOT"]["value"].startswith("s3://"), name
                assert env["ONNXCAST_SIGNING_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "onnxcast-release"
    api = specs["onnxcast-api-server"]
    assert [c["name"] for c in api["initContainers"]][-1] == "airflow-users"
    if executor == "KubernetesExecutor":
        template = yaml.safe_load(config["data"]["pod_template_file.yaml"])
        volumes = {v["name"] for v in template["spec"]["volumes"]}
        assert "airflow-connections" in volumes
        env = {e["name"] for e in template["spec"]["containers"][0]["env"]}
        assert {"ONNXCAST_RUN_ROOT", "ONNXCAST_STORE_URI", "AIRFLOW_CONFIG"} <= env
    else:
        worker = specs["onnxcast-worker"]
        assert not any("persistentVolumeClaim" in v for v in worker.get("volumes", []))
        workload = next(o for o in objects if o["metadata"]["name"] == "onnxcast-worker"
                        and o["kind"] in ("Deployment", "StatefulSet"))
        assert workload["kind"] == "Deployment" and workload["spec"]["replicas"] == 2


def test_the_chart_generates_no_secret(manifests, executor):
    secrets = [o for o in manifests[executor] if o["kind"] == "Secret"]
    if executor == "KubernetesExecutor":
        # The chart always renders a broker-URL Secret unless data.brokerUrlSecretName is set; with
        # the KubernetesExecutor nothing reads it and it holds no credential.
        assert [s["metadata"]["name"] for s in secrets] == ["onnxcast-broker-url"]
        assert base64.b64decode(secrets[0]["data"]["connection"]).decode() == "%!s(<nil>)"
    else:
        assert secrets == []
