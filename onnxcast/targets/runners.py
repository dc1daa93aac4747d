"""One runner per deployment target: given an ONNX file and a batch of histories, the target's outputs,
the environment they came from and a latency figure (marked "emulated, not a timing" under qemu).

``run_target`` never raises for a target that cannot run here: it returns a :class:`TargetRun` whose
status says ``unavailable`` (this host lacks qemu, the sysroot, the runtime, a GPU; or the runtime
crashed) or ``unsupported`` (the runtime cannot take this model), with the reason on one line.
Runtimes other than the pipeline's own ONNX Runtime run in child processes (``worker.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxcast.pipeline.sessions import onnx_session
from onnxcast.targets.declarations import (
    EMULATED_LATENCY_NOTE,
    OK,
    QEMU_CPU,
    UNAVAILABLE,
    UNSUPPORTED,
    Target,
    target,
)
from onnxcast.targets.sysroot import QEMU, ArmSysroot, default_sysroot, missing_tools
from onnxcast.targets.worker import environment

WORKER = Path(__file__).with_name("worker.py")
CROSS_CC = "aarch64-linux-gnu-gcc"
# TVM 0.27 takes a target as a dict (its CLI string form is gone)
TVM_TARGET = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": QEMU_CPU}
# ONNX operators TVM's Relax frontend has no import for (2026; PITFALLS.md): checked before compiling,
# so the reason is the operator, not a compiler traceback
TVM_UNSUPPORTED_OPS = ("LSTM", "GRU", "RNN", "Loop", "Scan")
# worker exit codes
EXIT_NO_RUNTIME, EXIT_MODEL_REFUSED = 4, 3


class TargetUnavailable(RuntimeError):
    """This host cannot run the target (a missing tool, sysroot or runtime, or a runtime crash)."""


class TargetUnsupported(RuntimeError):
    """The target's runtime cannot take this model."""


@dataclass
class TargetRun:
    """What one target did with one model: status, outputs per history, environment, latency."""

    target: str
    status: str
    reason: str = ""
    output_names: list[str] = field(default_factory=list)
    outputs: list[list[np.ndarray]] = field(default_factory=list)  # per history, in output_names order
    environment: dict = field(default_factory=dict)
    latency: dict = field(default_factory=dict)
    emulated: bool = False
    artifact_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    def evidence(self) -> dict:
        """The JSON-safe record of the run (no outputs)."""
        return {"target": self.target, "status": self.status, "reason": self.reason, "emulated": self.emulated,
                "environment": self.environment, "latency": self.latency, "artifact_bytes": self.artifact_bytes}


def run_target(name: str, model: str | Path, histories: list[np.ndarray], *, repeats: int = 5,
               sysroot: ArmSysroot | None = None, timeout_s: float = 1800.0, **options) -> TargetRun:
    """Run ``model`` on ``histories`` (float32 ``[batch, time, features]`` each) on target ``name``;
    ``options`` go to its runner (``batched=True``: OpenVINO on whole batches)."""
    declared = target(name)
    histories = [np.ascontiguousarray(h, dtype=np.float32) for h in histories]
    try:
        if not declared.validated_here:
            raise TargetUnavailable(f"{name} needs an NVIDIA GPU and {', '.join(declared.device_install)}: "
                                    "declared, unvalidated on this machine")
        runner = RUNNERS[name]
        return runner(declared, Path(model), histories, repeats=repeats, sysroot=sysroot or default_sysroot(),
                      timeout_s=timeout_s, **options)
    except TargetUnavailable as exc:
        return TargetRun(name, UNAVAILABLE, str(exc), emulated=declared.emulated)
    except TargetUnsupported as exc:
        return TargetRun(name, UNSUPPORTED, str(exc), emulated=declared.emulated)


def run_x86_64(declared: Target, model: Path, histories: list[np.ndarray], *, repeats: int, **_) -> TargetRun:
    """The pipeline's own ONNX Runtime session, in this process: the reference of every other target."""
    import onnxruntime as ort

    session = onnx_session(model)
    names = [o.name for o in session.get_outputs()]
    outputs, times = [], []
    for history in histories:
        outputs.append(list(session.run(names, {"history": history})))
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            session.run(names, {"history": history})
            runs.append((time.perf_counter() - start) * 1000.0)
        times.append(runs)
    return TargetRun(declared.name, OK, output_names=names, outputs=outputs,
                     environment={**environment({"onnxruntime": ort.__version__, "numpy": np.__version__}),
                                  "emulated": False},
                     latency=latency_summary(histories, times, emulated=False), artifact_bytes=model.stat().st_size)


