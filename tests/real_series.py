"""Small real data for the tests that need a run the gates pass.

Weekly CO2 at Mauna Loa (statsmodels.datasets.co2, 1958-2001, 2284 weeks) as ``ds,y``, its 59
missing weeks interpolated: a tiny model trained for an epoch beats the best naive baseline
on it by a wide margin (naive MAE about 1.7 ppm, models 0.6-0.9), so runs pass their gates
for the reason a user's would. The hourly example is a harder test of the models: the weekly
seasonal naive is a strong baseline there, which only a properly trained model beats
(tests/cli and the demo run it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TINY_SETTINGS = {"horizon": 12, "lookback": 56}  # a week of weeks: lookback >= the yearly season 52


def weekly_co2_csv(path: str | Path | None = None) -> str:
    """Write the series (once per path) and return its path."""
    path = Path(path) if path else Path(tempfile.gettempdir()) / f"onnxcast-tests-{os.getuid()}" / "co2_weekly.csv"
    if not path.exists():
        import statsmodels.datasets.co2 as co2

        frame = co2.load_pandas().data.rename(columns={"co2": "y"}).rename_axis("ds").reset_index()
        frame["ds"] = frame["ds"].dt.strftime("%Y-%m-%d")
        frame["y"] = frame["y"].interpolate().round(2)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        frame.to_csv(tmp, index=False)
        tmp.replace(path)
    return str(path)
