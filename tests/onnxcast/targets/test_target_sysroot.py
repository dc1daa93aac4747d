"""The Arm sysroot of the emulated targets: built once with its pins, never left half made, and the
runners refuse in one line without it or without qemu."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxcast.targets import runners, sysroot
from onnxcast.targets.declarations import UNAVAILABLE
from onnxcast.targets.runners import run_target
from onnxcast.targets.sysroot import (
    ArmSysroot,
    SysrootError,
    build_sysroot,
    default_sysroot,
    expected_record,
)


def complete(path, tvm=False) -> ArmSysroot:
    root = ArmSysroot(path)
    root.path.mkdir(parents=True)
    (root.path / sysroot.RECORD).write_text(json.dumps(expected_record(tvm)))
    return root


def test_a_complete_sysroot_with_the_same_pins_is_left_as_it_is(tmp_path, monkeypatch):
    root = complete(tmp_path / "arm")
    monkeypatch.setattr(sysroot, "_download_debs", lambda *a: pytest.fail("downloaded again"))
    messages = []
    assert build_sysroot(root, log=messages.append) == root
    assert messages == [f"sysroot {root.path} is complete: nothing to do"]
    assert root.is_complete() and not root.is_complete(tvm=True)  # TVM's runtime was not asked for


def test_changed_pins_make_the_sysroot_incomplete(tmp_path, monkeypatch):
    root = complete(tmp_path / "arm", tvm=True)
    assert root.is_complete(tvm=True) and root.is_complete()
    monkeypatch.setitem(sysroot.DEBIAN_PACKAGES, "python3.11", "3.11.2-6+deb12u99")
    assert not root.is_complete()


def test_a_failed_build_leaves_neither_a_sysroot_nor_its_staging_folder(tmp_path, monkeypatch):
    def no_mirror(folder, log):
        raise SysrootError("apt-get update failed (exit 100): could not resolve deb.debian.org")

    monkeypatch.setattr(sysroot, "_download_debs", no_mirror)
    monkeypatch.setattr(sysroot, "missing_tools", lambda: [])
    with pytest.raises(SysrootError, match="could not resolve"):
        build_sysroot(ArmSysroot(tmp_path / "targets" / "arm"), log=lambda _: None)
    assert list((tmp_path / "targets").iterdir()) == []


def test_the_sysroot_lives_under_onnxcast_home_unless_its_variable_names_one(tmp_path, monkeypatch):
    monkeypatch.delenv("ONNXCAST_ARM_SYSROOT", raising=False)
    assert default_sysroot(tmp_path).path == tmp_path / "targets" / "aarch64-py311"
    monkeypatch.setenv("ONNXCAST_ARM_SYSROOT", str(tmp_path / "elsewhere"))
    assert default_sysroot(tmp_path).path == tmp_path / "elsewhere"


def test_without_qemu_the_arm_targets_refuse_in_one_line_naming_the_package(tmp_path, monkeypatch):
    monkeypatch.setattr(runners, "missing_tools", lambda: ["qemu-aarch64-static"])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["history"], ["forecast"])], "g",
        [helper.make_tensor_value_info("history", TensorProto.FLOAT, ["batch", "time", 1])],
        [helper.make_tensor_value_info("forecast", TensorProto.FLOAT, ["batch", "time", 1])])), model)
    for name in ("aarch64", "tvm-aarch64"):
        run = run_target(name, model, [np.zeros((1, 8, 1), np.float32)],
                         sysroot=complete(tmp_path / name, tvm=True))
        assert run.status == UNAVAILABLE
        assert run.reason.startswith("qemu-aarch64-static not found") and "apt-get install qemu-user-static" in run.reason
        assert "\n" not in run.reason
