"""The pipeline's deployment-target step: every eligible variant of a family run on one target and
judged there, after the family's validation (docs/targets.md, "In the pipeline").

Per variant: the target's outputs on the validation's parity histories against x86 ONNX Runtime's and
the eager PyTorch model's (onnxcast.targets.parity, the pipeline's tolerances), its holdout accuracy
from its own forecasts on the holdout windows (``validate.judge_holdout``, the validation's metric
code), latency, size and environment. Written to ``models/<family>/targets/<target>.json``
(``RunLayout.target_evidence``), one file per family and target, so targets run apart (one Airflow
mapped task each) and report.json gathers them (``pipeline.report.attach_targets``).

``x86_64`` is the pipeline's own validation: its record is the validation's figures
(``base.target_evidence.reference_record``), nothing runs again.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from onnxcast.base.contract import OUTPUT_NAME
from onnxcast.base.files import json_safe, read_json, sha256_file, write_json
from onnxcast.base.target_evidence import (
    FAILED,
    REFERENCE_TARGET,
    UNVALIDATED,
    VALIDATED,
    holdout_figures,
    reference_record,
)
from onnxcast.pipeline.checkpoint import load_model
from onnxcast.pipeline.fleet_data import ACROSS_SERIES, load_split
from onnxcast.pipeline.fleet_eval import AcrossSeries
from onnxcast.pipeline.run import judging, load_baselines
from onnxcast.pipeline.validate import FP32_VARIANTS, PARITY_RULE, OverOrigins, judge_holdout
from onnxcast.targets.declarations import Target, target
from onnxcast.targets.parity import compare_runs, compare_with_torch
from onnxcast.targets.runners import TargetRun, run_target
from onnxcast.targets.worker import environment

log = logging.getLogger(__name__)

TVM = "tvm-aarch64"


def validate_on_target(cfg, family: str, name: str) -> dict:
    """Run and judge every eligible variant of ``family`` on target ``name``; write and return
    ``{"target", "family", "declaration", "variants": {variant: record}}``."""
    declared = target(name)
    validation = read_json(cfg.layout.validation(family))
    eligible = [v for v in validation["variants"] if v.get("eligible") is True]
    if name == REFERENCE_TARGET:
        import onnxruntime as ort

        env = {**environment({"onnxruntime": ort.__version__, "numpy": np.__version__}), "emulated": False,
               "derived_from": "the variant's validation (ONNX Runtime's CPU provider, this machine)"}
        records = {v["name"]: reference_record(v, env) for v in eligible}
    else:
        judge = TargetJudge(cfg, family) if eligible and declared.validated_here else None
        records = {v["name"]: variant_record(cfg, family, declared, v, judge) for v in eligible}
    for variant, record in records.items():
        log.info("%s %s on %s: %s%s", family, variant, name, record["status"],
                 f" ({record['reason']})" if record.get("reason") else "")
    # json_safe: a failed variant's parity can be inf (TVM's fp16 gave 1.9e304), which report.json,
    # read strictly by promote, must not hold
    evidence = json_safe({"target": name, "family": family, "declaration": declared.as_dict(), "variants": records})
    write_json(cfg.layout.target_evidence(family, name), evidence)
    return evidence


class TargetJudge:
    """What every variant of a family is judged on: the eager model, the validation's parity
    histories, the holdout windows (one series; None across series) and the x86 outputs."""

    def __init__(self, cfg, family: str):
        self.cfg, self.family = cfg, family
        self.model, spec = load_model(cfg, family)
        if judging(cfg) == ACROSS_SERIES:
            variants = read_json(cfg.layout.variants(family))
            self.histories = AcrossSeries(cfg, family, spec, variants).histories()[1]
            self.holdout = None
        else:
            series, split = load_split(cfg.layout.fleet, cfg)
            judged = OverOrigins(cfg, series, split, load_baselines(cfg))
            self.histories, self.holdout = judged.histories()[1], judged.holdout
        self._x86: dict[Path, TargetRun] = {}

    def x86(self, path: Path) -> TargetRun:
        """x86 ONNX Runtime's outputs of the variant at ``path`` on the parity histories (the reference)."""
        if path not in self._x86:
            self._x86[path] = run_target(REFERENCE_TARGET, path, self.histories, repeats=0)
        return self._x86[path]

    def holdout_on(self, declared: Target, path: Path, variant: dict, **options) -> dict:
        """The target's own forecasts on the holdout windows, judged as the validation judges them,
        against the same variant's x86 holdout MAE within the accuracy budget."""
        if self.holdout is None:
            return {"judged": False, "reason": "judged across series: a target's holdout is measured on one "
                                               "series' origins only"}
        run = run_target(declared.name, path, [self.holdout.history], repeats=0, **options)
        if not run.ok:
            return {"judged": False, "reason": run.reason}
        forecast = run.outputs[0][run.output_names.index(OUTPUT_NAME)]
        metrics, _ = judge_holdout(np.asarray(forecast, dtype=np.float32), self.holdout)
        x86_mae = (variant.get("holdout") or {}).get("mae")
        loss = metrics["mae"] / x86_mae - 1.0 if x86_mae else None
        budget = self.cfg.accuracy_budget
        return {**holdout_figures(metrics), "judged": True, "x86_mae": x86_mae, "loss_vs_x86": loss,
                "budget": budget, "passed": loss is not None and loss <= budget}


