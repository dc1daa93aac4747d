"""Fault drills on the two-worker stack, all in ONE onnxcast_training run, each fault hitting a
different task so that the one retry every task has (retries=1; the test stack's retry delay is
30 s, tests/stack/conftest.py) suffices:

1. a worker host dies (its whole PID namespace, SIGKILL) while it runs ``train_or_fetch``; the
   scheduler fails that try after ``[scheduler] task_instance_heartbeat_timeout`` (75 s on a
   stack, 40 s on the test stack) and the retry runs on a worker (the restarted one or the other);
2. S3 (SeaweedFS) stops as soon as a step after training (``export``/``optimize``/``validate``)
   is seen running, so that its run-store publish (or staging) fails; S3 comes back, the retry
   completes;
3. the MLflow server stops once every ``validate`` is done, before ``register`` talks to it:
   ``register`` fails within a bounded time, naming the MLflow server; MLflow comes back, the
   retry registers.

Afterwards: the run succeeded, exactly one model version carries its run key, no MLflow run of
the run key is left RUNNING, and every commit marker in the run store matches the bytes it lists.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from stack_support import AirflowApi, live, mlflow_auth, s3_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack.py"
RUN_TIMEOUT = 2700
MODEL = f"stack-drills-{uuid.uuid4().hex[:6]}"
WORKER_DRILL_TIMEOUT = 900  # the first train_or_fetch try starts (the DAG run is queued behind nothing)
FAIL_TIMEOUT = 300  # a try hit by a fault is failed (heartbeat timeout 40 s + detection + callbacks)


def _label(ti: dict) -> str:
    return ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]"


def _seconds(start: str | None, end: str | None) -> float | None:
    from datetime import datetime

    if not start or not end:
        return None
    return round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 1)


class Drills:
    """The run under drill: REST polling, the stack's service commands, a log of what happened."""

    def __init__(self, stack: dict) -> None:
        self.stack = stack
        self.api = AirflowApi(stack, "admin")
        self.dag = stack["training_dag"]
        self.run_id = ""
        self.events: list[str] = []
        self.t0 = time.monotonic()

    def say(self, message: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {message}"
        self.events.append(line)
        print(line, flush=True)

    def instances(self) -> list[dict]:
        response = self.api.get(f"/api/v2/dags/{self.dag}/dagRuns/{self.run_id}/taskInstances",
                                params={"limit": 100})
        response.raise_for_status()
        return response.json()["task_instances"]

    def run_state(self) -> str:
        return self.api.get(f"/api/v2/dags/{self.dag}/dagRuns/{self.run_id}").json()["state"]

    def wait_for(self, what: str, probe, timeout: float, interval: float = 2.0):
        """Poll ``probe(instances)`` until it returns something truthy; fail on timeout or a
        finished run."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = probe(self.instances())
            except requests.RequestException as exc:  # the API server is busy on 2 cores
                self.say(f"(poll failed: {exc})")
                found = None
            if found:
                return found
            state = self.run_state()
            if state in ("success", "failed"):
                pytest.fail(f"run {self.run_id} {state} while waiting for {what}\n" + "\n".join(self.events))
            if time.monotonic() > deadline:
                pytest.fail(f"not within {timeout:.0f}s: {what}\n" + "\n".join(self.events))
            time.sleep(interval)

    def service(self, command: str, name: str, *extra: str) -> float:
        """``stack.py <command> <name>``; returns its seconds."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "ONNXCAST_", "MLFLOW_", "AWS_"))}
        env["ONNXCAST_HOME"] = self.stack["home"]
        started = time.monotonic()
        result = subprocess.run([sys.executable, str(STACK), command, name, *extra], env=env, capture_output=True,
                                text=True, timeout=400)
        seconds = round(time.monotonic() - started, 1)
        assert result.returncode == 0, f"stack.py {command} {name}:\n{result.stdout}\n{result.stderr[-3000:]}"
        self.say(f"stack.py {command} {name} {' '.join(extra)}: {result.stdout.strip()} ({seconds}s)")
        return seconds

    def tries(self, task_id: str, map_index: int) -> list[dict]:
        path = f"/api/v2/dags/{self.dag}/dagRuns/{self.run_id}/taskInstances/{task_id}"
        path += f"/{map_index}/tries" if map_index >= 0 else "/tries"
        response = self.api.get(path)
        response.raise_for_status()
        return sorted(response.json()["task_instances"], key=lambda t: t["try_number"])

    def log(self, task_id: str, map_index: int, try_number: int) -> str:
        response = self.api.get(f"/api/v2/dags/{self.dag}/dagRuns/{self.run_id}/taskInstances/{task_id}"
                                f"/logs/{try_number}", params={"map_index": map_index},
                                headers={"Accept": "application/json"})
        if not response.ok:
            return f"(no log: HTTP {response.status_code})"
        return json.dumps(response.json().get("content", []))

    def mlflow(self, method: str, path: str, **kwargs) -> dict:
        response = requests.request(method, f"{self.stack['mlflow_url']}/api/2.0/mlflow/{path}",
                                    auth=mlflow_auth(self.stack, "admin"), timeout=30, **kwargs)
        response.raise_for_status()
        return response.json()

    def mlflow_runs(self) -> list[dict]:
        """Every MLflow run (any experiment, also deleted ones) tagged with this run's key."""
        experiments = self.mlflow("POST", "experiments/search",
                                  json={"max_results": 1000, "view_type": "ALL"}).get("experiments", [])
        ids = [e["experiment_id"] for e in experiments]
        if not ids:
            return []
        runs, token = [], None
        while True:
            body = {"experiment_ids": ids, "filter": f"tags.`onnxcast.run_key` = '{self.run_key}'",
                    "run_view_type": "ALL", "max_results": 1000, **({"page_token": token} if token else {})}
            answer = self.mlflow("POST", "runs/search", json=body)
            runs += answer.get("runs", [])
            token = answer.get("next_page_token")
            if not token:
                return runs

    @property
    def run_key(self) -> str:
        return f"{self.dag}/{self.run_id}"


@pytest.fixture(scope="module")
def drilled_run(stack, tmp_path_factory) -> dict:
    from real_series import weekly_co2_csv

    drills = Drills(stack)
    csv = weekly_co2_csv(tmp_path_factory.mktemp("drill-data") / "co2_weekly.csv")
    key = f"co2/{MODEL}.csv"
    s3_client(stack, "pipeline").upload_file(csv, stack["buckets"]["data"], key)
    conf = {
        "data_uri": f"s3://{stack['buckets']['data']}/{key}",
        "families": ["nhits", "dlinear"],
        "horizon": 12,
        "lookback": 56,
        "max_epochs": 6,  # a training of some seconds: the worker dies while it trains
        "channels": ["edge", "cloud"],
        "model_name": MODEL,
        "extra_settings": {"hidden_size": 16, "num_layers": 1, "d_model": 16, "n_heads": 2,
                           "latency_repeats": 3, "patience": 6},
    }
    response = drills.api.post(f"/api/v2/dags/{drills.dag}/dagRuns", json={"logical_date": None, "conf": conf})
    assert response.status_code == 200, response.text
    drills.run_id = response.json()["dag_run_id"]
    drills.t0 = started = time.monotonic()
    drills.say(f"triggered {drills.run_key}")
    record: dict = {"drills": drills}

    # --- 1. a worker host dies while it trains ----------------------------------------------
    def training(tis):
        return next((t for t in tis if t["task_id"] == "train_or_fetch" and t["state"] == "running"
                     and t["hostname"]), None)

    victim = drills.wait_for("a running train_or_fetch", training, WORKER_DRILL_TIMEOUT, interval=1)
    deadline = time.monotonic() + 90  # kill once the try has its MLflow run, so that one is left RUNNING
    has_mlflow_run = False
    while time.monotonic() < deadline and not has_mlflow_run:
        has_mlflow_run = any(r["info"]["status"] == "RUNNING" for r in drills.mlflow_runs())
        current = next(t for t in drills.instances() if _label(t) == _label(victim))
        if current["state"] != "running" or current["try_number"] != victim["try_number"]:
            break
        if not has_mlflow_run:
            time.sleep(1)
    current = next(t for t in drills.instances() if _label(t) == _label(victim))
    assert current["state"] == "running" and current["try_number"] == victim["try_number"], \
        f"{_label(victim)} finished before the drill could kill its worker: {current['state']}; " \
        "raise max_epochs"
    worker = next(w for w in live(stack)["workers"] if w["hostname"] == victim["hostname"])
    drills.say(f"drill 1: {_label(victim)} try {victim['try_number']} running on {victim['hostname']} "
               f"(MLflow run RUNNING: {has_mlflow_run}); SIGKILL {worker['service']}")
    killed_at = time.monotonic()
    drills.service("stop-service", worker["service"], "--kill")
    drills.service("start-service", worker["service"])
    restarted = next(w for w in live(stack)["workers"] if w["service"] == worker["service"])
    assert restarted["pid"] != worker["pid"] and Path(f"/proc/{restarted['pid']}").exists(), \
        "stack.json does not name the restarted worker's process"

    def failed_over(tis):
        ti = next(t for t in tis if _label(t) == _label(victim))
        return ti if ti["try_number"] > victim["try_number"] or ti["state"] in ("up_for_retry", "failed") else None

    drills.wait_for(f"{_label(victim)} try {victim['try_number']} failed", failed_over, FAIL_TIMEOUT)
    drills.say(f"drill 1: {_label(victim)} try {victim['try_number']} failed "
               f"{time.monotonic() - killed_at:.0f}s after the kill")
    record["worker_drill"] = {"victim": victim, "worker": worker, "mlflow_run_was_running": has_mlflow_run,
                              "failed_after_s": round(time.monotonic() - killed_at, 1)}

    # --- 2. S3 goes away while a step after training runs -------------------------------------
    def trained(tis):
        train = [t for t in tis if t["task_id"] == "train_or_fetch"]
        return train and all(t["state"] == "success" for t in train)

    drills.wait_for("every train_or_fetch succeeded", trained, RUN_TIMEOUT)

    def first_try_after_training(tis):
        # S3 stops as soon as one is seen running: its publish (the commit marker last) comes at
        # its end, and staging or MLflow's proxied artifacts (also in S3) may fail it first. Do
        # not wait for it to get further: on an idle machine an export takes under 12 s.
        # The exact moment between a file upload and its marker is a unit test's
        # (test_runstore: test_s3_unreachable_during_upload_leaves_no_commit_and_the_retry_completes).
        return next((t for t in tis if t["task_id"] in ("export", "optimize", "validate")
                     and t["state"] == "running" and t["try_number"] == 1), None)

    target = drills.wait_for("an export/optimize/validate first try running", first_try_after_training,
                             RUN_TIMEOUT, interval=1)
    drills.say(f"drill 2: {_label(target)} try 1 running on {target['hostname']}; stopping seaweedfs")
    stopped_at = time.monotonic()
    drills.service("stop-service", "seaweedfs")

    def target_done(tis):
        ti = next(t for t in tis if _label(t) == _label(target))
        return ti if ti["state"] not in ("running", "queued", "scheduled") or ti["try_number"] > 1 else None

    after = drills.wait_for(f"{_label(target)} try 1 ended", target_done, FAIL_TIMEOUT)
    drills.say(f"drill 2: {_label(target)} try 1 ended as {after['state']} "
               f"{time.monotonic() - stopped_at:.0f}s after S3 stopped; starting seaweedfs")
    drills.service("start-service", "seaweedfs")
    record["s3_drill"] = {"target": target, "state_after": after["state"],
                          "down_s": round(time.monotonic() - stopped_at, 1)}

    # --- 3. the MLflow server stops before register ------------------------------------------
    def validated(tis):
        checks = [t for t in tis if t["task_id"] == "validate"]
        return checks and all(t["state"] == "success" for t in checks)

    drills.wait_for("every validate succeeded", validated, RUN_TIMEOUT, interval=1)
    register = next(t for t in drills.instances() if t["task_id"] == "register")
    drills.say(f"drill 3: validate done, register {register['state']}; stopping mlflow")
    assert register["state"] in (None, "scheduled", "queued", "running"), register
    stopped_at = time.monotonic()
    drills.service("stop-service", "mlflow")

    def register_failed(tis):
        ti = next(t for t in tis if t["task_id"] == "register")
        return ti if ti["state"] in ("up_for_retry", "failed", "success") or ti["try_number"] > 1 else None

    after = drills.wait_for("register try 1 ended", register_failed, FAIL_TIMEOUT)
    drills.say(f"drill 3: register ended as {after['state']} (try {after['try_number']}) "
               f"{time.monotonic() - stopped_at:.0f}s after MLflow stopped; starting mlflow")
    drills.service("start-service", "mlflow")
    record["mlflow_drill"] = {"state_after": after["state"], "try_after": after["try_number"]}

    # --- the end of the run ---------------------------------------------------------------------
    while (state := drills.run_state()) not in ("success", "failed"):
        if time.monotonic() - started > RUN_TIMEOUT:
            pytest.fail(f"run {drills.run_id} still {state} after {RUN_TIMEOUT}s\n" + "\n".join(drills.events))
        time.sleep(5)
    record["seconds"] = round(time.monotonic() - started)
    drills.say(f"run {state} after {record['seconds']}s")
    record["state"] = state
    rows = []
    for ti in sorted(drills.instances(), key=lambda t: (t["start_date"] or "~", _label(t))):
        for attempt in drills.tries(ti["task_id"], ti["map_index"]):
            rows.append(f"  {_label(ti):24} try {attempt['try_number']}  {attempt['state'] or '-':14} "
                        f"{attempt['hostname'] or '-':18} {_seconds(attempt['start_date'], attempt['end_date'])}s")
    record["table"] = "\n".join(rows)
    for ti in drills.instances():
        for attempt in drills.tries(ti["task_id"], ti["map_index"]):
            if attempt["state"] in ("failed", "up_for_retry"):
                drills.say(f"{_label(ti)} try {attempt['try_number']} on {attempt['hostname']}: "
                           f"{_first_error(drills.log(ti['task_id'], ti['map_index'], attempt['try_number']))}")
    print(f"\n{drills.run_key}: {state} in {record['seconds']}s\n{record['table']}\n" + "\n".join(drills.events))
    return record


def _first_error(log: str) -> str:
    try:
        entries = json.loads(log)
    except ValueError:
        return log[:300]
    for entry in entries:
        if isinstance(entry, dict) and entry.get("level") == "error":
            detail = (entry.get("error_detail") or [{}])[0]
            return f"{entry.get('event')}: {detail.get('exc_type')}: {str(detail.get('exc_value'))[:300]}"
    return "(no error line in the log)"


def _details(record: dict) -> str:
    return record["table"] + "\n" + "\n".join(record["drills"].events)


class TestFaultDrills:
    def test_run_succeeded(self, drilled_run):
        assert drilled_run["state"] == "success", _details(drilled_run)

    def test_killed_training_was_retried(self, drilled_run):
        drills, victim = drilled_run["drills"], drilled_run["worker_drill"]["victim"]
        tries = drills.tries(victim["task_id"], victim["map_index"])
        assert tries[-1]["try_number"] >= 2 and tries[-1]["state"] == "success", _details(drilled_run)
        first = tries[0]
        assert first["hostname"] == victim["hostname"] and first["state"] != "success", tries

    def test_one_model_version_for_the_run(self, drilled_run):
        drills = drilled_run["drills"]
        versions = drills.mlflow("GET", "model-versions/search",
                                 params={"filter": f"tags.`onnxcast.run_key` = '{drills.run_key}'",
                                         "max_results": 100}).get("model_versions", [])
        assert len(versions) == 1, [(v["name"], v["version"], v.get("run_id")) for v in versions]

    def test_no_mlflow_run_left_running(self, drilled_run):
        runs = drilled_run["drills"].mlflow_runs()
        assert runs, "no MLflow run carries the run key"
        running = [(r["info"]["run_id"], r["info"].get("run_name")) for r in runs if r["info"]["status"] == "RUNNING"]
        assert not running, running

    def test_s3_outage_failed_the_try_and_the_retry_completed(self, drilled_run):
        drills, target = drilled_run["drills"], drilled_run["s3_drill"]["target"]
        tries = drills.tries(target["task_id"], target["map_index"])
        assert tries[0]["state"] in ("failed", "up_for_retry"), (tries, _details(drilled_run))
        assert tries[-1]["try_number"] == 2 and tries[-1]["state"] == "success", tries

    def test_mlflow_outage_fails_register_fast_and_names_the_server(self, drilled_run):
        drills = drilled_run["drills"]
        tries = drills.tries("register", -1)
        first = tries[0]
        assert first["state"] in ("failed", "up_for_retry"), (tries, _details(drilled_run))
        seconds = _seconds(first["start_date"], first["end_date"])
        assert seconds is not None and seconds < 120, (seconds, first)
        log = drills.log("register", -1, first["try_number"])
        port = str(drills.stack["ports"]["mlflow"])
        assert port in log or "ConnectionError" in log or "Connection refused" in log, log[-3000:]
        assert tries[-1]["state"] == "success", tries

    def test_commit_markers_match_the_bytes(self, stack, drilled_run):
        """Nothing half-written is read: every file a marker lists is there with the marker's
        sha256. A file a later step rewrote and listed again is checked against the newest
        marker that lists it (older markers are superseded for it, as RunDir.stage reads)."""
        drills = drilled_run["drills"]
        s3 = s3_client(stack, "pipeline")
        bucket = stack["buckets"]["runs"]
        from onnxcast.runstore import safe_segment

        prefix = f"runs/{safe_segment(drills.dag)}/{safe_segment(drills.run_id)}/"
        keys, token = [], None
        while True:
            page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {}))
            keys += [o["Key"] for o in page.get("Contents", [])]
            token = page.get("NextContinuationToken")
            if not token:
                break
        marker_keys = [k for k in keys if "/_steps/" in k and k.endswith(".json")]
        assert marker_keys, keys[:50]
        markers = [json.loads(s3.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in marker_keys]
        markers.sort(key=lambda m: str(m.get("committed", "")))
        newest: dict[str, tuple[str, dict]] = {}
        for marker in markers:
            for relative, meta in marker["files"].items():
                newest[relative] = (marker.get("step"), meta)
        problems = []
        for relative, (step, meta) in newest.items():
            try:
                data = s3.get_object(Bucket=bucket, Key=prefix + relative)["Body"].read()
            except s3.exceptions.NoSuchKey:
                problems.append(f"{step}: {relative} missing")
                continue
            if hashlib.sha256(data).hexdigest() != meta["sha256"]:
                problems.append(f"{step}: {relative} sha256 differs from the marker")
        assert not problems, problems
        print(f"\n{len(markers)} commit markers, {len(newest)} files checked under s3://{bucket}/{prefix}")
