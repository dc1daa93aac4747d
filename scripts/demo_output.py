"""What the demo shows on the terminal: a live table of task states, with everything else in a log file.

``dag.test()`` runs every task in the demo's own process, and Airflow, the tasks, MLflow and
GX all write their logs to stdout/stderr (about 240 structured lines for one run).
:func:`output_to` sends file descriptors 1 and 2 to a log file, which catches every one of
them whatever logging setup they captured, and hands back a stream on the saved terminal.
:class:`TaskStatesView` polls the metadata DB from a thread and draws on that stream: a
table redrawn in place on a terminal, one line per state change otherwise (pipes, CI).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

FINISHED = {"success", "failed", "skipped", "upstream_failed", "removed"}
SHOWN_CHANGES = {"running", "up_for_retry"} | FINISHED  # the plain-lines mode skips scheduled/queued
FAILED = {"failed", "up_for_retry"}
# a structlog or MLflow line starts with a timestamp; traceback lines do not
RECORD_START = re.compile(r"^\d{4}[-/]\d{2}[-/]\d{2}[T ]")


@contextlib.contextmanager
def output_to(log_path: Path) -> Iterator[TextIO]:
    """Send fds 1 and 2 (and so every print, log handler and child process) to ``log_path``.

    Yields a line-buffered text stream on the original stdout for what the person should see.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved_out), "w", buffering=1, encoding="utf-8", errors="replace")
    try:
        with open(log_path, "ab") as log_file:
            os.dup2(log_file.fileno(), 1)
            os.dup2(log_file.fileno(), 2)
            try:
                yield terminal
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved_out, 1)
                os.dup2(saved_err, 2)
    finally:
        os.close(saved_out)
        os.close(saved_err)
        terminal.close()


