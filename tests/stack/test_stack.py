"""The multi-host stack as a user and an operator meet it, over HTTP: who may log in and do
what in Airflow, MLflow and S3, that both Celery worker hosts are up, and that they share no
disk. The stack comes from `make stack`'s own code path (tests/stack/conftest.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
import requests
from mlflow_http import move_champion, register_version
from stack_support import AirflowApi, live, mlflow_auth, s3_client

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import stack_processes  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


class TestAirflowApiServer:
    def test_health_reports_every_component_healthy(self, stack):
        response = requests.get(f"{stack['api_url']}/api/v2/monitor/health", timeout=10)
        assert response.status_code == 200
        health = response.json()
        for component in ("metadatabase", "scheduler", "triggerer", "dag_processor"):
            assert health[component]["status"] == "healthy", health

    def test_generated_password_gets_a_token_and_a_wrong_one_401(self, stack):
        url = f"{stack['api_url']}/auth/token"
        good = requests.post(url, json={"username": stack["username"], "password": stack["password"]}, timeout=30)
        assert good.status_code == 201 and good.json()["access_token"]
        bad = requests.post(url, json={"username": stack["username"], "password": stack["password"] + "x"},
                            timeout=30)
        assert bad.status_code == 401
        assert requests.get(f"{stack['api_url']}/api/v2/dags", timeout=10).status_code == 401

    def test_viewer_reads_dags_but_cannot_trigger_a_run(self, stack):
        viewer = AirflowApi(stack, "viewer")
        assert viewer.get(f"/api/v2/dags/{stack['training_dag']}").status_code == 200
        response = viewer.post(f"/api/v2/dags/{stack['training_dag']}/dagRuns",
                               json={"logical_date": None, "conf": {}})
        assert response.status_code == 403, response.text

    def test_training_dag_is_unpaused(self, stack, admin_api):
        assert admin_api.get(f"/api/v2/dags/{stack['training_dag']}").json()["is_paused"] is False

    def test_unpausing_started_no_scheduled_run(self, stack):
        assert stack["scheduled_runs_after_up"] == []


class TestMlflowServer:
    def test_anonymous_request_gets_401(self, stack):
        response = requests.get(f"{stack['mlflow_url']}/api/2.0/mlflow/experiments/search",
                                params={"max_results": 1}, timeout=30)
        assert response.status_code == 401

    def test_pipeline_and_release_move_the_champion_and_the_reader_only_reads_it(self, stack):
        """Grants on every registered model (stack_services.MODEL_GRANTS): the pipeline moves
        `champion` of what it registered, and so does a person releasing by hand (promotion or
        rollback); the reader reads the alias and can neither move nor delete it."""
        base = f"{stack['mlflow_url']}/api/2.0/mlflow"
        pipeline, release, reader = (mlflow_auth(stack, u) for u in ("pipeline", "release", "reader"))
        name, version = register_version(base, pipeline, "stack-test")
        for user, expected in ((reader, 403), (release, 200), (pipeline, 200)):
            assert move_champion(base, user, name, version) == expected, user[0]
        read = requests.get(f"{base}/registered-models/alias", params={"name": name, "alias": "champion"},
                            auth=reader, timeout=30)
        assert read.status_code == 200 and read.json()["model_version"]["version"] == version
        gone = requests.delete(f"{base}/registered-models/alias", params={"name": name, "alias": "champion"},
                               auth=reader, timeout=30)
        assert gone.status_code == 403


class TestS3:
    def test_anonymous_requests_are_denied(self, stack):
        from botocore.exceptions import ClientError

        anonymous = s3_client(stack, None)
        for call in (lambda: anonymous.list_objects_v2(Bucket=stack["buckets"]["runs"]),
                     lambda: anonymous.put_object(Bucket=stack["buckets"]["runs"], Key="anon", Body=b"x")):
            with pytest.raises(ClientError) as error:
                call()
            assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

    def test_pipeline_writes_its_buckets_encrypted(self, stack):
        pipeline = s3_client(stack, "pipeline")
        for bucket in stack["s3_identity_buckets"]["pipeline"]:
            key = f"stack-test/{uuid.uuid4().hex}"
            pipeline.put_object(Bucket=bucket, Key=key, Body=b"ok", ServerSideEncryption="AES256")
            head = pipeline.head_object(Bucket=bucket, Key=key)
            assert head.get("ServerSideEncryption") == "AES256"
            assert pipeline.get_object(Bucket=bucket, Key=key)["Body"].read() == b"ok"

    def test_each_identity_is_kept_out_of_the_other_buckets(self, stack):
        from botocore.exceptions import ClientError

        stack["s3_keys"]["admin"]  # the admin identity exists, and is the only one that may create buckets
        mlflow_bucket = stack["buckets"]["mlflow"]
        s3_client(stack, "mlflow").put_object(Bucket=mlflow_bucket, Key="stack-test/secret", Body=b"artifact")
        pipeline = s3_client(stack, "pipeline")
        for call in (lambda: pipeline.get_object(Bucket=mlflow_bucket, Key="stack-test/secret"),
                     lambda: pipeline.list_objects_v2(Bucket=mlflow_bucket),
                     lambda: pipeline.put_object(Bucket=mlflow_bucket, Key="stack-test/x", Body=b"x"),
                     lambda: pipeline.create_bucket(Bucket="stack-test-not-allowed")):
            with pytest.raises(ClientError) as error:
                call()
            assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        with pytest.raises(ClientError):
            s3_client(stack, "mlflow").list_objects_v2(Bucket=stack["buckets"]["rollout"])


class TestWorkerHosts:
    def test_both_celery_workers_answer_a_ping(self, stack):
        from celery import Celery

        app = Celery(broker=stack["broker_url"])
        try:
            replies = {name for reply in app.control.ping(timeout=5) for name in reply}
        finally:
            app.close()
        assert replies >= {f"celery@{w['hostname']}" for w in stack["workers"]}

    def test_each_worker_has_its_own_hostname(self, stack):
        for worker in live(stack)["workers"]:
            assert _in_worker(worker, "hostname").stdout.strip() == worker["hostname"]

    def test_a_file_of_worker_a_is_invisible_to_worker_b(self, stack):
        a, b = live(stack)["workers"]
        probe = Path(a["onnxcast_home"]) / f"probe-{uuid.uuid4().hex}"
        probe.write_text("only on host a")
        try:
            assert _in_worker(a, "cat", str(probe)).stdout == "only on host a"
            seen_by_b = _in_worker(b, "cat", str(probe))
            assert seen_by_b.returncode != 0 and "No such file" in seen_by_b.stderr
            assert _in_worker(b, "ls", "-A", str(Path(a["onnxcast_home"]).parent)).stdout.strip() == ""
            assert _in_worker(b, "sh", "-c", f"echo x > {probe.parent}/from-b").returncode != 0
        finally:
            probe.unlink()


class TestSecrets:
    def test_stack_json_and_secret_files_are_private(self, stack):
        root = Path(stack["stack_dir"])
        assert (root / "stack.json").stat().st_mode & 0o777 == 0o600
        assert (root / "secrets").stat().st_mode & 0o777 == 0o700
        for path in (root / "secrets").iterdir():
            assert path.stat().st_mode & 0o777 == 0o600, path
        assert Path(stack["onnxcast_settings"]["ONNXCAST_SIGNING_KEY"]).stat().st_mode & 0o777 == 0o600

    def test_no_secret_on_a_command_line_or_in_a_log(self, stack):
        values = _secret_values(stack)
        command_lines = []
        for pid in _stack_process_ids(stack):
            try:
                command_lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
        assert command_lines
        logs = [p.read_text(errors="replace") for p in Path(stack["logs"]).glob("*.log")]
        for value in values:
            assert not any(value in line for line in command_lines), "a secret is on a command line"
            assert not any(value in log for log in logs), "a secret is in a log"

    def test_every_listening_port_is_on_loopback(self, stack):
        pids = _stack_process_ids(stack)
        listeners = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
        ours = [line for line in listeners.splitlines() if any(f"pid={p}," in line for p in pids)]
        assert ours
        for line in ours:
            local = line.split()[3]
            assert local.startswith("127.0.0.1:"), line


def _in_worker(worker: dict, *command: str) -> subprocess.CompletedProcess:
    """Run ``command`` inside the namespaces of a worker host (its mounts, hostname, processes)."""
    init = _namespace_init(worker["pid"])
    return subprocess.run(["nsenter", "--target", str(init), "--mount", "--uts", "--pid", "--", *command],
                          capture_output=True, text=True, timeout=30)


def _namespace_init(unshare_pid: int) -> int:
    children = stack_processes.children(unshare_pid)
    assert len(children) == 1, children
    return children[0]


def _stack_process_ids(stack: dict) -> set[int]:
    """Every process under the stack's services (their namespaces' processes included)."""
    found = set()
    for root in {p["pid"] for p in live(stack)["processes"].values()}:
        try:
            found |= {root, *(p.pid for p in psutil.Process(root).children(recursive=True))}
        except psutil.NoSuchProcess:
            continue
    return found


def _secret_values(stack: dict) -> list[str]:
    secrets_dir = Path(stack["stack_dir"]) / "secrets"
    names = re.compile(r"(password|secret|secret-key|kek|fernet-key)$")
    return [p.read_text().strip() for p in secrets_dir.iterdir() if names.search(p.name)]
