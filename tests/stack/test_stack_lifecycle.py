"""Starting and stopping the stack's processes, without the stack: a stopped service leaves
nothing behind (not even a process that left its process group), a service that ignores
SIGTERM is killed after the grace period, and a stack never takes the databases or the Redis
db of another stack folder that still exists."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

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
        mine, other = tmp_path / "mine", tmp_path / "other"
        mine.mkdir()
        other.mkdir()
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw-one"}, other)
        with pytest.raises(stack_services.OwnershipError, match=str(other)):
            stack_services.ensure_databases(settings, {settings.airflow_db: "pw-two"}, mine)
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw-one"}, other)  # its owner may

    def test_databases_of_a_stack_folder_that_is_gone_are_made_again(self, settings, tmp_path):
        gone, mine = tmp_path / "gone", tmp_path / "mine"
        mine.mkdir()
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw"}, gone)
        stack_services.ensure_databases(settings, {settings.airflow_db: "pw"}, mine)

    def test_the_redis_db_of_another_live_stack_folder_is_refused(self, settings, tmp_path):
        other, mine = tmp_path / "other", tmp_path / "mine"
        other.mkdir()
        stack_services.claim_redis_db(settings, other)
        with pytest.raises(stack_services.OwnershipError, match="broker of the stack"):
            stack_services.claim_redis_db(settings, mine)
        other.rmdir()
        stack_services.claim_redis_db(settings, mine)  # its owner is gone: taken over


def test_children_are_found_without_the_proc_children_file():
    """CI kernels lack /proc/<pid>/task/<pid>/children; the parent map comes from stat."""

    parent = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(stack_processes.children(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        kids = stack_processes.children(parent.pid)
        assert len(kids) == 2
        assert all(stack_processes.parents()[kid] == parent.pid for kid in kids)
    finally:
        for kid in stack_processes.children(parent.pid):
            os.kill(kid, 9)
        parent.kill()
        parent.wait()
