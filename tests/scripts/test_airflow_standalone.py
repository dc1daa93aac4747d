"""scripts/airflow_standalone.py (what `make airflow` runs), on a port other than 8080, used
over the real REST API the way the UI uses it: tasks reach the execution API on that port, no
log server listens beyond loopback, the trigger form's enums are multi-selects, and a rejected
trigger does not leave a run started with the default params."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
DAG = "onnxcast_training"


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    # the script configures Airflow itself: nothing of this test session's Airflow may leak in
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ONNXCAST", "MLFLOW_TRACKING"))}
    return {**env, "ONNXCAST_HOME": str(home), **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_execution_api_url_follows_the_api_port(tmp_path):
    code = ("import sys; sys.path.insert(0, 'scripts'); import airflow_env; airflow_env.configure(); "
            "import airflow_standalone; print(airflow_standalone.execution_api_url())")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=clean_env(tmp_path, AIRFLOW__API__PORT="8471"), check=True)
    assert out.stdout.strip().splitlines()[-1] == "http://127.0.0.1:8471/execution/"
    # a URL the user set is theirs
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=clean_env(tmp_path, AIRFLOW__API__PORT="8471",
                                       AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://api:9/execution/"),
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "None"


class Api:
    def __init__(self, base: str, token: str | None = None) -> None:
        self.base, self.token = base, token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, (json.loads(raw) if raw.strip().startswith((b"{", b"[")) else {"text": raw})
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, {"text": raw.decode(errors="replace")}

    def text(self, path: str) -> str:
        request = urllib.request.Request(self.base + path, headers={"Authorization": f"Bearer {self.token}",
                                                                      "Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode(errors="replace")


def wait_for(what: str, check, timeout: float, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (OSError, KeyError, ValueError):
            value = None
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:g} s\n" + log.read_text(errors="replace")[-4000:])


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    home = tmp_path_factory.mktemp("onnxcast-home")
    port = free_port()
    log = home / "standalone.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, str(REPO / "scripts" / "airflow_standalone.py")], cwd=REPO,
                                   env=clean_env(home, AIRFLOW__API__PORT=str(port)), stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        api = Api(f"http://127.0.0.1:{port}")
        wait_for("API server", lambda: api.call("GET", "/api/v2/version")[0] == 200, 420, log)
        passwords = home / "airflow" / "simple_auth_manager_passwords.json.generated"
        password = wait_for("admin password", lambda: json.loads(passwords.read_text())["admin"], 60, log)
        status, body = api.call("POST", "/auth/token", {"username": "admin", "password": password})
        assert status in (200, 201), body
        api.token = body["access_token"]
        wait_for(f"{DAG} parsed", lambda: api.call("GET", f"/api/v2/dags/{DAG}")[0] == 200, 240, log)
        yield api, process, log
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def listening_sockets(root_pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN that a process of the tree holds."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, grew = {root_pid}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    inodes = set()
    for pid in tree:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)
                # /proc prints each 32-bit word in host (little-endian) order
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                family = socket.AF_INET if width == 8 else socket.AF_INET6
                found.append((socket.inet_ntop(family, words), int(port, 16)))
    return found



@pytest.mark.slow
class TestStandaloneOnAnotherPort:
    def test_the_trigger_form_shows_families_and_channels_as_multi_selects(self, standalone):
        """Airflow 3.3.2's form renders an array param as a multi-select when its schema has
        `examples` (FieldSelector: type array and examples or enum), labels from values_display."""
        api, _, _ = standalone
        status, details = api.call("GET", f"/api/v2/dags/{DAG}/details")
        assert status == 200, details
        for name in ("families", "channels"):
            schema = details["params"][name]["schema"]
            assert schema["type"] == "array"
            assert schema["examples"] == schema["items"]["enum"], name
            assert set(schema["values_display"]) == set(schema["examples"]), name

    def test_a_rejected_trigger_leaves_no_run_and_the_dag_paused(self, standalone):
        api, _, log = standalone
        assert api.call("GET", f"/api/v2/dags/{DAG}")[1]["is_paused"] is True
        status, body = api.call("POST", f"/api/v2/dags/{DAG}/dagRuns",
                                {"logical_date": None, "conf": {"families": ["lstmm"]}})
        assert status == 400, body
        assert api.call("GET", f"/api/v2/dags/{DAG}")[1]["is_paused"] is True
        # The form's submit as the UI sends it: PATCH is_paused=false (its "unpause on trigger"
        # box, on by default), then the trigger, which the API rejects.
        status, _ = api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})
        assert status == 200
        try:
            status, body = api.call("POST", f"/api/v2/dags/{DAG}/dagRuns",
                                    {"logical_date": None, "conf": {"horizon": 0}})
            assert status == 400, body
            dag = api.call("GET", f"/api/v2/dags/{DAG}")[1]
            assert datetime.fromisoformat(dag["next_dagrun_run_after"]) > datetime.now(UTC), dag
            time.sleep(20)  # many scheduler loops (each ~1 s): a due scheduled run would exist by now
            runs = api.call("GET", f"/api/v2/dags/{DAG}/dagRuns")[1]
            assert runs["total_entries"] == 0, [(r["run_id"], r["run_type"]) for r in runs["dag_runs"]]
        finally:
            api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": True})

    def test_tasks_reach_the_execution_api_on_that_port(self, standalone, tmp_path):
        """With AIRFLOW__API__PORT alone, every task called localhost:8080 (httpx.ConnectError, its
        log only "Pre Execute"). A run on a file that does not exist: check_data must run and
        fail with onnxcast's own message."""
        api, _, log = standalone
        missing = tmp_path / "no-such-data.csv"
        status, run = api.call("POST", f"/api/v2/dags/{DAG}/dagRuns",
                               {"logical_date": None, "conf": {"data_uri": str(missing), "families": ["dlinear"]}})
        assert status == 200, run
        ti_path = f"/api/v2/dags/{DAG}/dagRuns/{run['dag_run_id']}/taskInstances/check_data"
        api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})
        try:
            wait_for("check_data's first try", lambda: api.call("GET", ti_path)[1].get("state")
                     in ("up_for_retry", "failed", "success"), 300, log)
        finally:
            api.call("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": True})
        text = api.text(f"{ti_path}/logs/1?full_content=true")
        assert "ConnectError" not in text, text[-3000:]
        assert "no-such-data.csv" in text, text[-3000:]

    def test_no_log_server_listens_beyond_loopback(self, standalone):
        _, process, _ = standalone
        sockets = listening_sockets(process.pid)
        assert sockets, "the API server should listen"
        wide = [(a, p) for a, p in sockets if not (a.startswith("127.") or a == "::1")]
        assert wide == [], f"listening on every interface: {wide}"
