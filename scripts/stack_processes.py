"""The stack's processes: started detached in their own process group, recorded in pid files,
waited on with a deadline, and stopped by group, even after ``stack.py`` itself crashed.

Every process of one stack carries ``ONNXCAST_STACK_DIR=<stack folder>`` in its environment,
so :func:`stop_all` also finds the ones that left their process group (nothing here does,
but a crash between fork and pid file, or a task runner that calls ``setsid``, must not
leave a worker behind).

Processes are read with psutil. One that has exited but is a zombie counts as gone: a service
outlives the ``stack.py`` that started it, and its new parent (the machine's PID 1) need not
reap it. That is why the waits poll (:func:`wait_for`) instead of ``psutil.wait_procs``, which
waits for the reaping.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

STACK_MARKER = "ONNXCAST_STACK_DIR"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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
        try:
            process = psutil.Process(self.pid)
            return _running(process) and _start_ticks(process) == self.start_ticks
        except psutil.Error:
            return False

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
    # not reaped yet (not even if it failed at once), so its pid still names it
    service = ServiceProcess(name=name, pid=process.pid, start_ticks=_start_ticks(psutil.Process(process.pid)),
                             log=log)
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


def wait_for(condition: Callable[[], bool], *, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``condition()`` until it is true or ``timeout`` seconds pass; returns whether it came true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def wait_until(service: ServiceProcess, ready: Callable[[], bool], *, timeout: float, what: str = "ready",
               interval: float = 1.0) -> float:
    """Poll ``ready()`` until it is true; fail if the service exits or ``timeout`` seconds pass.
    Returns the seconds waited."""
    started = time.monotonic()
    last_error = ""

    def probe() -> bool:
        nonlocal last_error
        try:
            if ready():
                return True
        except Exception as exc:  # noqa: BLE001 - any failure of a probe means "not ready yet"
            last_error = f" (last probe: {type(exc).__name__}: {str(exc)[:200]})"
        if not service.alive():
            raise StackError(f"{service.name} exited before it was {what}; see {service.log}\n{tail(service.log)}")
        return False

    if not wait_for(probe, timeout=timeout, interval=interval):
        raise StackError(f"{service.name} was not {what} within {timeout:.0f}s{last_error}; "
                         f"see {service.log}\n{tail(service.log)}")
    return time.monotonic() - started


def stop_all(run_dir: Path, stack_dir: Path, *, stages: Sequence[Sequence[str]] = (), grace: float = 20.0,
             say: Callable[[str], None] = print) -> int:
    """Stop every recorded service and any stray process of this stack: SIGTERM to each process
    group, SIGKILL after ``grace`` seconds. ``stages``: groups of service-name prefixes stopped
    one group after the other (the services in no group come last), so that workers drain
    while the API they report to still answers. Returns how many were found."""
    services = list(reversed(recorded(run_dir)))

    def stage_of(service: ServiceProcess) -> int:
        return next((index for index, prefixes in enumerate(stages) if service.name.startswith(tuple(prefixes))),
                    len(stages))

    found = 0
    for stage in sorted({stage_of(s) for s in services}):
        running = [s for s in services if stage_of(s) == stage and s.alive()]
        _stop_groups(running, grace=grace, say=say)
        found += len(running)
    strays = _stack_processes(stack_dir)
    if strays:
        found += len(strays)
        say(f"stopping {len(strays)} other process(es) of this stack: {sorted(p.pid for p in strays)}")
        _signal_each(strays, signal.SIGTERM)
        wait_for(lambda: not _stack_processes(stack_dir), timeout=10, interval=0.2)
        _signal_each(_stack_processes(stack_dir), signal.SIGKILL)
        wait_for(lambda: not _stack_processes(stack_dir), timeout=5)
    for service in services:
        (run_dir / f"{service.name}.json").unlink(missing_ok=True)
    return found


def stop_service(service: ServiceProcess, *, kill: bool = False, grace: float = 20.0) -> None:
    """Stop one service: SIGTERM to its process group (SIGKILL after ``grace`` seconds), or
    SIGKILL at once with ``kill``; then wait until every process of its PID namespace is gone."""
    # The namespace's init is the first child of ``unshare --fork``. The kernel lets that init
    # exit (become a zombie) only after every other process of its PID namespace is gone
    # (zap_pid_ns_processes), so waiting for the init waits for the whole namespace.
    init = next(iter(_children(service.pid)), None)
    _stop_groups([service], grace=grace, first=signal.SIGKILL if kill else signal.SIGTERM)
    if not wait_for(lambda: not service.alive() and not (init is not None and _running(init)), timeout=10):
        raise StackError(f"{service.name}: processes still run after SIGKILL")


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, oldest process id first."""
    return [child.pid for child in _children(pid)]


def stack_pids(stack_dir: Path) -> set[int]:
    """Processes (ids) that belong to the stack in ``stack_dir``, found by their environment."""
    return {process.pid for process in _stack_processes(stack_dir)}


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(f"  | {line}" for line in text[-lines:])


def _stop_groups(services: Sequence[ServiceProcess], *, grace: float, first: int = signal.SIGTERM,
                 say: Callable[[str], None] = lambda message: None) -> None:
    """``first`` (SIGTERM) to the process group of each service, SIGKILL to those still running
    after ``grace`` seconds; then wait until they have exited."""
    for service in services:
        say(f"stopping {service.name} (process group {service.pid})")
        _signal_group(service.pid, first)
    wait_for(lambda: not any(s.alive() for s in services), timeout=grace, interval=0.2)
    for service in services:
        if service.alive():
            say(f"{service.name} still running after {grace:.0f}s: SIGKILL")
            _signal_group(service.pid, signal.SIGKILL)
    # SIGKILL is delivered at once but a process takes a moment to exit (its memory is gone
    # before it is a zombie, so it no longer shows as a stray): wait until it has
    wait_for(lambda: not any(s.alive() for s in services), timeout=10, interval=0.05)


def _running(process: psutil.Process) -> bool:
    """True while ``process`` runs: not exited, not a zombie, and its pid not taken by another
    process since (psutil compares start times)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _start_ticks(process: psutil.Process) -> int:
    """When ``process`` started, in clock ticks after boot: psutil's create_time is the boot time
    plus this, and the boot time moves with the system clock (NTP), the ticks do not, so a record
    written by one ``stack.py`` still matches when the next one checks it."""
    return round((process.create_time() - psutil.boot_time()) * _CLOCK_TICKS)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return sorted(psutil.Process(pid).children(), key=lambda child: child.pid)
    except psutil.Error:
        return []


def _stack_processes(stack_dir: Path) -> list[psutil.Process]:
    mine = {os.getpid(), os.getppid()}
    return [process for process in psutil.process_iter(["environ"])
            if process.pid not in mine and (process.info["environ"] or {}).get(STACK_MARKER) == str(stack_dir)
            and _running(process)]


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_each(processes: Iterable[psutil.Process], sig: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):  # gone already, or its pid now another's
            process.send_signal(sig)
