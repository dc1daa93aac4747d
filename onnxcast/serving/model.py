"""The served model and the channel follower.

``ChannelFollower`` pulls the channel with :func:`onnxcast.edge.pull` (the edge client's
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxcast.contract import INPUT_NAME, OUTPUT_NAME
from onnxcast.edge import PULLED, installed_model, pull
from onnxcast.errors import OnnxcastError, VerificationError

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

    def run(self, history: np.ndarray) -> np.ndarray:
        return self.session.run([OUTPUT_NAME], {INPUT_NAME: history})[0]


def load_installed(model_dir: Path, name: str, threads: int = 1) -> ServedModel:
    """Load ``model_dir/current`` (as ``edge pull`` installed it; sha256 re-checked) and warm it up."""
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
                        lookback, horizon, len(columns), columns, meta)
    for batch in (1, 8):  # first runs allocate; do it before any request waits on them
        out = model.run(np.zeros((batch, lookback, len(columns)), np.float32))
        if out.shape != (batch, horizon):
            raise VerificationError(f"{path}: forecast shape {out.shape}, expected {(batch, horizon)}")
    return model


class ChannelFollower:
    """Keeps ``current`` at the channel's verified model: polls every ``interval`` seconds in a
    daemon thread. A poll that fails or is refused keeps serving what was loaded."""

    def __init__(self, store_uri: str, name: str, channel: str, dest: Path, *, interval: float = 10.0,
                 threads: int = 1, on_swap: Callable[[ServedModel | None, ServedModel], None] | None = None,
                 on_poll_error: Callable[[str], None] | None = None, trust: str | Path | None = None):
        self.store_uri, self.name, self.channel, self.dest = store_uri, name, channel, Path(dest)
        self.trust = trust  # None: $ONNXCAST_TRUST, else the root installed in dest/trust
        self.interval, self.threads = interval, threads
        self.current: ServedModel | None = None
        self.last_error: str | None = None
        self._on_swap, self._on_poll_error = on_swap, on_poll_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> bool:
        """Pull once and swap if the installed version changed; True when it swapped."""
        try:
            pull(self.store_uri, self.name, self.channel, self.dest, trust=self.trust)
            self.last_error = None
        except OnnxcastError as exc:  # refused or unreachable: keep what is installed and loaded
            self.last_error = str(exc)
            log.warning("channel %s of %s: %s; keeping %s", self.channel, self.name, exc,
                        self.current.version if self.current else "no model")
            if self._on_poll_error:
                self._on_poll_error(type(exc).__name__)
        try:
            info = json.loads((self.dest / "current" / PULLED).read_text())
        except (OSError, ValueError):
            return False  # nothing installed yet
        current = self.current
        if current is not None and (current.version, current.sha256) == (info.get("version"), info.get("sha256")):
            return False
        try:
            loaded = load_installed(self.dest, self.name, self.threads)
        except OnnxcastError as exc:
            self.last_error = str(exc)
            log.error("cannot load the installed model: %s; keeping %s", exc, current.version if current else "none")
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

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.poll()
            except Exception:  # a bug must not kill the follower and freeze the version silently
                log.exception("channel poll crashed; retrying in %.1f s", self.interval)
            # Until a first model is loaded, retry at least every second: readiness waits on it.
            interval = self.interval if self.current is not None else min(self.interval, 1.0)
            self._stop.wait(max(0.0, interval - (time.monotonic() - started)))