def run_openvino(declared: Target, model: Path, histories: list[np.ndarray], *, repeats: int, timeout_s: float,
                 batched: bool = False, **_) -> TargetRun:
    """OpenVINO's CPU device on this machine's Python, in a child process (a crash in
    ``compile_model`` is the target unavailable, not this process gone). One row per inference where
    the history has features, unless ``batched`` (OpenVINO 2026.4.1 miscomputes batches of those
    graphs: worker.openvino_runner)."""
    runtime = "openvino-batched" if batched else "openvino"
    names, outputs, times, env = run_worker([sys.executable, "-I", str(WORKER)], runtime, model, histories,
                                            repeats, timeout_s)
    return TargetRun(declared.name, OK, output_names=names, outputs=outputs, environment={**env, "emulated": False},
                     latency=latency_summary(histories, times, emulated=False), artifact_bytes=model.stat().st_size)


def run_aarch64(declared: Target, model: Path, histories: list[np.ndarray], *, repeats: int, sysroot: ArmSysroot,
                timeout_s: float) -> TargetRun:
    """ONNX Runtime's aarch64 wheel under qemu-user, in Debian's arm64 python3.11."""
    command = emulated_python(sysroot)
    names, outputs, times, env = run_worker(command, "onnxruntime", model, histories, repeats, timeout_s,
                                            site=[sysroot.site])
    return TargetRun(declared.name, OK, output_names=names, outputs=outputs,
                     environment={**env, **emulation_facts()}, emulated=True,
                     latency=latency_summary(histories, times, emulated=True), artifact_bytes=model.stat().st_size)


