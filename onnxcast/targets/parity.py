"""Parity of a target's outputs with the x86 ONNX Runtime ones and with the PyTorch model's, judged by
the pipeline's own parity measure (``onnxcast.pipeline.validate.parity_on``: the worst
``|a-b| / (atol + rtol*max(|b|, row level))``, the row level being the mean |forecast| of the
reference for that history (``validate.tolerance_ratios``), <= 1 passes) and stated in units of the
forecast level (max |diff| divided by the mean |forecast| of the reference over every history).
"""

from __future__ import annotations

import numpy as np

from onnxcast.base.contract import OUTPUT_NAME
from onnxcast.pipeline.validate import parity_on, torch_runner
from onnxcast.targets.runners import TargetRun

# the pipeline's defaults (PipelineConfig.parity_rtol / parity_atol)
PARITY_RTOL, PARITY_ATOL = 1e-3, 1e-4


class ReplayedSession:
    """A stand-in for an ORT session that answers with outputs computed elsewhere (a child process,
    an emulated device), so the pipeline's parity function judges them unchanged."""

    def __init__(self, histories: list[np.ndarray], names: list[str], outputs: list[list[np.ndarray]]):
        self._answers = [(h, dict(zip(names, out, strict=True))) for h, out in zip(histories, outputs, strict=True)]

    def run(self, names: list[str], feed: dict) -> list[np.ndarray]:
        for history, answer in self._answers:
            if history is feed["history"]:
                return [answer[n] for n in names]
        raise KeyError("no replayed outputs for this history")


def compare_runs(candidate: TargetRun, reference: TargetRun, histories: list[np.ndarray], *,
                 rtol: float = PARITY_RTOL, atol: float = PARITY_ATOL) -> dict:
    """``candidate``'s outputs against ``reference``'s (both :class:`TargetRun` on ``histories``)."""
    if not (candidate.ok and reference.ok):
        return {"judged": False, "reason": candidate.reason or reference.reason}
    shared = [n for n in reference.output_names if n in candidate.output_names]

    def expected(history: np.ndarray):
        index = next(i for i, h in enumerate(histories) if h is history)
        values = dict(zip(reference.output_names, reference.outputs[index], strict=True))
        got = tuple(values[n].astype(np.float64) for n in shared)
        return got if len(got) > 1 else got[0]

    session = ReplayedSession(histories, candidate.output_names, candidate.outputs)
    level = forecast_level([dict(zip(reference.output_names, o, strict=True))[OUTPUT_NAME] for o in reference.outputs])
    return judged(parity_on(expected, session, histories, rtol, atol), level)


def compare_with_torch(candidate: TargetRun, model, histories: list[np.ndarray], *,
                       rtol: float = PARITY_RTOL, atol: float = PARITY_ATOL) -> dict:
    """``candidate``'s outputs against the eager PyTorch ``model`` (both outputs where it has quantiles)."""
    if not candidate.ok:
        return {"judged": False, "reason": candidate.reason}
    both = bool(getattr(model, "has_quantiles", False)) and "quantiles" in candidate.output_names
    reference = torch_runner(model, quantiles=both)
    forecasts = [reference(h)[0] if both else reference(h) for h in histories]
    session = ReplayedSession(histories, candidate.output_names, candidate.outputs)
    return judged(parity_on(reference, session, histories, rtol, atol), forecast_level(forecasts))


def forecast_level(forecasts: list[np.ndarray]) -> float:
    """The mean |forecast| over every history: the unit parity is stated in."""
    values = np.concatenate([np.abs(np.asarray(f, dtype=np.float64)).ravel() for f in forecasts])
    return float(values.mean()) if values.size else 0.0


def judged(parity: dict, level: float) -> dict:
    """``parity_on``'s result with the verdict and the worst difference in units of the level."""
    in_levels = parity["max_abs_diff"] / level if level > 0 else float("inf")
    return {"judged": True, "passed": bool(parity["worst_tolerance_ratio"] <= 1.0),
            "worst_tolerance_ratio": parity["worst_tolerance_ratio"], "max_abs_diff": parity["max_abs_diff"],
            "forecast_level": level, "max_diff_in_levels": in_levels, "shapes": parity["shapes"]}
