"""Starting and stopping the stack's processes, without the stack: a stopped service leaves
nothing behind (not even a process that left its process group), a service that ignores
SIGTERM is killed after the grace period, and a stack never takes the databases or the Redis
db of another stack folder that still exists."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import stack_processes  # noqa: E402
import stack_services  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def layout(tmp_path):
    layout = stack_services.StackLayout(tmp_path / "stack")
    layout.create()
    return layout


def _start(layout, name: str, script: str) -> stack_processes.ServiceProcess:
    env = {**os.environ, stack_processes.STACK_MARKER: str(layout.root)}
    command = stack_services.contained(layout, ["/bin/sh", "-c", script])
    return stack_processes.start(name, command, env=env, cwd=layout.root, log=layout.logs / f"{name}.log",
                                 run_dir=layout.run)


def _wait_for_processes(layout, count: int) -> set[int]:
    deadline = time.monotonic() + 10
    while len(pids := stack_processes.stack_pids(layout.root)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


class TestStop:
    def test_a_process_that_left_its_group_is_stopped_with_its_service(self, layout):
        service = _start(layout, "service", "setsid sleep 300 & exec sleep 300")
        pids = _wait_for_processes(layout, 4)  # unshare, init, sleep, setsid sleep
        groups = {os.getpgid(p) for p in pids}
        assert len(groups) >= 2, "the setsid child should be in a group of its own"
        stopped = stack_processes.stop_all(layout.run, layout.root, grace=10, say=lambda m: None)
        assert stopped == 1
        assert not service.alive()
        assert not any(_running(p) for p in pids)
        assert list(layout.run.iterdir()) == []

    def test_a_service_that_ignores_sigterm_is_killed_after_the_grace_period(self, layout):
        service = _start(layout, "stubborn", "trap '' TERM; while true; do sleep 1; done")
        _wait_for_processes(layout, 3)
        messages = []
        started = time.monotonic()
        stack_processes.stop_all(layout.run, layout.root, grace=2, say=messages.append)
        assert not service.alive() and time.monotonic() - started < 15
        assert not stack_processes.stack_pids(layout.root)

    def test_stopping_nothing_is_fine(self, layout):
        assert stack_processes.stop_all(layout.run, layout.root, say=lambda m: None) == 0

    def test_a_dead_service_with_a_reused_pid_is_not_taken_for_the_service(self, layout):
        record = stack_processes.ServiceProcess("gone", os.getpid(), start_ticks=1, log=layout.logs / "x.log")
        assert not record.alive()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return True
    except OSError:
        return False


def _layout(root: Path) -> stack_services.StackLayout:
    layout = stack_services.StackLayout(root)
    layout.create()
    return layout


def _admin_sql(settings, database: str, statement: str):
    conn = stack_services.postgres_admin_connect(settings, database)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


class TestTakeoverDecision:
    """Which databases a stack may take, from their owner marks alone (no server needed)."""

    def test_its_own_databases_are_kept(self, tmp_path):
        layout = _layout(tmp_path / "stack")
        assert stack_services.takeover_action(stack_services.owner_mark(layout), layout, "db") == "keep"

    def test_a_live_stack_folder_elsewhere_is_refused_in_one_line_that_says_what_to_run(self, tmp_path):
        other, mine = _layout(tmp_path / "other" / "stack"), _layout(tmp_path / "mine" / "stack")
        with pytest.raises(stack_services.OwnershipError) as error:
            stack_services.takeover_action(stack_services.owner_mark(other), mine, "PostgreSQL database x")
        message = str(error.value)
        assert "\n" not in message
        assert f"ONNXCAST_HOME={other.root.parent} make stack-down STACK_ARGS=--wipe" in message

    def test_a_folder_removed_and_made_again_is_another_stack(self, tmp_path):
        """Issue 18 item 14: same path, new folder (new secrets): the old databases are not its own."""
        old = _layout(tmp_path / "stack")
        mark = stack_services.owner_mark(old)
        shutil.rmtree(old.root)
        assert stack_services.takeover_action(mark, _layout(tmp_path / "stack"), "db") == "drop"

    def test_a_folder_that_is_gone_is_taken_over(self, tmp_path):
        gone = _layout(tmp_path / "gone" / "stack")
        mark = stack_services.owner_mark(gone)
        shutil.rmtree(gone.root)
        assert stack_services.takeover_action(mark, _layout(tmp_path / "mine" / "stack"), "db") == "drop"

    def test_marks_from_before_stack_ids(self, tmp_path):
        mine = _layout(tmp_path / "stack")
        legacy = f"{stack_services.OWNER_MARK}{mine.root}"
        assert stack_services.takeover_action(legacy, mine, "db") == "adopt"  # an existing stack, upgraded
        assert stack_services.takeover_action(legacy, mine, "db", fresh=True) == "drop"  # a new folder there
        other = tmp_path / "other"
        other.mkdir()
        with pytest.raises(stack_services.OwnershipError, match=str(other)):
            stack_services.takeover_action(f"{stack_services.OWNER_MARK}{other}", mine, "db")

    @pytest.mark.parametrize("mark", [None, "", "made by hand"])
    def test_a_database_that_is_not_a_stacks_is_refused(self, tmp_path, mark):
        with pytest.raises(stack_services.OwnershipError, match="something else"):
            stack_services.takeover_action(mark, _layout(tmp_path / "stack"), "PostgreSQL database x")


@pytest.mark.skipif(not (_reachable(5432) and _reachable(6379)),
                    reason="PostgreSQL (127.0.0.1:5432) or Redis (127.0.0.1:6379) is not running")
class TestOwnership:
    @pytest.fixture
    def settings(self, tmp_path):
        import secrets

        settings = stack_services.StackSettings(name=f"onnxcast_owner_{secrets.token_hex(3)}", redis_db=9)
        yield settings
        stack_services.drop_databases(settings, [settings.airflow_db])
        import redis

        redis.Redis.from_url(settings.broker_url).flushdb()

    def test_databases_of_another_live_stack_folder_are_refused(self, settings, tmp_path):
        mine, other = _layout(tmp_path / "mine"), _layout(tmp_path / "other")
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw-one"}, other)
        with pytest.raises(stack_services.OwnershipError, match=str(other.root)):
            stack_services.ensure_databases(settings, {settings.airflow_db: "pw-two"}, mine)
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw-one"}, other)  # its owner may

    def test_databases_of_a_stack_folder_that_is_gone_are_made_again(self, settings, tmp_path):
        gone, mine = _layout(tmp_path / "gone"), _layout(tmp_path / "mine")
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw"}, gone)
        shutil.rmtree(gone.root)
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw"}, mine)

    def test_databases_of_a_folder_removed_and_made_again_are_made_again(self, settings, tmp_path):
        """Issue 18 item 14: `make stack`, `make stack-down`, the folder removed, `make stack`: the
        old databases (MLflow's users with the old admin password: HTTP 401) were kept."""
        first = _layout(tmp_path / "stack")
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw"}, first)
        _admin_sql(settings, settings.airflow_db, "CREATE TABLE left_by_the_old_stack (x int)")
        shutil.rmtree(first.root)
        again = _layout(tmp_path / "stack")
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw-new"}, again)
        tables = _admin_sql(settings, settings.airflow_db,
                            "SELECT tablename FROM pg_tables WHERE tablename = 'left_by_the_old_stack'")
        assert tables == []
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw-new"}, again)  # now its own

    def test_the_redis_db_of_another_live_stack_folder_is_refused(self, settings, tmp_path):
        other, mine = _layout(tmp_path / "other"), _layout(tmp_path / "mine")
        stack_services.claim_redis_db(settings, other)
        with pytest.raises(stack_services.OwnershipError, match=f"belongs to the stack in {other.root}"):
            stack_services.claim_redis_db(settings, mine)
        shutil.rmtree(other.root)
        stack_services.claim_redis_db(settings, mine)  # its owner is gone: taken over

    def test_the_redis_db_of_a_folder_removed_and_made_again_is_emptied(self, settings, tmp_path):
        import redis

        first = _layout(tmp_path / "stack")
        stack_services.claim_redis_db(settings, first)
        client = redis.Redis.from_url(settings.broker_url)
        client.set("left-by-the-old-stack", "1")
        shutil.rmtree(first.root)
        again = _layout(tmp_path / "stack")
        stack_services.claim_redis_db(settings, again)
        assert client.get("left-by-the-old-stack") is None
        assert client.get(stack_services.REDIS_OWNER_KEY).decode() == str(again.root)


def test_children_are_found_without_the_proc_children_file():
    """CI kernels lack /proc/<pid>/task/<pid>/children; psutil's parent map comes from stat."""

    parent = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(stack_processes.children(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = stack_processes.children(parent.pid)
        assert len(kids) == 2
        assert all(psutil.Process(kid).ppid() == parent.pid for kid in kids)
    finally:
        for kid in stack_processes.children(parent.pid):
            os.kill(kid, 9)
        parent.kill()
        parent.wait()


class TestSettings:
    """`stack.py up --heartbeat-timeout/--retry-delay`: what every Airflow process of the stack gets."""

    def _env(self, layout, **settings) -> dict[str, str]:
        stack = stack_services.StackSettings(**settings)
        stack.assign_ports(["seaweedfs." + p for p in stack_services.SEAWEED_PORTS]
                           + ["mlflow", "airflow-api", "airflow-trigger-logs"]
                           + [f"log-server.{w}" for w in stack_services.WORKERS])
        return stack_services.airflow_env({}, layout, stack_services.Secrets(layout.secrets), stack,
                                          airflow_home=layout.airflow, onnxcast_home=layout.home,
                                          log_folder=layout.logs)

    def test_defaults(self, layout):
        env = self._env(layout)
        assert env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] == "75"
        assert "ONNXCAST_RETRY_DELAY_SECONDS" not in env  # each DAG's own retry delay

    def test_both_reach_airflow_and_the_dags(self, layout):
        env = self._env(layout, heartbeat_timeout=40, retry_delay=20)
        assert env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] == "40"
        assert env["ONNXCAST_RETRY_DELAY_SECONDS"] == "20"
        # kept after the first up: a later `up` without the options reads them back
        saved = stack_services.StackSettings(heartbeat_timeout=40, retry_delay=20)
        saved.save(layout)
        assert stack_services.StackSettings.load(layout, heartbeat_timeout=None) == saved
