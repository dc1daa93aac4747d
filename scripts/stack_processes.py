"""The stack's processes: started detached in their own process group, recorded in pid files,
waited on with a deadline, and stopped by group, even after ``stack.py`` itself crashed.

Every process of one stack carries ``ONNXCAST_STACK_DIR=<stack folder>`` in its environment,
so :func:`stop_all` also finds the ones that left their process group (nothing here does,
but a crash between fork and pid file, or a task runner that calls ``setsid``, must not
leave a worker behind).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

STACK_MARKER = "ONNXCAST_STACK_DIR"


class StackError(RuntimeError):
    """A step of the stack failed; the message names the service and its log file."""


@dataclass(frozen=True)
class ServiceProcess:
    """One started service: its name, process (group) id, start time and log file."""

    name: str
    pid: int
    start_ticks: int
    log: Path

    def alive(self) -> bool:
        """True while the recorded process runs (a pid reused by another process is not it)."""
        return _start_ticks(self.pid) == self.start_ticks

    def as_record(self) -> dict:
        return {"name": self.name, "pid": self.pid, "start_ticks": self.start_ticks, "log": str(self.log)}


def start(name: str, command: Sequence[str], *, env: dict[str, str], cwd: Path, log: Path,
          run_dir: Path) -> ServiceProcess:
    """Start ``command`` in a new session (its own process group), output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}\n".encode())
        out.flush()
        try:
            process = subprocess.Popen(list(command), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise StackError(f"{name}: cannot start {command[0]}: {exc}") from None
    service = ServiceProcess(name=name, pid=process.pid, start_ticks=_start_ticks(process.pid) or 0, log=log)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"{name}.json").write_text(json.dumps(service.as_record()))
    # Popen would reap the child when garbage-collected; the stack outlives this process.
    process.returncode = 0
    return service


def recorded(run_dir: Path) -> list[ServiceProcess]:
    """The services recorded in ``run_dir`` (alive or not), in start order."""
    services = []
    for path in run_dir.glob("*.json") if run_dir.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            services.append(ServiceProcess(record["name"], int(record["pid"]), int(record["start_ticks"]),
                                           Path(record["log"])))
        except (OSError, ValueError, KeyError):
            path.unlink(missing_ok=True)  # a torn record: nothing to stop through it
    return sorted(services, key=lambda s: s.start_ticks)


def wait_until(service: ServiceProcess, ready: Callable[[], bool], *, timeout: float, what: str = "ready",
               interval: float = 1.0) -> float:
    """Poll ``ready()`` until it is true; fail if the service exits or ``timeout`` seconds pass.
    Returns the seconds waited."""
    started = time.monotonic()
    last_error = ""
    while True:
        try:
            if ready():
                return time.monotonic() - started
        except Exception as exc:  # noqa: BLE001 - any failure of a probe means "not ready yet"
            last_error = f" (last probe: {type(exc).__name__}: {str(exc)[:200]})"
        if not service.alive():
            raise StackError(f"{service.name} exited before it was {what}; see {service.log}\n{tail(service.log)}")
        if time.monotonic() - started > timeout:
            raise StackError(f"{service.name} was not {what} within {timeout:.0f}s{last_error}; "
                             f"see {service.log}\n{tail(service.log)}")
        time.sleep(interval)


def stop_all(run_dir: Path, stack_dir: Path, *, stages: Sequence[Sequence[str]] = (), grace: float = 20.0,
             say: Callable[[str], None] = print) -> int:
    """Stop every recorded service and any stray process of this stack: SIGTERM to each process
    group, SIGKILL after ``grace`` seconds. ``stages``: groups of service-name prefixes stopped
    one group after the other (the services in no group come last), so that workers drain
    while the API they report to still answers. Returns how many were found."""
    services = list(reversed(recorded(run_dir)))

    def stage_of(service: ServiceProcess) -> int:
        for index, prefixes in enumerate(stages):
            if service.name.startswith(tuple(prefixes)):
                return index
        return len(stages)

    found = 0
    for stage in sorted({stage_of(s) for s in services}):
        running = [s for s in services if stage_of(s) == stage and s.alive()]
        for service in running:
            say(f"stopping {service.name} (process group {service.pid})")
            _signal_group(service.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for service in running:
            while service.alive() and _group_exists(service.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if service.alive() and _group_exists(service.pid):
                say(f"{service.name} still running after {grace:.0f}s: SIGKILL")
                _signal_group(service.pid, signal.SIGKILL)
        # SIGKILL is delivered at once but a process takes a moment to exit (its memory is gone
        # before it is a zombie, so it no longer shows as a stray): wait until it has
        deadline = time.monotonic() + 10
        while any(s.alive() for s in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        found += len(running)
    strays = _stack_processes(stack_dir)
    if strays:
        found += len(strays)
        say(f"stopping {len(strays)} other process(es) of this stack: {sorted(strays)}")
        for pid in strays:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _stack_processes(stack_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in _stack_processes(stack_dir):
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _stack_processes(stack_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
    for service in services:
        (run_dir / f"{service.name}.json").unlink(missing_ok=True)
    return found


def stop_service(service: ServiceProcess, *, kill: bool = False, grace: float = 20.0) -> None:
    """Stop one service: SIGTERM to its process group (SIGKILL after ``grace`` seconds), or
    SIGKILL at once with ``kill``; then wait until every process of its PID namespace is gone."""
    namespace = _namespace_of_children(service.pid)
    _signal_group(service.pid, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + grace
    while service.alive() and _group_exists(service.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if service.alive() or _group_exists(service.pid):
        _signal_group(service.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (service.alive() or (namespace and _in_namespace(namespace))) and time.monotonic() < deadline:
        time.sleep(0.1)
    if service.alive() or (namespace and _in_namespace(namespace)):
        raise StackError(f"{service.name}: processes still run after SIGKILL")


def _namespace_of_children(pid: int) -> str | None:
    """The PID namespace of ``pid``'s first child (``unshare --fork``'s init), if it has one."""
    kids = children(pid)
    try:
        return os.readlink(f"/proc/{kids[0]}/ns/pid") if kids else None
    except OSError:
        return None


def parents() -> dict[int, int]:
    """Every live process id mapped to its parent's, read from ``/proc/<pid>/stat``.

    ``/proc/<pid>/task/<pid>/children`` would be shorter, but kernels built without
    CONFIG_PROC_CHILDREN do not have it."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return found


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, oldest process id first."""
    return sorted(child for child, parent in parents().items() if parent == pid)


def _in_namespace(namespace: str) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == namespace and _start_ticks(int(entry.name)) is not None:
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


def stack_pids(stack_dir: Path) -> set[int]:
    """Processes (ids) that belong to the stack in ``stack_dir``, found by their environment."""
    return _stack_processes(stack_dir)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(f"  | {line}" for line in text[-lines:])


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    if fields[0] == "Z":  # a zombie has finished; its parent just has not reaped it yet
        return None
    return int(fields[19])  # field 22 of stat: start time in clock ticks since boot


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stack_processes(stack_dir: Path) -> set[int]:
    marker = f"{STACK_MARKER}={stack_dir}".encode()
    mine = {os.getpid(), os.getppid()}
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and _start_ticks(int(entry.name)) is not None:
            pids.add(int(entry.name))
    return pids
