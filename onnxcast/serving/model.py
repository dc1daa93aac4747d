"""The served model and the channel follower.

``ChannelFollower`` pulls the channel with :func:`onnxcast.rollout.edge.pull` (the edge client's
verification, whatever it checks: digests, I/O contract, external data, signatures), loads
what was installed, warms it up, and only then replaces ``current`` in one reference
assignment. A batch takes ``current`` once and answers every request in it with that model,
so a swap never fails a request and never mixes two versions in one answer.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxcast.base.batches import run_in_chunks
from onnxcast.base.contract import (
    OUTPUT_NAME,
    QUANTILE_METADATA,
    QUANTILES_NAME,
    has_quantiles,
    parse_quantile_levels,
    quantile_problems,
)
from onnxcast.base.errors import OnnxcastError, VerificationError
from onnxcast.rollout.edge import PULLED, installed_model, ort_signature, pull

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """One loaded, verified model version: an ORT session and what the service needs to know."""

    name: str
    version: str
    artifact: str
    sha256: str
    session: Any
    lookback: int
    horizon: int
    n_features: int
    columns: tuple[str, ...]
    metadata: dict[str, str] = field(default_factory=dict)
    min_history: int = 0  # shortest history this version answers (its metadata); 0: its lookback
    levels: tuple[float, ...] = ()  # the levels of its quantiles output; empty: a model without one

    def __post_init__(self):
        if not self.min_history:
            object.__setattr__(self, "min_history", self.lookback)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Its output names, in the order a request that names none gets them."""
        return (OUTPUT_NAME, QUANTILES_NAME) if self.levels else (OUTPUT_NAME,)

    def run(self, history: np.ndarray) -> np.ndarray:
        """The forecast alone [batch, horizon]."""
        return run_in_chunks(self.session, [OUTPUT_NAME], history)[0]

    def run_outputs(self, history: np.ndarray) -> dict[str, np.ndarray]:
        """Every output by name (a large batch in cache-sized chunks: onnxcast.base.batches)."""
        if not self.levels:
            return {OUTPUT_NAME: self.run(history)}
        return dict(zip(self.outputs, run_in_chunks(self.session, self.outputs, history), strict=True))


def load_installed(model_dir: Path, name: str, threads: int = 1, min_history: int | None = None) -> ServedModel:
    """Load ``model_dir/current`` (as ``edge pull`` installed it; sha256 re-checked) and warm it up.

    ``min_history`` (the ``--min-history`` setting) below what the model takes is raised to
    it, in one log line: ``ServedModel.min_history`` is the shortest history it answers."""
    try:
        return _load(model_dir, name, threads, min_history)
    except OnnxcastError:
        raise
    except Exception as exc:  # ORT's own errors: the file cannot be served, say so in one line
        raise VerificationError(f"{name}: the installed model cannot run in ONNX Runtime "
                                f"({type(exc).__name__}: {_first_line(exc)})") from None


