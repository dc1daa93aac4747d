"""Parity of a target's outputs with the x86 ones and PyTorch's, by the pipeline's parity measure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onnxcast.targets.declarations import OK, UNAVAILABLE
from onnxcast.targets.parity import compare_runs, compare_with_torch, forecast_level
from onnxcast.targets.runners import TargetRun

RNG = np.random.default_rng(7)
HISTORIES = [(RNG.normal(size=(b, t, 1)) * 50 + 1000).astype(np.float32) for b, t in [(1, 8), (3, 9)]]


def forecasts(histories, scale=1.0):
    """A two-step "forecast": the last value and the mean of each window (level ~1000)."""
    return [[np.stack([h[:, -1, 0], h[:, :, 0].mean(axis=1)], axis=1).astype(np.float32) * scale] for h in histories]


def run_of(outputs, name="openvino", names=("forecast",)):
    return TargetRun(name, OK, output_names=list(names), outputs=outputs)


def test_identical_outputs_pass_with_nothing_to_spare():
    reference = run_of(forecasts(HISTORIES), "x86_64")
    result = compare_runs(run_of(forecasts(HISTORIES)), reference, HISTORIES)
    assert result["judged"] and result["passed"]
    assert result["worst_tolerance_ratio"] == 0.0 and result["max_diff_in_levels"] == 0.0
    assert [(row["batch"], row["time"]) for row in result["shapes"]] == [(1, 8), (3, 9)]


def test_a_wrong_row_fails_and_the_difference_is_stated_in_units_of_the_level():
    reference = run_of(forecasts(HISTORIES), "x86_64")
    wrong = forecasts(HISTORIES)
    wrong[1][0][2, 0] += 5.0  # one value of the third row off by 5 on a level of ~1000
    result = compare_runs(run_of(wrong), reference, HISTORIES)
    level = forecast_level([o[0] for o in reference.outputs])
    assert 950 < level < 1050
    assert not result["passed"] and result["worst_tolerance_ratio"] > 1.0
    assert result["max_diff_in_levels"] == pytest.approx(5.0 / level, rel=1e-3)
    assert result["shapes"][0]["tolerance_ratio"] == 0.0  # the batch-1 shape was right


def test_a_nan_or_a_wrong_shape_never_passes():
    reference = run_of(forecasts(HISTORIES), "x86_64")
    nan = forecasts(HISTORIES)
    nan[0][0][0, 1] = np.nan
    assert not compare_runs(run_of(nan), reference, HISTORIES)["passed"]
    short = [[o[0][:, :1]] for o in forecasts(HISTORIES)]
    result = compare_runs(run_of(short), reference, HISTORIES)
    assert not result["passed"] and "shape [1, 1] != [1, 2]" in result["shapes"][0]["error"]


def test_a_target_that_did_not_run_is_not_judged():
    missing = TargetRun("aarch64", UNAVAILABLE, "qemu-aarch64-static not found")
    result = compare_runs(missing, run_of(forecasts(HISTORIES), "x86_64"), HISTORIES)
    assert result == {"judged": False, "reason": "qemu-aarch64-static not found"}


def test_against_pytorch_the_eager_model_is_the_reference():
    class LastAndMean(torch.nn.Module):
        def forward(self, history):
            return torch.stack([history[:, -1, 0], history[:, :, 0].mean(dim=1)], dim=1)

    model = LastAndMean().eval()
    assert compare_with_torch(run_of(forecasts(HISTORIES)), model, HISTORIES)["passed"]
    off = compare_with_torch(run_of(forecasts(HISTORIES, scale=1.01)), model, HISTORIES)
    assert not off["passed"] and off["max_diff_in_levels"] == pytest.approx(0.01, rel=0.1)


def with_quantiles(histories, shift_lowest=0.0):
    """Forecast and quantiles ``forecast + offsets`` whose lowest level cancels to about -0.07 on a
    level of ~1,000 (``shift_lowest`` added to it), as M3 N1695's 2.5% quantile did on 1,530."""
    out = []
    for (forecast,) in forecasts(histories):
        offsets = np.array([0.0, 100.0, 200.0], np.float32)
        quantiles = forecast[..., None] + offsets
        quantiles[..., 0] = -0.0719 + shift_lowest
        out.append([forecast, quantiles.astype(np.float32)])
    return out


def test_rounding_of_the_level_on_a_quantile_near_zero_passes_and_one_percent_of_it_fails():
    names = ("forecast", "quantiles")
    reference = run_of(with_quantiles(HISTORIES), "x86_64", names)
    ulps = 4 * float(np.spacing(np.float32(1000.0)))  # 2.4e-4: a ratio of 1.4 against rtol * |-0.0719|
    noisy = compare_runs(run_of(with_quantiles(HISTORIES, ulps), names=names), reference, HISTORIES)
    assert noisy["passed"] and noisy["worst_tolerance_ratio"] < 0.01
    wrong = compare_runs(run_of(with_quantiles(HISTORIES, 10.0), names=names), reference, HISTORIES)
    assert not wrong["passed"] and wrong["worst_tolerance_ratio"] > 5
    assert "quantiles_tolerance_ratio" in wrong["shapes"][0]
