"""An emulated aarch64 device (issue 33): Debian's arm64 python3.11 under qemu-user with the Arm
sysroot (onnxcast.targets.sysroot) and the device client's own dependencies as aarch64 wheels,
pinned by distributions/edge/constraints/aarch64.txt, runs ``onnxcast-edge pull`` and ``predict``:
refused for a manifest before targets (validated for x86_64 only), its aarch64 variant installed
from one that lists it, forecasting within the parity tolerance of the x86 device. Slow (qemu);
skips, saying why, where qemu, the sysroot or a package index cannot be had."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from rollout_support import publish_with_targets, random_forecaster

from onnxcast.rollout.edge import predict, pull
from onnxcast.rollout.promote import promote
from onnxcast.targets.runners import TargetUnavailable, emulated_python
from onnxcast.targets.sysroot import (
    QEMU,
    WHEEL_PLATFORMS,
    SysrootError,
    build_sysroot,
    default_sysroot,
    missing_tools,
)

REPO = Path(__file__).resolve().parents[3]
CONSTRAINTS = REPO / "distributions" / "edge" / "constraints" / "aarch64.txt"
# the client's dependencies beyond numpy and onnxruntime (the sysroot has those), as the device installs them
CLIENT = ("boto3", "tuf", "securesystemslib[crypto]", "cryptography")


def emulated_device() -> list[str]:
    """The command that runs a Python program (``-c CODE ARGS``) as the emulated aarch64 device."""
    if shutil.which(QEMU) is None:
        pytest.skip(f"{QEMU} not found: apt-get install qemu-user-static (make arm-tools)")
    if missing_tools():
        pytest.skip(f"{', '.join(missing_tools())} not found (make arm-tools)")
    try:
        sysroot = build_sysroot(default_sysroot(), log=lambda _: None)
        command = emulated_python(sysroot)[:-2]  # without "-I worker.py"
    except (SysrootError, TargetUnavailable) as exc:
        pytest.skip(f"no Arm sysroot: {exc}")
    return [*command, "-I", "-c", _program(sysroot.site, client_site(sysroot.path.parent))]


def client_site(folder: Path) -> Path:
    """The client's dependencies as aarch64 wheels for CPython 3.11, pinned by the device constraints,
    in a folder of their own next to the sysroot (built once per constraints file)."""
    digest = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:12]
    site = folder / f"aarch64-edge-client-{digest}"
    if site.is_dir():
        return site
    work = Path(tempfile.mkdtemp(prefix=".edge-client-", dir=folder))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--only-binary=:all:",
                           "--python-version", "3.11", "--implementation", "cp", "--target", str(work / "site"),
                           *[a for p in WHEEL_PLATFORMS for a in ("--platform", p)], "-c", str(CONSTRAINTS), *CLIENT],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        pytest.skip(f"cannot fetch the client's aarch64 wheels: {' '.join(done.stderr.split())[-200:]}")
    (work / "site").rename(site)
    shutil.rmtree(work, ignore_errors=True)
    return site


def _program(runtime_site: Path, client: Path) -> str:
    """``onnxcast-edge`` with the sysroot's numpy and ONNX Runtime, the client's wheels and the device
    distribution's modules (distributions/edge: only what a device installs) on the path."""
    paths = [str(runtime_site), str(client), str(REPO / "distributions" / "edge")]
    return (f"import sys; sys.path[:0] = {paths!r}; from onnxcast.rollout.cli import edge_main; "
            "sys.exit(edge_main(sys.argv[1:]))")


def run_device(command: list[str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *argv], capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "ONNXCAST_EDGE_TARGET": ""})


@pytest.mark.slow
def test_an_emulated_aarch64_device_pulls_its_variant_and_matches_x86(tmp_path, make_run, monkeypatch):
    device = emulated_device()
    monkeypatch.delenv("ONNXCAST_EDGE_TARGET", raising=False)
    store, arm = str(tmp_path / "store"), tmp_path / "arm"
    table = tmp_path / "in.csv"
    rng = np.random.default_rng(2)
    table.write_text("ds,y,x1\n" + "".join(f"2026-01-01T{h:02d}:00:00Z,{100 + 10 * np.sin(h / 3) + rng.normal():.4f},"
                                           f"{5 + rng.normal():.4f}\n" for h in range(20)))
    pull_args = ["pull", "--store", store, "--model", "m", "--channel", "edge", "--dest", str(arm)]

    promote(make_run("a", source=random_forecaster(tmp_path / "random.onnx")), store, "m", "edge", version="1")
    done = run_device(device, *pull_args)  # a manifest before targets: validated for x86_64 only
    assert done.returncode == 1, done.stderr
    assert "channel 'edge' has no variant validated for this device (its targets: aarch64; the channel's: " \
           "x86_64); refusing version 1 (nothing installed)" in done.stderr.splitlines()[-1]
    assert not (arm / "current").exists()

    publish_with_targets(store, "m", "edge", {"x86_64": "lstm-fp32-opt.onnx", "aarch64": "lstm-fp32.onnx"},
                         version="2")
    done = run_device(device, *pull_args)
    assert done.returncode == 0 and "installed version 2" in done.stdout, done.stderr
    assert "target aarch64 (ONNX Runtime's CPU target for aarch64)" in done.stdout
    status = json.loads(run_device(device, "status", "--dir", str(arm)).stdout)
    assert status["artifact"] == "lstm-fp32.onnx" and status["target"]["facts"]["machine"] == "aarch64"
    assert "asimd" in status["target"]["facts"]["cpu_flags"]
    done = run_device(device, "predict", "--dir", str(arm), "--input", str(table))
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))

    pull(store, "m", "edge", tmp_path / "x86", target="x86_64")
    x86 = predict(tmp_path / "x86", table, out=io.StringIO())
    got = np.array([[float(r["forecast"]) for r in rows]], dtype=np.float32)
    quantiles = np.array([[[float(r[c]) for c in r if c.startswith("q")] for r in rows]], dtype=np.float32)
    assert got.shape == x86.forecast.shape and quantiles.shape == x86.quantiles.shape
    for name, a, b in (("forecast", got, x86.forecast), ("quantiles", quantiles, x86.quantiles)):
        ratio = float(np.max(np.abs(a - b) / (1e-4 + 1e-3 * np.abs(b))))  # the pipeline's parity measure
        print(f"aarch64 vs x86 {name}: tolerance ratio {ratio:.3g}, max |diff| / level "
              f"{float(np.max(np.abs(a - b)) / np.mean(np.abs(x86.forecast))):.2g}")
        assert ratio <= 1