def _load(model_dir: Path, name: str, threads: int, min_history: int | None) -> ServedModel:
    import onnxruntime as ort

    path = installed_model(model_dir).resolve()  # resolved: a later pull may move 'current'
    pulled = json.loads((path.parent / PULLED).read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Spinning threads burn the cores the HTTP loop needs (ORT#13808).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    meta = {k.removeprefix("onnxcast."): v for k, v in session.get_modelmeta().custom_metadata_map.items()
            if k.startswith("onnxcast.")}
    try:
        lookback, horizon = int(meta["lookback"]), int(meta["horizon"])
        columns = (meta["target"], *[c for c in meta.get("features", "").split(",") if c])
    except (KeyError, ValueError) as exc:
        raise VerificationError(f"{path}: ONNX metadata lacks a usable onnxcast.{exc}") from None
    model = ServedModel(name, pulled["version"], pulled["artifact"], pulled["sha256"], session,
                        lookback, horizon, len(columns), columns, meta, levels=_levels(session, meta, path))
    for batch in (1, 8):  # first runs allocate; do it before any request waits on them
        outs = model.run_outputs(np.zeros((batch, lookback, len(columns)), np.float32))
        want = {OUTPUT_NAME: (batch, horizon), QUANTILES_NAME: (batch, horizon, len(model.levels))}
        for output, out in outs.items():
            if out.shape != want[output]:
                raise VerificationError(f"{path}: {output} shape {out.shape}, expected {want[output]}")
    shortest = model_min_history(meta, lookback, path)
    if shortest < lookback:  # declared: check it runs there before any request relies on it
        outs = model.run_outputs(np.repeat(np.linspace(0, 1, shortest, dtype=np.float32)[None, :, None],
                                           len(columns), 2))
        out = outs[OUTPUT_NAME]
        if out.shape != (1, horizon) or not all(np.isfinite(o).all() for o in outs.values()):
            # the quantiles' scale reads a season of changes: a history of one season has none
            raise VerificationError(f"{path}: no finite {' or '.join(outs)} at its onnxcast.min_history of "
                                    f"{shortest} steps")
    if min_history is not None and min_history < shortest:
        log.warning("model %s version %s takes histories of at least %d steps: --min-history %d is raised to %d "
                    "for this version (shorter histories get a 400)", name, model.version, shortest, min_history,
                    shortest)
    return replace(model, min_history=shortest)


def _levels(session, meta: dict[str, str], path: Path) -> tuple[float, ...]:
    """The levels of the model's quantiles output (empty without one); VerificationError when
    its ``onnxcast.quantile_levels`` is missing, malformed, or disagrees with the output."""
    found = ort_signature(session)
    problems = quantile_problems(found, meta)
    if problems:
        raise VerificationError(f"{path}: " + "; ".join(problems))
    return parse_quantile_levels(meta[QUANTILE_METADATA]) if has_quantiles(found) else ()


def model_min_history(meta: dict[str, str], lookback: int, path: Path) -> int:
    """The shortest history a model takes: its ``onnxcast.min_history`` metadata, else its lookback.

    The contract is any history of at least ``lookback`` steps (docs/architecture.md;
    validation checks parity only there and above). Shorter ones are outside it: a window
    model reads exactly its lookback, the LSTM's seasonal anchor wraps around below one
    season (wrong numbers) and fails in ONNX Runtime below that (it was a 500)."""
    declared = meta.get("min_history")
    if declared is None:
        return lookback
    if not declared.isdigit() or not 1 <= int(declared) <= lookback:
        raise VerificationError(f"{path}: onnxcast.min_history {declared[:20]!r} is not between 1 and the lookback "
                                f"{lookback}")
    return int(declared)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


class ChannelFollower:
    """Keeps ``current`` at the channel's verified model: polls every ``interval`` seconds in a
    daemon thread. A poll that fails or is refused keeps serving what was loaded.

    Each poll runs in a thread of its own that the follower waits on for ``timeout`` seconds:
    a store read that never returns (a FIFO in a local store blocked ``open`` forever; an S3
    endpoint that accepts and never answers) is reported instead of freezing the version
    silently. Every failed, refused, crashed or overdue poll is one log line and one
    ``on_poll_error(reason)`` call (``reason``: the error's class name, or ``PollTimeout``)."""

    def __init__(self, store_uri: str, name: str, channel: str, dest: Path, *, interval: float = 10.0,
                 threads: int = 1, on_swap: Callable[[ServedModel | None, ServedModel], None] | None = None,
                 on_poll_error: Callable[[str], None] | None = None, trust: str | Path | None = None,
                 timeout: float = 60.0, min_history: int | None = None):
        self.store_uri, self.name, self.channel, self.dest = store_uri, name, channel, Path(dest)
        self.trust = trust  # None: $ONNXCAST_TRUST, else the root installed in dest/trust
        self.interval, self.threads, self.timeout, self.min_history = interval, threads, timeout, min_history
        self.current: ServedModel | None = None
        self.last_error: str | None = None
        self._on_swap, self._on_poll_error = on_swap, on_poll_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._polling: threading.Thread | None = None  # the poll in progress, if any
        self._poll_started = self._stuck_logged = 0.0

    def poll(self) -> bool:
        """Pull once and swap if the installed version changed; True when it swapped."""
        try:
            pull(self.store_uri, self.name, self.channel, self.dest, trust=self.trust, channel_artifact=True)
            self.last_error = None
        except OnnxcastError as exc:  # refused or unreachable: keep what is installed and loaded
            self._failed(type(exc).__name__, str(exc))
        try:
            info = json.loads((self.dest / "current" / PULLED).read_text())
        except (OSError, ValueError):
            return False  # nothing installed yet
        current = self.current
        if current is not None and (current.version, current.sha256) == (info.get("version"), info.get("sha256")):
            return False
        try:
            loaded = load_installed(self.dest, self.name, self.threads, self.min_history)
        except OnnxcastError as exc:
            self._failed(type(exc).__name__, f"cannot load the installed model: {exc}")
            return False
        self.current = loaded  # the swap: one reference assignment; batches in flight keep theirs
        log.info("serving %s version %s (was %s)", self.name, loaded.version, current.version if current else "none")
        if self._on_swap:
            self._on_swap(current, loaded)
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="channel-follower", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def poll_with_timeout(self) -> None:
        """One poll in its own thread, waited on for ``timeout`` seconds; never raises."""
        if self._polling is not None and self._polling.is_alive():
            # Never a second poll next to a stuck one: it would wait on the same device lock.
            # Each skipped poll is counted; the log says so once per timeout, not every interval.
            stuck = time.monotonic() - self._poll_started
            self._failed("PollTimeout", f"the poll started {stuck:.0f} s ago has not returned (the store does not "
                                        "answer)", quiet=stuck < self._stuck_logged + self.timeout)
            if stuck >= self._stuck_logged + self.timeout:
                self._stuck_logged = stuck
            return
        self._stuck_logged = 0.0
        self._poll_started = time.monotonic()
        self._polling = threading.Thread(target=self._guarded_poll, name="channel-poll", daemon=True)
        self._polling.start()
        self._polling.join(self.timeout)
        if self._polling.is_alive():
            self._failed("PollTimeout", f"the channel poll did not return within {self.timeout:g} s "
                                        "(the store does not answer)")
            self._stuck_logged = self.timeout

    def _guarded_poll(self) -> None:
        try:
            self.poll()
        except Exception as exc:  # a bug or an untyped error: one line, counted; the loop goes on
            self._failed(type(exc).__name__, f"poll failed ({type(exc).__name__}: {_first_line(exc)})")
            log.debug("poll failure", exc_info=True)

    def _failed(self, reason: str, message: str, quiet: bool = False) -> None:
        self.last_error = message
        if not quiet:
            log.warning("channel %s of %s: %s; keeping %s", self.channel, self.name, message,
                        f"version {self.current.version}" if self.current else "no model")
        if self._on_poll_error:
            self._on_poll_error(reason)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_with_timeout()
            # Until a first model is loaded, retry at least every second: readiness waits on it.
            interval = self.interval if self.current is not None else min(self.interval, 1.0)
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))
