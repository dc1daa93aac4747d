"""The device's deployment target (issue 33): the rule over the device's facts, the artifact a
channel's validated targets give it, the runtime predict runs it with, the refusals, and the
extras and constraints of a device install against onnxcast.targets.declarations."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from rollout_support import one_error_line, publish_with_targets, random_forecaster

from onnxcast.base.errors import ConfigError, RefusedError
from onnxcast.pipeline.validate import row_levels, tolerance_ratios
from onnxcast.rollout.cli import edge_main
from onnxcast.rollout.device_target import (
    DEVICE_TARGETS,
    DeviceFacts,
    choose,
    cpu_flags,
    preference,
    read_facts,
)
from onnxcast.rollout.edge import predict, pull
from onnxcast.rollout.promote import promote
from onnxcast.rollout.store import open_store
from onnxcast.targets.declarations import TARGETS

REPO = Path(__file__).resolve().parents[3]
ORT_ONLY = {"onnxruntime": "1.32.0"}
CPU = ("CPUExecutionProvider",)
needs_openvino = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed")


def facts(machine="x86_64", flags=("sse4_2", "avx2"), runtimes=None, providers=CPU) -> DeviceFacts:
    return DeviceFacts(machine, flags, dict(runtimes or ORT_ONLY), providers)


# --- the declarations a device carries --------------------------------------------------------

def test_device_targets_repeat_the_declarations():
    assert list(DEVICE_TARGETS) == list(TARGETS)
    for name, declared in TARGETS.items():
        device = DEVICE_TARGETS[name]
        assert (device.architecture, device.requirements) == (declared.architecture, declared.device_install)
        assert device.runtime in declared.runtime


def test_extras_pin_the_declared_runtimes():
    extras = tomllib.loads((REPO / "distributions/edge/pyproject.toml").read_text())["project"]["optional-dependencies"]
    with_extra = {t.extra: t for t in DEVICE_TARGETS.values() if t.extra}
    assert set(extras) == set(with_extra)
    for extra, target in with_extra.items():
        assert extras[extra] == [r for r in target.requirements if not r.startswith("numpy==")]


def test_constraints_files_are_generated_from_the_declarations():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from device_constraints import FOLDER, render
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert sorted(p.stem for p in FOLDER.glob("*.txt")) == sorted(TARGETS)
    for name, declared in TARGETS.items():
        text = (FOLDER / f"{name}.txt").read_text()
        assert text == render(declared), f"{name}.txt is stale: run python scripts/device_constraints.py"
        lines = text.splitlines()
        assert all(pin in lines for pin in declared.device_install)
        assert any(line.startswith("tuf==") for line in lines) and any(line.startswith("boto3==") for line in lines)


# --- the rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("device", "expected"), [
    (facts(runtimes={**ORT_ONLY, "openvino": "2026.4.1"}), ("openvino", "x86_64")),
    (facts(), ("x86_64",)),
    (facts(flags=(), runtimes={**ORT_ONLY, "openvino": "2026.4.1"}), ("x86_64",)),  # no SSE4.2: no OpenVINO CPU
    (facts("aarch64", ("asimd",), {**ORT_ONLY, "tvm": "0.27.0"}), ("tvm-aarch64", "aarch64")),
    (facts("aarch64", ("asimd",), {**ORT_ONLY, "openvino": "2026.4.1"}), ("aarch64",)),
    (facts(runtimes={**ORT_ONLY, "openvino": "2026.4.1"}, providers=("TensorrtExecutionProvider",
                                                                      "CUDAExecutionProvider", *CPU)),
     ("tensorrt", "cuda", "openvino", "x86_64")),
    (facts("riscv64", ()), ()),
])
def test_the_preference_rule(device, expected, monkeypatch):
    monkeypatch.delenv("ONNXCAST_EDGE_TARGET", raising=False)
    prefer = preference(device)
    assert prefer.targets == expected and set(prefer.reasons) == set(expected)


def test_overrides_are_checked(monkeypatch):
    with pytest.raises(ConfigError, match=r"unknown target 'arm': declared are x86_64, aarch64, openvino"):
        preference(facts(), "arm")
    with pytest.raises(ConfigError, match="target 'aarch64' runs on aarch64, this device is x86_64"):
        preference(facts(), "aarch64")
    with pytest.raises(ConfigError, match=r"target 'openvino' needs the openvino runtime on this device: "
                                          r"pip install 'onnxcast-edge\[openvino\]'"):
        preference(facts(), "openvino")
    monkeypatch.setenv("ONNXCAST_EDGE_TARGET", "x86_64")
    prefer = preference(facts(runtimes={**ORT_ONLY, "openvino": "2026.4.1"}))
    assert (prefer.targets, prefer.override) == (("x86_64",), "x86_64")


def test_facts_of_this_machine_and_of_an_arm_cpuinfo(tmp_path):
    from onnxcast.targets.sysroot import ARM_CPUINFO

    here = read_facts()
    assert here.machine in ("x86_64", "aarch64") and "onnxruntime" in here.runtimes
    assert "CPUExecutionProvider" in here.providers
    (tmp_path / "cpuinfo").write_text(ARM_CPUINFO)
    assert cpu_flags(str(tmp_path / "cpuinfo")) == ("asimd",)


def test_a_manifest_before_targets_counts_for_x86_64_only(tmp_path, make_run):
    store = open_store(str(tmp_path / "store"))
    promote(make_run("a"), store, "m", "edge", version="1")
    manifest = store.read_manifest("m", "1")
    where = store.url(store.version_key("m", "1"))
    arm = preference(facts("aarch64", ("asimd",)))
    with pytest.raises(RefusedError, match=r"channel 'edge' has no variant validated for this device \(its targets: "
                                           r"aarch64; the channel's: x86_64\); refusing version 1"):
        choose(manifest, "edge", arm, where)
    chosen = choose(manifest, "edge", preference(facts(runtimes={**ORT_ONLY, "openvino": "2026.4.1"})), where)
    assert (chosen.target, chosen.artifact, chosen.fallback) == ("x86_64", "lstm-fp32-opt.onnx", False)


# --- pull and predict on this machine ---------------------------------------------------------

@pytest.fixture
def fleet_csv(tmp_path) -> Path:
    """Three series of 30 hourly rows of y and x1 (the model reads 16 of each): batches above 1."""
    rng = np.random.default_rng(1)
    lines = ["id,ds,y,x1"] + [f"s{s},2026-01-01T{i % 24:02d}:00:00Z,{100 + 10 * np.sin(i / 3 + s) + rng.normal():.4f},"
                              f"{5 + rng.normal():.4f}" for s in range(3) for i in range(30)]
    path = tmp_path / "fleet.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _within_parity(got: np.ndarray, reference: np.ndarray, levels: np.ndarray, rtol: float = 1e-3,
                   atol: float = 1e-4) -> float:
    """The pipeline's parity measure (onnxcast.pipeline.validate.tolerance_ratios, at the rows'
    forecast ``levels``): <= 1 passes."""
    return float(np.max(tolerance_ratios(got, reference, levels, rtol, atol)))


@needs_openvino
def test_an_openvino_device_pulls_its_variant_and_matches_x86(tmp_path, make_run, fleet_csv, capsys, monkeypatch):
    monkeypatch.delenv("ONNXCAST_EDGE_TARGET", raising=False)
    store = str(tmp_path / "store")
    promote(make_run("a", source=random_forecaster(tmp_path / "random.onnx")), store, "m", "edge", version="1")
    publish_with_targets(store, "m", "edge", {"x86_64": "lstm-fp32-opt.onnx", "openvino": "lstm-fp32.onnx"},
                         version="2")
    ov_dest, x86_dest = tmp_path / "ov", tmp_path / "x86"
    result = pull(store, "m", "edge", ov_dest)
    assert (result.version, result.target) == ("2", "openvino") and "openvino 2026.4.1 installed" in result.why
    assert pull(store, "m", "edge", x86_dest, target="x86_64").target == "x86_64"
    assert not pull(store, "m", "edge", ov_dest).changed  # the same device, the same choice
    # a server, the monitor, a model repository: the channel's own artifact, whatever the machine has
    server = pull(store, "m", "edge", tmp_path / "server", channel_artifact=True)
    served = json.loads((tmp_path / "server" / "current" / "pulled.json").read_text())
    assert (server.target, served["artifact"]) == ("x86_64", "lstm-fp32-opt.onnx")
    assert not pull(store, "m", "edge", tmp_path / "server", channel_artifact=True).changed
    ov = predict(ov_dest, fleet_csv, out=io.StringIO(), series_column="id")
    x86 = predict(x86_dest, fleet_csv, out=io.StringIO(), series_column="id")
    assert ov.forecast.shape == (3, 4) and ov.quantiles.shape == (3, 4, 5)
    for name, got, reference in (("forecast", ov.forecast, x86.forecast), ("quantiles", ov.quantiles, x86.quantiles)):
        ratio = _within_parity(got, reference, row_levels(x86.forecast))
        with capsys.disabled():  # the figures, shown with pytest -s
            print(f"openvino vs x86 {name}: tolerance ratio {ratio:.3g}, max |diff| / level "
                  f"{float(np.max(np.abs(got - reference)) / np.mean(np.abs(x86.forecast))):.2g}")
        assert ratio <= 1

    # the same folder where openvino cannot be imported: refused in one line naming the extra
    code = ("import sys; sys.modules['openvino'] = None; from onnxcast.rollout.cli import edge_main; "
            "sys.exit(edge_main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "predict", "--dir", str(ov_dest), "--input", str(fleet_csv),
                           "--series-column", "id"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "installed for the openvino target, but openvino is not installed here: pip install " \
           "'onnxcast-edge[openvino]', or pull with --target x86_64" in done.stderr

    assert edge_main(["status", "--dir", str(ov_dest)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["artifact"] == "lstm-fp32.onnx" and status["channel_artifact"] == "lstm-fp32-opt.onnx"
    assert status["target"]["name"] == "openvino" and status["target"]["runtime"] == "openvino"
    assert status["target"]["preference"] == ["openvino", "x86_64"] and "sse4_2" in status["target"]["facts"]["cpu_flags"]


def test_fallback_to_the_portable_fp32_and_refusals(tmp_path, make_run, monkeypatch, capsys):
    monkeypatch.delenv("ONNXCAST_EDGE_TARGET", raising=False)
    store, dest = str(tmp_path / "store"), tmp_path / "device"
    promote(make_run("a"), store, "m", "edge", version="1")
    assert pull(store, "m", "edge", dest).target == "x86_64"  # a manifest before targets: x86_64

    # the channel's variant is validated for aarch64 only; its family's fp32 for x86_64 too: the fallback
    publish_with_targets(store, "m", "edge", {"aarch64": "lstm-fp32-opt.onnx"}, version="2",
                         evidence={"lstm-fp32-opt.onnx": {"aarch64": "validated", "x86_64": "failed"},
                                   "lstm-fp32.onnx": {"x86_64": "validated", "openvino": "unvalidated"}})
    result = pull(store, "m", "edge", dest)
    installed = json.loads((dest / "current" / "pulled.json").read_text())
    assert (result.version, result.target, installed["artifact"]) == ("2", "x86_64", "lstm-fp32.onnx")
    assert installed["target"]["fallback"] is True and "portable fp32" in installed["target"]["why"]

    # nothing validated for this device's class: refused, version 2 keeps serving
    publish_with_targets(store, "m", "edge", {"aarch64": "lstm-fp32-opt.onnx"}, version="3",
                         evidence={"lstm-fp32-opt.onnx": {"aarch64": "validated"},
                                   "lstm-fp32.onnx": {"aarch64": "validated", "x86_64": "failed"}})
    with pytest.raises(RefusedError, match=r"channel 'edge' has no variant validated for this device \(its targets: "
                                           r".*x86_64; the channel's: aarch64\); refusing version 3 \(still serving "
                                           r"version 2\)"):
        pull(store, "m", "edge", dest)
    assert (dest / "current").readlink().as_posix() == "versions/2"
    assert not [p for p in dest.iterdir() if p.name.startswith(".staging")]
    # a target named but not validated for the channel
    with pytest.raises(RefusedError, match=r"target 'x86_64' \(named by --target or ONNXCAST_EDGE_TARGET\) is not "
                                           r"validated for channel 'edge' \(validated: aarch64\)"):
        pull(store, "m", "edge", dest, target="x86_64")
    # an unknown target: one line, exit 2, nothing created
    assert edge_main(["pull", "--store", store, "--model", "m", "--channel", "edge", "--dest",
                      str(tmp_path / "other"), "--target", "arm"]) == 2
    one_error_line(capsys, "unknown target 'arm': declared are x86_64, aarch64, openvino, tvm-aarch64, cuda, tensorrt")
    assert not (tmp_path / "other").exists()


def test_the_device_package_does_not_import_the_targets_package():
    code = ("import sys, onnxcast.rollout.edge, onnxcast.rollout.cli; "
            "print([m for m in sys.modules if m.startswith('onnxcast.targets') or m in ('openvino', 'tvm')])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