def variant_record(cfg, family: str, declared: Target, variant: dict, judge: TargetJudge | None) -> dict:
    """One variant's record on ``declared`` (base.target_evidence: status, reason, artifact, parity,
    holdout, latency, size, environment)."""
    path = cfg.run_dir / variant["onnx_path"]
    record = {"status": None, "reason": None, "artifact": variant["onnx_path"], "sha256": variant.get("sha256"),
              "size_bytes": variant.get("size_bytes"), "parity": None, "holdout": None, "latency_ms": {},
              "latency_note": None, "environment": {}}
    if declared.recipe:
        record["recipe"] = list(declared.recipe)
    options = {}
    if declared.name == TVM:
        options["keep"] = cfg.layout.target_artifacts(family, declared.name, variant["name"])
    repeats = 1 if declared.emulated else cfg.latency_repeats  # under emulation a figure is no timing
    run = run_target(declared.name, path, judge.histories if judge else [], repeats=repeats, **options)
    record["environment"] = run.environment
    if not run.ok:
        record["status"] = UNVALIDATED if not declared.validated_here else run.status
        record["reason"] = run.reason
        return record
    record["latency_ms"], record["latency_note"] = latency_figures(run.latency)
    if declared.name == TVM:
        record.update(compiled_artifact(cfg, options["keep"], variant))
    record["parity"] = {"vs_x86": compare_runs(run, judge.x86(path), judge.histories, rtol=cfg.parity_rtol,
                                               atol=cfg.parity_atol),
                        "vs_torch": compare_with_torch(run, judge.model, judge.histories, rtol=cfg.parity_rtol,
                                                       atol=cfg.parity_atol)}
    record["holdout"] = judge.holdout_on(declared, path, variant, **options)
    failures = verdict(variant["name"], record["parity"], record["holdout"])
    record["status"] = FAILED if failures else VALIDATED
    record["reason"] = "; ".join(failures) or None
    return record


def verdict(variant: str, parity: dict, holdout: dict) -> list[str]:
    """What fails a variant on a target: parity with x86 (every variant), with PyTorch (the fp32
    variants, as their validation gates), and its holdout MAE beyond the budget of x86's."""
    failures = []
    checks = [("x86_64", parity["vs_x86"])] + ([("PyTorch", parity["vs_torch"])] if variant in FP32_VARIANTS else [])
    for name, judged in checks:
        if not judged.get("passed"):
            failures.append(f"parity with {name}: worst {PARITY_RULE} "
                            f"{judged.get('worst_tolerance_ratio', float('nan')):.3g} > 1 (max diff "
                            f"{judged.get('max_diff_in_levels', float('nan')):.3g} of the forecast level)")
    if holdout.get("judged") and not holdout["passed"]:
        loss = holdout["loss_vs_x86"]
        failures.append(f"holdout MAE {holdout['mae']:.4g} is {'n/a' if loss is None else format(loss, '+.2%')} "
                        f"of x86's {holdout['x86_mae']}, beyond the {holdout['budget']:.0%} budget")
    return failures


def latency_figures(latency: dict) -> tuple[dict, str | None]:
    """``{batch1_p50, batch1_p95, batch64_p50, ...}`` (the first shape of each batch size: the
    lookback's) with every shape's row, and the note ("emulated, not a timing") or None."""
    figures: dict = {}
    for row in latency.get("per_shape") or []:
        for stat in ("p50", "p95"):
            key, value = f"batch{row['batch']}_{stat}", row.get(f"{stat}_ms")
            if value is not None and key not in figures:
                figures[key] = value
    figures["per_shape"] = latency.get("per_shape") or []
    return figures, latency.get("note") or None


def compiled_artifact(cfg, folder: Path, variant: dict) -> dict:
    """The TVM library of batch 1 at the lookback (what an edge device runs) as the target's
    artifact; the others compiled for the parity shapes stay beside it."""
    library = folder / f"b1_t{cfg.lookback}.so"
    if not library.exists():
        return {"artifact": None, "sha256": None, "size_bytes": None,
                "artifact_note": f"no library for batch 1 at the lookback in {folder.name}"}
    return {"artifact": str(library.relative_to(cfg.run_dir)), "sha256": sha256_file(library),
            "size_bytes": library.stat().st_size, "static_shape": [1, cfg.lookback, cfg.n_features],
            "source_onnx": variant["onnx_path"]}
