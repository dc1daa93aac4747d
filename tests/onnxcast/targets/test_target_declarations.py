"""The declared deployment targets, and how a target that cannot run here says so."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxcast.targets import worker
from onnxcast.targets.declarations import (
    EMULATED_LATENCY_NOTE,
    TARGETS,
    UNAVAILABLE,
    UNSUPPORTED,
    UnknownTargetError,
    parse_targets,
)
from onnxcast.targets.runners import (
    EXIT_MODEL_REFUSED,
    EXIT_NO_RUNTIME,
    RUNNERS,
    TargetUnavailable,
    TargetUnsupported,
    latency_summary,
    run_target,
    run_worker,
)
from onnxcast.targets.sysroot import ArmSysroot

REPO = Path(__file__).resolve().parents[3]
HISTORY = [np.zeros((1, 8, 1), np.float32)]


def test_the_issue_targets_are_declared_and_only_gpu_ones_stay_unvalidated():
    assert list(TARGETS) == ["x86_64", "aarch64", "openvino", "tvm-aarch64", "cuda", "tensorrt"]
    assert {n for n, t in TARGETS.items() if not t.validated_here} == {"cuda", "tensorrt"}
    assert set(RUNNERS) == {n for n, t in TARGETS.items() if t.validated_here}
    assert {n for n, t in TARGETS.items() if t.emulated} == {"aarch64", "tvm-aarch64"}
    for name in ("cuda", "tensorrt", "tvm-aarch64"):
        assert TARGETS[name].recipe, f"{name} needs its exact build recipe"
    assert "lstm" not in TARGETS["tvm-aarch64"].families


def test_every_device_install_is_pinned_and_matches_the_lock():
    lock = dict(line.split("==", 1) for line in (REPO / "requirements/constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for t in TARGETS.values():
        for requirement in t.device_install:
            name, _, version = requirement.partition("==")
            assert re.fullmatch(r"[0-9][0-9a-z.]*", version), f"{t.name}: {requirement} is not pinned"
            if name in lock:  # the runtimes onnxcast itself installs: the device gets the same build
                assert lock[name] == version, f"{t.name} pins {requirement}, the lock has {lock[name]}"
    assert lock["openvino"] == "2026.4.1"


def test_targets_parse_in_order_without_duplicates_and_default_to_x86():
    assert [t.name for t in parse_targets("")] == ["x86_64"]
    assert [t.name for t in parse_targets("openvino, x86_64,openvino")] == ["openvino", "x86_64"]
    with pytest.raises(UnknownTargetError, match="'riscv64'.*declared are x86_64, aarch64"):
        parse_targets("x86_64,riscv64")


def test_a_gpu_target_is_recorded_unvalidated_with_its_recipe(tmp_path):
    run = run_target("tensorrt", tmp_path / "m.onnx", HISTORY)
    assert run.status == UNAVAILABLE and not run.ok
    assert "NVIDIA GPU" in run.reason and "tensorrt-cu12==" in run.reason and "unvalidated" in run.reason
    assert run.outputs == [] and run.evidence()["status"] == UNAVAILABLE


@pytest.mark.parametrize("name", ["aarch64", "tvm-aarch64"])
def test_an_emulated_target_without_its_sysroot_refuses_in_one_line(tmp_path, name):
    empty = ArmSysroot(tmp_path / "no-sysroot")
    run = run_target(name, _tiny_model(tmp_path), HISTORY, sysroot=empty)
    assert run.status == UNAVAILABLE and run.emulated
    assert "\n" not in run.reason
    assert ("qemu-user-static" in run.reason) or (str(empty.path) in run.reason and "arm_sysroot.py" in run.reason)


def test_tvm_refuses_a_recurrent_graph_naming_the_operator(tmp_path):
    lstm = helper.make_graph(
        [helper.make_node("LSTM", ["history", "w", "r"], ["y"], hidden_size=2)], "g",
        [helper.make_tensor_value_info("history", TensorProto.FLOAT, [8, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [1, 8, 1], [0.0] * 8),
         helper.make_tensor("r", TensorProto.FLOAT, [1, 8, 2], [0.0] * 16)])
    path = tmp_path / "lstm.onnx"
    onnx.save(helper.make_model(lstm), path)
    run = run_target("tvm-aarch64", path, HISTORY)
    assert run.status == UNSUPPORTED
    assert "no import for LSTM" in run.reason and "lstm.onnx" in run.reason


def test_a_runtime_crash_in_the_child_is_the_target_unavailable_not_this_process(tmp_path):
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGFPE)"]
    with pytest.raises(TargetUnavailable, match=r"openvino crashed \(SIGFPE\)"):
        run_worker(crash, "openvino", _tiny_model(tmp_path), HISTORY, 1, 60)


def test_a_model_the_runtime_refuses_is_unsupported_and_a_missing_runtime_unavailable(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx file")
    child = [sys.executable, "-I", worker.__file__]
    with pytest.raises(TargetUnsupported, match="onnxruntime cannot load broken.onnx"):
        run_worker(child, "onnxruntime", broken, HISTORY, 1, 120)
    assert (worker.EXIT_MODEL_REFUSED, worker.EXIT_NO_RUNTIME) == (EXIT_MODEL_REFUSED, EXIT_NO_RUNTIME)


def test_emulated_latency_is_marked_as_no_timing():
    histories = [np.zeros((2, 8, 1), np.float32)]
    assert latency_summary(histories, [[1.0, 3.0]], emulated=True)["note"] == EMULATED_LATENCY_NOTE
    native = latency_summary(histories, [[1.0, 3.0]], emulated=False)
    assert native["note"] == "" and native["per_shape"][0] == {"batch": 2, "time": 8, "p50_ms": 2.0, "p95_ms": 2.9}


def _tiny_model(folder: Path) -> Path:
    """history [batch, time, 1] -> forecast = history's last step, twice (a 2-step horizon)."""
    graph = helper.make_graph(
        [helper.make_node("Slice", ["history", "start", "end", "axis"], ["last"]),
         helper.make_node("Reshape", ["last", "shape"], ["one"]),
         helper.make_node("Concat", ["one", "one"], ["forecast"], axis=1)], "g",
        [helper.make_tensor_value_info("history", TensorProto.FLOAT, ["batch", "time", 1])],
        [helper.make_tensor_value_info("forecast", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor("start", TensorProto.INT64, [1], [-1]),
         helper.make_tensor("end", TensorProto.INT64, [1], [2**62]),
         helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
         helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 1])])
    path = folder / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path