def is_terminal(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("TERM", "") != "dumb"


class TaskStatesView:
    """Task id (with family for mapped tasks), state and duration of the newest run of a DAG."""

    def __init__(self, dag_id: str, task_order: list[str], out: TextIO, log_path: Path, *,
                 mapped_over: str | None = None, live: bool | None = None, interval: float = 1.0) -> None:
        """``mapped_over``: the task whose returned list the mapped tasks expand over; its items
        label the map indexes before each mapped task has rendered its own label."""
        self.dag_id, self.out, self.log_path, self.interval = dag_id, out, log_path, interval
        self.mapped_over = mapped_over
        self.map_labels: list = []
        self.order = {task_id: i for i, task_id in enumerate(task_order)}
        self.live = is_terminal(out) if live is None else live
        self.since = datetime.now(UTC)
        self.started = time.monotonic()
        self.rows: dict[tuple[str, int], dict] = {}
        self.log_offsets: dict[tuple[str, int], int] = {}
        self.last_offset = 0
        self.failures: dict[str, tuple[str, list[str]]] = {}  # label -> error line, traceback tail
        self.drawn = 0
        self.run_state = "starting"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="task-states-view", daemon=True)

    def __enter__(self) -> TaskStatesView:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()
        if self.live:
            self.draw()
        for label, (error, tail) in self.failures.items():
            print(f"\n{label} failed: {error}", file=self.out)
            for line in tail:
                print(f"    {line}", file=self.out)
        if self.failures:
            print(f"  full task logs: {self.log_path}", file=self.out)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001  a locked SQLite read now and then: try again next tick
                print(f"task-states-view: {exc!r}", file=sys.stderr)
                continue
            if self.live:
                self.draw()

    def poll(self) -> None:
        """Read the task instances of the newest run started since this view began."""
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with create_session() as session:
            run = session.scalars(select(DagRun).where(DagRun.dag_id == self.dag_id, DagRun.run_after >= self.since)
                                  .order_by(DagRun.id.desc()).limit(1)).first()
            if run is None:
                return
            self.run_state = str(run.state.value if hasattr(run.state, "value") else run.state)
            tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == self.dag_id,
                                                             TaskInstance.run_id == run.run_id)).all()
            if self.mapped_over and not self.map_labels:
                self.map_labels = _returned_list(session, run, self.mapped_over)
            now = datetime.now(UTC)
            # a mapped task's placeholder (map index -1) becomes index 0 when it expands
            for gone in set(self.rows) - {(ti.task_id, ti.map_index) for ti in tis}:
                del self.rows[gone]
            for ti in tis:
                state = str(ti.state.value if hasattr(ti.state, "value") else ti.state or "waiting")
                end = ti.end_date or (now if ti.start_date else None)
                duration = (end - ti.start_date).total_seconds() if ti.start_date and end else None
                label = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{self._map_label(ti)}]"
                self._update((ti.task_id, ti.map_index), label, state, duration)
        self.last_offset = offset

    def _update(self, key: tuple[str, int], label: str, state: str, duration: float | None) -> None:
        previous = self.rows.get(key, {}).get("state")
        if state != "waiting":
            # dag.test() runs one task at a time: this task's log lines come after what the
            # log file held at the poll before it was first seen scheduled or running
            self.log_offsets.setdefault(key, self.last_offset)
        self.rows[key] = {"label": label, "state": state, "duration": duration}
        if state == previous:
            return
        if state in FAILED:
            self.failures[label] = self._error_in_log(self.log_offsets.get(key, 0))
        if not self.live and state in SHOWN_CHANGES:
            took = f"  {duration:.1f} s" if state in FINISHED and duration is not None else ""
            print(f"{self._clock()}  {label:<32} {state}{took}", file=self.out)

    def _map_label(self, ti) -> str:
        rendered = ti._rendered_map_index  # noqa: SLF001  the map_index_template, set when the task ends
        if rendered:
            return rendered
        return str(self.map_labels[ti.map_index]) if ti.map_index < len(self.map_labels) else str(ti.map_index)

    def draw(self) -> None:
        """Redraw the table in place: move up over the last drawing, rewrite each line."""
        lines = [f"{self.dag_id}: {_paint(self.run_state)}  {self._clock()}"]
        for key in sorted(self.rows, key=lambda k: (self.order.get(k[0], len(self.order)), k[1])):
            row = self.rows[key]
            duration = "" if row["duration"] is None else f"{row['duration']:7.1f} s"
            state = _paint(row["state"]) + " " * max(0, 16 - len(row["state"]))
            lines.append(f"  {row['label'][:32]:<32} {state}{duration}")
        up = f"\x1b[{self.drawn}F" if self.drawn else ""
        self.out.write(up + "".join(f"\x1b[2K{line}\n" for line in lines) + "\x1b[J")
        self.out.flush()
        self.drawn = len(lines)

    def _clock(self) -> str:
        seconds = int(time.monotonic() - self.started)
        return f"{seconds // 60:02d}:{seconds % 60:02d}"

    def _error_in_log(self, offset: int) -> tuple[str, list[str]]:
        """The exception of a task's last traceback in the log file, and the frames just above it."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                f.seek(offset)
                lines = f.read().splitlines()
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})", []
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        if not starts:
            errors = [line for line in lines if "[error" in line or "ERROR" in line]
            return (errors[-1] if errors else "no traceback in the log file"), []
        first = starts[-1]
        last = next((i for i in range(first + 1, len(lines)) if RECORD_START.match(lines[i])), len(lines))
        traceback = [line for line in lines[first + 1 : last] if line.strip() and set(line.strip()) != {"^"}]
        if not traceback:
            return "empty traceback", []
        return traceback[-1], traceback[-5:-1]


def _returned_list(session, run, task_id: str) -> list:
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    value = session.scalar(select(XComModel.value).where(
        XComModel.dag_id == run.dag_id, XComModel.run_id == run.run_id, XComModel.task_id == task_id,
        XComModel.key == "return_value", XComModel.map_index == -1))
    return value if isinstance(value, list) else []


COLOURS = {"success": 32, "failed": 31, "upstream_failed": 31, "up_for_retry": 33, "running": 36, "skipped": 35}


def _paint(state: str) -> str:
    code = COLOURS.get(state)
    return f"\x1b[{code}m{state}\x1b[0m" if code else state


