"""The pipeline's deployment-target step on a real tiny run (DLinear on weekly CO2): each eligible
variant run and judged on x86_64 and OpenVINO (and, marked slow, aarch64 under qemu-user), the
report's per-variant and per-channel targets, the signed manifest's target fields, the setting."""

from __future__ import annotations

import json
import shutil

import pytest

from onnxcast.airflow.plugin.data import channel_targets
from onnxcast.base.errors import ConfigError, VerificationError
from onnxcast.base.files import read_json
from onnxcast.base.target_evidence import STATUSES, VALIDATED
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.registry.tracking import target_figures
from onnxcast.rollout.promote import check_manifest_shape, promote, verify_version
from onnxcast.rollout.store import open_store
from onnxcast.targets.declarations import EMULATED_LATENCY_NOTE
from onnxcast.targets.runners import emulation_unavailable
from onnxcast.targets.step import validate_on_target

TINY = {"horizon": 12, "lookback": 56, "max_epochs": 1, "models": ["dlinear"], "latency_repeats": 3,
        "model_name": "tiny-forecaster", "coverage_tolerance": 0.2, "targets": ["x86_64", "openvino"]}


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """A tiny DLinear run up to its validation (no report yet): the target step's input."""
    from real_series import weekly_co2_csv

    from onnxcast.pipeline import run as pipeline

    out = tmp_path_factory.mktemp("targets-run") / "run"
    cfg = PipelineConfig.from_dict({**TINY, "data_uri": weekly_co2_csv(), "out_dir": str(out)})
    pipeline.prepare_data(cfg)
    for step in (pipeline.train_family, pipeline.export_family, pipeline.optimize_family, pipeline.validate_family):
        step(cfg, "dlinear")
    return cfg


@pytest.fixture(scope="module")
def run(validated):
    """``validated`` run on x86_64 and OpenVINO by the target step, then its report."""
    from onnxcast.pipeline.run import assemble_report

    evidence = {name: validate_on_target(validated, "dlinear", name) for name in validated.targets}
    return validated, evidence, assemble_report(validated, ["dlinear"])


def eligible(report):
    return [v for v in report["models"][0]["variants"] if v.get("eligible")]


class TestTargetStep:
    def test_every_eligible_variant_is_judged_on_every_target(self, run):
        cfg, evidence, report = run
        assert report["targets"] == ["x86_64", "openvino"]
        assert eligible(report), "the tiny DLinear has no eligible variant"
        for variant in eligible(report):
            assert set(variant["targets"]) == {"x86_64", "openvino"}
            for record in variant["targets"].values():
                assert record["status"] in STATUSES
                assert set(record) >= {"status", "reason", "artifact", "sha256", "size_bytes", "parity", "holdout",
                                       "latency_ms", "latency_note", "environment"}
            assert (cfg.run_dir / variant["targets"]["openvino"]["artifact"]).exists()
        assert read_json(cfg.layout.target_evidence("dlinear", "openvino")) == evidence["openvino"]

    def test_openvino_matches_x86_and_pytorch_and_its_own_holdout(self, run):
        _, _, report = run
        fp32 = next(v for v in eligible(report) if v["name"] == "fp32")
        record = fp32["targets"]["openvino"]
        assert record["status"] == VALIDATED, record["reason"]
        assert record["parity"]["vs_x86"]["passed"] and record["parity"]["vs_torch"]["passed"]
        assert record["parity"]["vs_x86"]["max_diff_in_levels"] < 1e-5
        # the holdout from OpenVINO's own forecasts, judged by the validation's metric code
        assert record["holdout"]["judged"] and record["holdout"]["mae"] == pytest.approx(fp32["holdout"]["mae"], 1e-4)
        assert record["holdout"]["x86_mae"] == fp32["holdout"]["mae"]
        assert record["latency_ms"]["batch1_p50"] > 0 and record["latency_note"] is None
        assert "openvino" in record["environment"]["runtimes"] and record["size_bytes"] == fp32["size_bytes"]
        x86 = fp32["targets"]["x86_64"]
        assert x86["status"] == VALIDATED and x86["holdout"]["mae"] == fp32["holdout"]["mae"]
        assert x86["environment"]["runtimes"]["onnxruntime"]

    def test_each_channel_names_the_variant_it_runs_on_each_target(self, run):
        _, _, report = run
        for choice in report["selected"].values():
            assert set(choice["targets"]) | set(choice["targets_missing"]) == {"x86_64", "openvino"}
            for name, pick in choice["targets"].items():
                variant = next(v for v in eligible(report) if v["name"] == pick["variant"])
                assert variant["targets"][name]["status"] == VALIDATED
                assert pick["variant"] in (choice["variant"], "fp32")

    def test_a_declared_gpu_target_is_unvalidated_with_its_recipe(self, validated):
        evidence = validate_on_target(validated, "dlinear", "cuda")
        for record in evidence["variants"].values():
            assert record["status"] == "unvalidated" and "GPU" in record["reason"]
            assert any("CUDAExecutionProvider" in step for step in record["recipe"])

    def test_the_manifest_carries_each_target_signed(self, run, tmp_path):
        cfg, _, report = run
        folder = tmp_path / "run"
        shutil.copytree(cfg.run_dir, folder)
        store = str(tmp_path / "store")
        result = promote(folder / "report.json", store, "m", ["edge"], actor="ci", reason="targets")
        manifest, _ = verify_version(open_store(store), "m", result.version)  # every artifact's sha256
        for channel, choice in report["selected"].items():
            targets = manifest["channels"][channel]["targets"]
            assert set(targets) == set(choice["targets"])
            for name, pick in targets.items():
                assert (pick["family"], pick["variant"]) == (choice["family"], choice["targets"][name]["variant"])
                entry = manifest["artifacts"][pick["artifact"]]["targets"][name]
                assert entry["status"] == VALIDATED
                assert set(entry["evidence"]) >= {"parity", "holdout", "latency_ms", "latency_note", "environment",
                                                  "size_bytes"}
        # the targets are inside the signed part: the envelope's signature covers them
        envelope = json.loads(open_store(store).read(open_store(store).version_key("m", result.version)))
        assert envelope["signatures"] and "targets" in json.dumps(envelope["signed"]["channels"])
        # the rollout page shows each channel's targets from the verified manifest
        shown = {t["name"]: t for t in channel_targets(manifest, "edge")}
        assert {n for n, t in shown.items() if t["status"] == VALIDATED} == set(report["selected"]["edge"]["targets"])
        assert shown["openvino"]["variant"] == report["selected"]["edge"]["targets"]["openvino"]["variant"]

    def test_mlflow_gets_each_targets_status_parity_and_latency(self, run):
        _, _, report = run
        metrics, tags = target_figures(report, "dlinear")
        for variant in eligible(report):
            for name, record in variant["targets"].items():
                prefix = f"{variant['name']}.target.{name}"
                assert metrics[f"{prefix}.validated"] == float(record["status"] == VALIDATED)
                assert tags[f"onnxcast.target.{name}.{variant['name']}"].startswith(record["status"])
            openvino = variant["targets"]["openvino"]
            if openvino["status"] == VALIDATED:
                prefix = f"{variant['name']}.target.openvino"
                assert metrics[f"{prefix}.vs_x86.max_diff_in_levels"] == openvino["parity"]["vs_x86"]["max_diff_in_levels"]
                assert metrics[f"{prefix}.latency_batch1_p50_ms"] == openvino["latency_ms"]["batch1_p50"]
                assert metrics[f"{prefix}.holdout_mae"] == openvino["holdout"]["mae"]


