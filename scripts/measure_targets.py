"""Run every deployment target on the fp32 models of a finished pipeline run and print, per family and
target, parity with x86 ONNX Runtime and with PyTorch (in units of the forecast level), latency and
size: the table of docs/targets.md.

    onnxcast pipeline --data example --models lstm,transformer,nhits,dlinear --max-epochs 1 \\
        --windows-per-epoch 256 --latency-repeats 3 --out /tmp/targets-run
    python scripts/arm_sysroot.py --tvm     # once: the emulated targets' sysroot
    python scripts/measure_targets.py /tmp/targets-run [--targets ...] [--json out.json]

The histories are the pipeline's parity shapes (``validate.parity_shapes``: batch 1 to 64, histories
longer than the lookback) sampled from the run's series. TVM compiles a library per shape: it gets
the batch-1 and batch-64 shapes at the lookback only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from onnxcast.base.files import json_safe
from onnxcast.pipeline.checkpoint import load_model
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.data import SeriesData
from onnxcast.pipeline.layout import RunLayout
from onnxcast.pipeline.validate import parity_shapes, sample_histories
from onnxcast.targets.declarations import TARGETS
from onnxcast.targets.parity import compare_runs, compare_with_torch
from onnxcast.targets.runners import run_target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished pipeline run folder (--out of onnxcast pipeline)")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated (default: all declared)")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per shape")
    parser.add_argument("--json", type=Path, help="write the evidence here too")
    args = parser.parse_args(argv)
    layout = RunLayout(args.run)
    # the run wrote its settings while it ran in a staging folder: read the published one
    cfg = PipelineConfig.from_dict({**json.loads(layout.config.read_text()), "out_dir": str(args.run)})
    series = SeriesData.load(layout.data)
    rng = np.random.default_rng(0)
    shapes = parity_shapes(cfg.lookback, 24)
    histories = [sample_histories(series.values, batch, steps, rng) for batch, steps in shapes]
    tvm_histories = [h for h in histories if h.shape[1] == cfg.lookback]
    rows, evidence = [], {}
    for family in cfg.models:
        model_path = layout.onnx(family)
        if not model_path.exists():
            continue
        model, _ = load_model(cfg, family)
        x86 = run_target("x86_64", model_path, histories, repeats=args.repeats)
        for name in args.targets.split(","):
            used = tvm_histories if name == "tvm-aarch64" else histories
            run = x86 if name == "x86_64" else run_target(name, model_path, used, repeats=args.repeats)
            reference = x86 if used is histories else subset(x86, histories, used)
            vs_x86, vs_torch = compare_runs(run, reference, used), compare_with_torch(run, model, used)
            evidence[f"{family}/{name}"] = {**run.evidence(), "parity_vs_x86": vs_x86, "parity_vs_torch": vs_torch}
            rows.append(table_row(family, run, vs_x86, vs_torch))
            print(rows[-1], flush=True)
    if args.json:
        args.json.write_text(json.dumps(json_safe(evidence), indent=1))
    return 0


def subset(run, histories, used):
    """``run`` restricted to the histories in ``used`` (TVM gets fewer shapes)."""
    from dataclasses import replace

    keep = [i for i, h in enumerate(histories) if any(h is u for u in used)]
    return replace(run, outputs=[run.outputs[i] for i in keep])


def table_row(family: str, run, vs_x86: dict, vs_torch: dict) -> str:
    """One Markdown row: family, target, status, parity (level units, worst ratio), p50 ms, size."""
    if not run.ok:
        return f"| {family} | {run.target} | {run.status}: {run.reason} | | | | |"
    per_shape = {(r["batch"], r["time"]): r["p50_ms"] for r in run.latency["per_shape"]}
    batch1 = next((v for (b, _), v in per_shape.items() if b == 1), None)
    batch64 = next((v for (b, _), v in per_shape.items() if b == 64), None)
    note = " (emulated, not a timing)" if run.emulated else ""
    return (f"| {family} | {run.target} | ok | {vs_x86['max_diff_in_levels']:.1e} "
            f"(ratio {vs_x86['worst_tolerance_ratio']:.3f}) | {vs_torch['max_diff_in_levels']:.1e} "
            f"(ratio {vs_torch['worst_tolerance_ratio']:.3f}) | {batch1:.3f} / {batch64:.3f}{note} | "
            f"{run.artifact_bytes / 1024:.0f} KiB |")


if __name__ == "__main__":
    sys.exit(main())
