"""The runtimes a device runs an installed artifact with, other than ONNX Runtime (which
onnxcast.rollout.edge opens itself): OpenVINO for the ``openvino`` target, TVM's Relax VM for
``tvm-aarch64``. Each is a ``session`` with ONNX Runtime's ``run(output_names, feeds)`` shape, so
``onnxcast.base.batches.run_in_chunks`` and ``edge predict`` use it unchanged.

The model's onnxcast metadata and I/O signature come from the manifest the pull verified (kept
next to the artifact): OpenVINO has no reader for ONNX ``metadata_props``, and a compiled library
has none at all. The runtime is imported here, at predict time: a device without it is refused
in one line naming the extra to install.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from onnxcast.base.contract import INPUT_NAME
from onnxcast.base.errors import ConfigError, VerificationError
from onnxcast.base.untrusted import UntrustedInputError, loads_json, read_regular_file
from onnxcast.rollout.device_target import OPENVINO, TVM, DeviceTarget
from onnxcast.rollout.store import MANIFEST, MAX_MANIFEST_BYTES


def open_runtime(target: DeviceTarget, path: Path, info: dict, threads: int) -> tuple[Any, dict[str, str], dict]:
    """``(session, metadata, signature)`` of the artifact ``path`` installed for ``target``."""
    metadata, found = manifest_facts(path, info)
    if target.runtime == OPENVINO:
        return OpenVinoSession(path, threads), metadata, found
    if target.runtime == TVM:
        return TvmSession(path, [o["name"] for o in found.get("outputs", [])]), metadata, found
    raise ConfigError(f"{path}: target {target.name!r} runs on {target.runtime}, which this client opens itself")


def manifest_facts(path: Path, info: dict) -> tuple[dict[str, str], dict]:
    """The onnxcast metadata (unprefixed) and I/O signature the verified manifest next to
    ``path`` records for it; for an artifact without them (a compiled library), the channel's
    ONNX artifact's, which it was compiled from."""
    where = path.parent / MANIFEST
    try:
        document = loads_json(read_regular_file(where, what="manifest", limit=MAX_MANIFEST_BYTES,
                                                follow_symlinks=False), what=str(where))
    except UntrustedInputError as exc:
        raise VerificationError(f"{exc}; pull again") from None
    manifest = document.get("signed", document) if isinstance(document, dict) else {}
    artifacts = manifest.get("artifacts") if isinstance(manifest, dict) else None
    artifacts = artifacts if isinstance(artifacts, dict) else {}
    for name in (path.name, info.get("channel_artifact")):
        entry = artifacts.get(name) if isinstance(name, str) else None
        if isinstance(entry, dict) and isinstance(entry.get("metadata"), dict) and isinstance(entry.get("signature"),
                                                                                             dict):
            return {str(k): str(v) for k, v in entry["metadata"].items()}, entry["signature"]
    raise VerificationError(f"{where}: records no metadata and I/O signature for {path.name}; pull again")


class OpenVinoSession:
    """OpenVINO's CPU device with the f32 precision hint, as onnxcast validated the target
    (onnxcast/targets/worker.py): without it OpenVINO computes in bf16 on CPUs with
    ``avx512_bf16``. One history row per inference where the model reads features: OpenVINO
    2026.4.1 miscomputes batches above 1 of these graphs (docs/targets.md)."""

    def __init__(self, path: Path, threads: int):
        try:
            import openvino as ov
        except ImportError:
            raise ConfigError(f"{path}: installed for the openvino target, but openvino is not installed here: "
                              "pip install 'onnxcast-edge[openvino]', or pull with --target x86_64") from None
        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU",
                                           {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads})
        self.request = self.compiled.create_infer_request()
        self.outputs = {o.get_any_name(): o for o in self.compiled.outputs}

    def _infer(self, history: np.ndarray, names: list[str]) -> list[np.ndarray]:
        result = self.request.infer({INPUT_NAME: history})
        return [np.array(result[self.outputs[n]], copy=True) for n in names]  # views of OpenVINO's buffers

    def run(self, names, feeds: dict) -> list[np.ndarray]:
        history, names = feeds[INPUT_NAME], list(names)
        if history.shape[-1] <= 1 or len(history) <= 1:
            return self._infer(history, names)
        rows = [self._infer(history[i:i + 1], names) for i in range(len(history))]
        return [np.concatenate([row[k] for row in rows]) for k in range(len(names))]


class TvmSession:
    """A library compiled by TVM for the ``tvm-aarch64`` target, run by TVM's Relax VM one history
    a call: it was compiled for a static input shape (batch 1, the lookback), and predict passes
    exactly the lookback's newest rows."""

    def __init__(self, path: Path, names: list[str]):
        try:
            import tvm
            from tvm import relax
        except ImportError:
            raise ConfigError(f"{path}: installed for the tvm-aarch64 target, but TVM is not installed here: "
                              "pip install 'onnxcast-edge[tvm]', or pull with --target aarch64") from None
        self.tvm, self.names = tvm, names
        self.vm = relax.VirtualMachine(tvm.runtime.load_module(os.fspath(path)), tvm.cpu())

    def run(self, names, feeds: dict) -> list[np.ndarray]:
        history, wanted = feeds[INPUT_NAME], [self.names.index(n) for n in names]
        rows = []
        for i in range(len(history)):
            result = self.vm["main"](self.tvm.runtime.tensor(np.ascontiguousarray(history[i:i + 1])))
            values = [result] if hasattr(result, "numpy") else list(result)
            rows.append([values[k].numpy() for k in wanted])
        return [np.concatenate([row[k] for row in rows]) for k in range(len(wanted))]