def test_an_unknown_target_is_refused_in_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"unknown target 'riscv'.*declared are x86_64, aarch64") as caught:
        PipelineConfig.from_dict({"data_uri": "x.csv", "out_dir": "out", "targets": "x86_64,riscv"})
    assert "\n" not in str(caught.value)
    cfg = PipelineConfig.from_dict({"data_uri": "x.csv", "out_dir": "out", "targets": " openvino,x86_64,openvino"})
    assert cfg.targets == ("openvino", "x86_64")
    assert PipelineConfig.from_dict({"data_uri": "x.csv", "out_dir": "out"}).targets == ("x86_64",)


def test_manifest_targets_are_checked_when_present():
    artifact = {"sha256": "ab" * 32, "size_bytes": 1}
    old = {"artifacts": {"a.onnx": artifact}, "channels": {"edge": {"artifact": "a.onnx", "family": "f", "variant": "v"}}}
    assert check_manifest_shape(old, "m") is old  # a manifest from before targets
    pick = {"artifact": "b.so", "family": "f", "variant": "v"}
    bad = {**old, "channels": {"edge": {**old["channels"]["edge"], "targets": {"tvm-aarch64": pick}}}}
    with pytest.raises(VerificationError, match="target 'tvm-aarch64' names artifact 'b.so'"):
        check_manifest_shape(bad, "m")
    no_evidence = {**old, "artifacts": {"a.onnx": {**artifact, "targets": {"x86_64": {"status": "validated"}}}}}
    with pytest.raises(VerificationError, match="targets without a status and evidence"):
        check_manifest_shape(no_evidence, "m")


@pytest.mark.slow
def test_aarch64_under_qemu_is_judged_like_every_target(validated):
    """ONNX Runtime's aarch64 wheel under qemu-user (Cortex-A72) on the same run: every eligible
    variant matches x86 and its holdout, its latency marked as no timing (make arm-tools)."""
    reason = emulation_unavailable()
    if reason:
        pytest.skip(reason)
    evidence = validate_on_target(validated, "dlinear", "aarch64")
    assert evidence["variants"]
    for name, record in evidence["variants"].items():
        assert record["status"] == VALIDATED, (name, record["reason"])
        assert record["parity"]["vs_x86"]["passed"] and record["parity"]["vs_x86"]["judged"]
        if name.startswith("fp32"):  # float kernels agree to rounding; int8 ones may differ by a step
            assert record["parity"]["vs_x86"]["max_diff_in_levels"] < 1e-5
        assert record["holdout"]["judged"] and record["holdout"]["passed"]
        assert record["latency_note"] == EMULATED_LATENCY_NOTE
        assert record["environment"]["machine"] == "aarch64" and record["environment"]["qemu_cpu"] == "cortex-a72"


@pytest.mark.slow
def test_tvm_libraries_become_the_artifacts_and_the_evidence_is_strict_json(validated):
    """TVM cross-compiled for aarch64 on the same run (skips without apache-tvm or the --tvm sysroot):
    a validated variant's artifact is its batch-1 library, and the evidence file is JSON that promote
    reads (a failed variant's infinite parity, seen from TVM's fp16, written as null)."""
    pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install apache-tvm==0.27.0.post1)")
    from onnxcast.base.untrusted import loads_json
    if emulation_unavailable(tvm=True):
        pytest.skip(emulation_unavailable(tvm=True))
    evidence = validate_on_target(validated, "dlinear", "tvm-aarch64")
    path = validated.layout.target_evidence("dlinear", "tvm-aarch64")
    assert loads_json(path.read_bytes(), what=str(path)) == evidence
    record = evidence["variants"]["fp32"]
    assert record["status"] == VALIDATED, record["reason"]
    assert record["artifact"].endswith(f"b1_t{validated.lookback}.so") and (validated.run_dir / record["artifact"]).is_file()
