"""The ensemble's own conformal quantiles against its members' quantiles combined the same way.

Usage: ``.venv/bin/python bench/ensemble_quantiles.py RUN_DIR`` on a finished run that trained
``ensemble`` (docs/ensemble.md, "Quantiles"). On the run's holdout (one series: its holdout
origins; a fleet: each series' last horizon) it prints the 80% and 95% coverage and the mean
MSIS (95%) of the ensemble's graph quantiles, and of the members' own calibrated quantiles
combined with the ensemble's weights (or their median).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxcast.pipeline.checkpoint import load_model  # noqa: E402
from onnxcast.pipeline.config import PipelineConfig  # noqa: E402
from onnxcast.pipeline.fleet_data import ACROSS_SERIES, judging_for, load_split  # noqa: E402
from onnxcast.pipeline.fleet_train import gather  # noqa: E402
from onnxcast.pipeline.metrics import mase_scale  # noqa: E402
from onnxcast.pipeline.validate import holdout_windows  # noqa: E402


def holdout(cfg: PipelineConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(histories, actuals, MASE scale of each window)`` of the run's holdout."""
    fleet, split = load_split(cfg.layout.fleet, cfg)
    if judging_for(fleet.n_series) == ACROSS_SERIES:
        ends = fleet.lengths - cfg.horizon
        x, y = gather(fleet, np.arange(fleet.n_series), ends, cfg.lookback, cfg.horizon)
        scales = np.array([mase_scale(np.asarray(fleet.target(i)[:ends[i]], dtype=np.float64), fleet.season)
                           for i in range(fleet.n_series)])
        return x, y, scales
    windows = holdout_windows(cfg, fleet, split)
    return windows.history, windows.actual, np.full(len(windows.actual), windows.mase_scale)


def judge(name: str, quantiles: np.ndarray, actual: np.ndarray, scales: np.ndarray, levels) -> str:
    q, y = quantiles.astype(np.float64), actual.astype(np.float64)
    covered = {}
    for low, high, nominal in ((0.1, 0.9, 80), (0.025, 0.975, 95)):
        lo, hi = q[..., levels.index(low)], q[..., levels.index(high)]
        covered[nominal] = float(np.mean((y >= lo) & (y <= hi)))
    lo, hi, alpha = q[..., levels.index(0.025)], q[..., levels.index(0.975)], 0.05
    score = (hi - lo) + 2 / alpha * (lo - y) * (y < lo) + 2 / alpha * (y - hi) * (y > hi)
    msis = float(np.mean(score.mean(axis=1) / scales))
    return f"{name}: coverage 80% {covered[80]:.3f}, 95% {covered[95]:.3f}, mean MSIS (95%) {msis:.3f}"


def main(run_dir: str) -> int:
    cfg = PipelineConfig.load(Path(run_dir) / "config.json")
    cfg = replace(cfg, out_dir=run_dir)
    ensemble, spec = load_model(cfg, "ensemble")
    members = [m["family"] for m in spec.members]
    x, y, scales = holdout(cfg)
    history = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    with torch.no_grad():
        own = ensemble.forecast_and_quantiles(history)[1]
        each = torch.stack([load_model(cfg, m)[0].forecast_and_quantiles(history)[1] for m in members], dim=-1)
    if spec.weights:
        combined = (each * torch.tensor(spec.weights)).sum(dim=-1)
    else:
        ordered = each.sort(dim=-1).values
        combined = ordered[..., (len(members) - 1) // 2 : len(members) // 2 + 1].mean(dim=-1)
    how = f"weights {list(spec.weights)}" if spec.weights else "median"
    print(f"{run_dir}: ensemble of {members} ({how}), {len(y)} holdout windows")
    print(judge("  the ensemble's conformal quantiles", own.numpy(), y, scales, cfg.levels))
    print(judge("  the members' quantiles combined  ", combined.numpy(), y, scales, cfg.levels))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
