"""`bench/reference_refit.py --quick`: both ways of fitting the reference on the same origins,
their seconds, ratio and MAE printed (docs/evaluation.md quotes the full run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_reference_bench_prints_both_fits_and_their_ratio():
    result = subprocess.run([sys.executable, str(REPO / "bench" / "reference_refit.py"), "--quick"],
                            capture_output=True, text=True, timeout=300, check=True)
    line = re.search(r"CO2 weekly, h 13 +(\d+) origins \| every origin +([\d.]+)s MAE ([\d.]+) \| "
                     r"once per horizon +([\d.]+)s MAE ([\d.]+) \| ([\d.]+)x faster", result.stdout)
    assert line, result.stdout
    origins, before_mae, after_mae = int(line[1]), float(line[3]), float(line[5])
    assert origins >= 20
    assert abs(after_mae - before_mae) <= 0.05 * before_mae  # the same reference, estimated less often
