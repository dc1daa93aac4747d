"""The statistical reference's cost: parameters estimated at every holdout origin (as before)
against once per horizon with ``forward`` in between (``evaluation.reference_forecasts`` now),
on the same origins of real and synthetic series, in the same run; prints seconds, the ratio
and both MAEs.

    .venv/bin/python bench/reference_refit.py            # three series, about two minutes
    .venv/bin/python bench/reference_refit.py --quick    # CO2 only (seconds): the smoke test
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from onnxcast.pipeline import evaluation as ev


def every_origin(target: np.ndarray, origins: ev.Origins, horizon: int, seasons: tuple[int, ...]):
    """The reference estimated at every origin (the rule before once-per-horizon)."""
    _, model, window = ev.reference_model(seasons, int(origins.index.min()))
    started, out = time.monotonic(), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for origin in origins.index:
            history = target[max(0, origin - window):origin].astype(np.float64)
            out.append(model.forecast(y=history, h=horizon, level=[80, 95])["mean"])
    return np.stack(out), time.monotonic() - started


def compare(label: str, target: np.ndarray, holdout_start: int, horizon: int, seasons: tuple[int, ...]) -> None:
    origins = ev.holdout_origins(len(target), holdout_start, horizon, seasons)
    actual = ev.actuals(target, origins, horizon)
    before, before_s = every_origin(target, origins, horizon, seasons)
    after = ev.reference_forecasts(target, origins, horizon, seasons, (0.025, 0.1, 0.5, 0.9, 0.975))
    print(f"{label:22s} {len(origins.index):4d} origins | every origin {before_s:6.1f}s MAE "
          f"{np.mean(np.abs(before - actual)):.4g} | once per horizon {after.seconds:6.1f}s MAE "
          f"{np.mean(np.abs(after.mean - actual)):.4g} | {before_s / after.seconds:.1f}x faster")


def main(argv: list[str] | None = None) -> None:
    import argparse

    import pandas as pd
    from statsmodels.datasets import co2

    from onnxcast.pipeline.config import example_data_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CO2 only: a smoke test of seconds")
    quick = parser.parse_args(argv).quick
    weekly = co2.load_pandas().data["co2"].interpolate().to_numpy(float)
    compare("CO2 weekly, h 13", weekly, int(len(weekly) * 0.85), 13, (52,))
    if quick:
        return
    example = pd.read_csv(example_data_path())["y"].to_numpy(float)
    compare("example hourly, h 24", example, int(len(example) * 0.85), 24, (24, 168))
    periodic = np.tile(np.array([5.0, 9.0, 4.0, 7.0, 6.0, 8.0, 3.0, 2.0, 6.5, 7.5, 5.5, 4.5] * 2), 40)
    compare("periodic hourly, h 12", periodic, 816, 12, (24,))


if __name__ == "__main__":
    main()