def run_tvm_aarch64(declared: Target, model: Path, histories: list[np.ndarray], *, repeats: int,
                    sysroot: ArmSysroot, timeout_s: float, keep: Path | None = None) -> TargetRun:
    """TVM's Relax ONNX frontend, cross-compiled for aarch64 (one library per input shape), run by TVM's
    aarch64 runtime under qemu-user. ``keep``: a folder the compiled libraries are copied into
    (``b<batch>_t<time>.so``: the target's artifacts)."""
    refused = tvm_refusal(model)
    if refused:
        raise TargetUnsupported(refused)
    no_tvm = "apache-tvm is not installed here (pip install apache-tvm==0.27.0.post1)"
    installed = importlib.util.find_spec("tvm") is not None  # the compiler runs in a child process: not loaded here
    try:
        command = emulated_python(sysroot, tvm=True)
    except TargetUnavailable as exc:  # everything missing is named, in one line
        raise TargetUnavailable(str(exc) if installed else f"{exc}; and {no_tvm}") from None
    if not installed:
        raise TargetUnavailable(no_tvm)
    if shutil.which(CROSS_CC) is None:
        raise TargetUnavailable(f"{CROSS_CC} not found (apt-get install gcc-aarch64-linux-gnu; make arm-tools)")
    with tempfile.TemporaryDirectory(prefix="onnxcast-tvm-") as tmp:
        libraries = Path(tmp) / "libraries"
        shapes = sorted({tuple(int(d) for d in h.shape) for h in histories})
        done = subprocess.run([sys.executable, "-I", str(WORKER), "compile-tvm", str(model), str(libraries),
                               json.dumps([list(s) for s in shapes]), json.dumps(TVM_TARGET), CROSS_CC],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise TargetUnsupported(f"TVM cannot compile {model.name}: {last_line(done.stderr or done.stdout)}")
        size = sum(p.stat().st_size for p in libraries.glob("*.so"))
        if keep is not None:
            shutil.copytree(libraries, keep, dirs_exist_ok=True)
        names, outputs, times, env = run_worker(command, "tvm", libraries, histories, repeats, timeout_s,
                                                site=[sysroot.tvm_site, sysroot.site])
    return TargetRun(declared.name, OK, output_names=names, outputs=outputs,
                     environment={**env, **emulation_facts(), "compiled_for": dict(TVM_TARGET),
                                  "static_shapes": [list(s) for s in shapes]},
                     emulated=True, latency=latency_summary(histories, times, emulated=True), artifact_bytes=size)


RUNNERS = {"x86_64": run_x86_64, "openvino": run_openvino, "aarch64": run_aarch64, "tvm-aarch64": run_tvm_aarch64}


def tvm_refusal(model: Path) -> str:
    """Why TVM's frontend cannot import ``model`` ("" when it can): an operator it has no import for."""
    import onnx

    ops = {node.op_type for node in onnx.load(str(model), load_external_data=False).graph.node}
    found = sorted(ops & set(TVM_UNSUPPORTED_OPS))
    if found:
        return (f"TVM's Relax ONNX frontend (apache-tvm 0.27) has no import for {', '.join(found)} "
                f"({model.name})")
    return ""


def emulated_python(sysroot: ArmSysroot, tvm: bool = False) -> list[str]:
    """The command that runs the sysroot's python3.11 under qemu-user in a private mount namespace,
    with the Arm cpuinfo over /proc/cpuinfo and an empty /sys/devices/system/cpu (ONNX Runtime's
    cpuinfo crashes on the host's x86 ones: PITFALLS.md). Refuses in one line when anything is missing."""
    missing = [t for t in missing_tools() if t != "apt-get"]
    if missing:
        raise TargetUnavailable(f"{', '.join(missing)} not found: the aarch64 targets need qemu-user-static "
                                "(apt-get install qemu-user-static; make arm-tools)")
    if not sysroot.is_complete(tvm=tvm):
        raise TargetUnavailable(f"no complete Arm sysroot at {sysroot.path}: build it with "
                                f"`python scripts/arm_sysroot.py{' --tvm' if tvm else ''}`")
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
    mounts = 'mount --bind "$1" /proc/cpuinfo && mount -t tmpfs none /sys/devices/system/cpu && shift && exec "$@"'
    return [*unshare, "sh", "-c", mounts, "sh", str(sysroot.cpuinfo), QEMU, "-L", str(sysroot.root),
            "-cpu", QEMU_CPU, str(sysroot.python), "-I", str(WORKER)]


def emulation_unavailable(tvm: bool = False) -> str:
    """Why the emulated aarch64 targets cannot run on this host ("" when they can): qemu-user or
    the Arm sysroot (with TVM's wheels for ``tvm``) missing."""
    try:
        emulated_python(default_sysroot(), tvm=tvm)
    except TargetUnavailable as exc:
        return str(exc)
    return ""


def emulation_facts() -> dict:
    """The emulator and the real processor under it."""
    qemu = subprocess.run([QEMU, "--version"], capture_output=True, text=True, check=False).stdout
    host = environment({})
    return {"emulated": True, "emulator": qemu.splitlines()[0] if qemu else QEMU, "qemu_cpu": QEMU_CPU,
            "host_machine": platform.machine(), "host_cpu_model": host["cpu_model"]}


def run_worker(command: list[str], runtime: str, model: Path, histories: list[np.ndarray], repeats: int,
               timeout_s: float, site: list[Path] = ()) -> tuple[list[str], list[list[np.ndarray]], list, dict]:
    """``worker.py`` in a child process: ``(output names, outputs per history, times, environment)``."""
    with tempfile.TemporaryDirectory(prefix="onnxcast-target-") as tmp:
        inputs, result = Path(tmp) / "inputs.npz", Path(tmp) / "outputs.npz"
        np.savez(inputs, **{f"in_{i}": h for i, h in enumerate(histories)})
        sites = ["--site", os.pathsep.join(str(s) for s in site)] if site else []
        try:
            done = subprocess.run([*command, *sites, runtime, str(model), str(inputs), str(result), str(repeats)],
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise TargetUnavailable(f"{runtime} did not finish within {timeout_s:.0f} s") from None
        if done.returncode < 0:
            raise TargetUnavailable(f"{runtime} crashed ({signal.Signals(-done.returncode).name}): "
                                    f"{last_line(done.stderr)}")
        if done.returncode == EXIT_MODEL_REFUSED:
            raise TargetUnsupported(f"{runtime} cannot load {model.name}: {last_line(done.stderr)}")
        if done.returncode != 0:
            raise TargetUnavailable(f"{runtime} failed (exit {done.returncode}): {last_line(done.stderr)}")
        report = json.loads(done.stdout.strip().splitlines()[-1])
        names = report["outputs"]
        with np.load(result) as data:
            outputs = [[data[f"out_{i}_{n}"] for n in names] for i in range(len(histories))]
    return names, outputs, report["latency_ms"], report["environment"]


def latency_summary(histories: list[np.ndarray], times: list[list[float]], *, emulated: bool) -> dict:
    """p50/p95 ms per history shape; under emulation the figures stay, marked as no timing."""
    rows = [{"batch": int(h.shape[0]), "time": int(h.shape[1]),
             "p50_ms": float(np.percentile(t, 50)) if t else None,
             "p95_ms": float(np.percentile(t, 95)) if t else None} for h, t in zip(histories, times, strict=True)]
    return {"note": EMULATED_LATENCY_NOTE if emulated else "", "per_shape": rows}


def last_line(text: str) -> str:
    """The last non-empty line of a child's output, clipped: what a one-line reason quotes."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return (lines[-1] if lines else "no output")[-300:]

