"""Golden reports: the key figures of a finished run compared with a committed JSON file
(tests/golden/<name>.json), so a refactor that changes a number fails a test instead of passing
silently (issue 31, stage S0).

What is compared is what a run decides and the figures it decides on: the status, the best
baseline, the holdout origins (count, stride, block), every family's ``fp32_holdout_mae`` (the
mean MASE for a fleet), each variant's holdout MAE, gate verdicts and eligibility, the family
choice (order, ties, p-values) and the family chosen per channel. Not the variant chosen per
channel: that is the fastest eligible variant, measured (latency is not reproducible run to
run), and not latencies, sizes, paths or times.

Floats are compared at ``RTOL``. Training is bit-reproducible run to run on one machine (two
runs of ``tiny_run`` gave identical reports, threads=1); the tolerance only absorbs a kernel's
float reassociation on another CPU of the same kind, far below what a change of origins,
scales or data would move.

A commit that changes these figures on purpose regenerates the file
(``ONNXCAST_UPDATE_GOLDEN=1 pytest <the test>``) and says why in its message.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"
RTOL = 1e-4
ATOL = 1e-9


def key_figures(report: dict) -> dict:
    """The deterministic figures of a report (one series or a fleet), as plain JSON."""
    baselines = report.get("baselines") or {}
    origins = baselines.get("origins") or {}
    choice = report.get("family_choice") or {}
    figures = {
        "status": report.get("status"),
        "baselines_best": baselines.get("best"),
        "origins": {k: origins.get(k) for k in ("count", "stride", "block", "first", "last") if k in origins},
        "family_choice": {
            "best": choice.get("best"), "order": choice.get("order"), "tied_with_best": choice.get("tied_with_best"),
            "tests": {family: {k: test.get(k) for k in ("p_value", "significant", "origins", "series")
                               if k in test}
                      for family, test in sorted((choice.get("tests") or {}).items())}},
        "selected_family": {channel: (pick or {}).get("family")
                            for channel, pick in sorted((report.get("selected") or {}).items())},
        "models": {},
    }
    for model in report.get("models") or []:
        figures["models"][model["family"]] = {
            "fp32_holdout_mae": model.get("fp32_holdout_mae"),
            "gates_passed": model.get("gates_passed"),
            "variants": {v["name"]: {"holdout_mae": (v.get("holdout") or {}).get("mae"),
                                     "gates": {name: gate.get("passed") for name, gate in sorted((v.get("gates") or {}).items())},
                                     "eligible": v.get("eligible")}
                         for v in model.get("variants") or []},
        }
    fleet = report.get("fleet")
    if fleet:
        figures["fleet"] = {"n_series": fleet.get("n_series"),
                            "best_naive_mase_mean": ((fleet.get("baselines") or {}).get("best_naive") or {}).get("mase_mean"),
                            "reference_mase_mean": {name: figures_of.get("mase_mean") for name, figures_of
                                                    in sorted(((fleet.get("reference") or {}).get("aggregates") or {}).items())},
                            "tests": {family: _tests(tests) for family, tests in sorted((fleet.get("tests") or {}).items())}}
    return json.loads(json.dumps(figures))


def _tests(tests: dict) -> dict:
    """A fleet family's paired tests across series: p-value, verdict and count per comparison."""
    def figures(test):
        return {k: test.get(k) for k in ("p_value", "significant", "series", "origins") if k in test}

    out = {}
    for name, test in sorted((tests or {}).items()):
        if isinstance(test, dict) and "p_value" in test:
            out[name] = figures(test)
        elif isinstance(test, dict):  # vs_reference: one test per reference model
            out[name] = {model: figures(t) for model, t in sorted(test.items()) if isinstance(t, dict)}
        else:
            out[name] = test
    return out


def assert_matches_golden(figures: dict, name: str) -> None:
    """``figures`` equal tests/golden/<name>.json (floats at RTOL); every difference is listed."""
    path = GOLDEN / f"{name}.json"
    if os.environ.get("ONNXCAST_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    golden = json.loads(path.read_text())
    differences = list(_differences(golden, figures, name))
    assert not differences, (f"{len(differences)} key figure(s) differ from {path.name} (regenerate it with "
                             "ONNXCAST_UPDATE_GOLDEN=1 only for an intended change):\n" + "\n".join(differences[:40]))


def _differences(expected, actual, where: str):
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            if key not in actual:
                yield f"{where}.{key}: missing (golden {expected[key]!r})"
            elif key not in expected:
                yield f"{where}.{key}: new ({actual[key]!r}), not in the golden file"
            else:
                yield from _differences(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            yield from _differences(e, a, f"{where}[{i}]")
    elif _is_float(expected) and _is_float(actual):
        if not math.isclose(expected, actual, rel_tol=RTOL, abs_tol=ATOL):
            yield f"{where}: {actual!r} (golden {expected!r})"
    elif expected != actual:
        yield f"{where}: {actual!r} (golden {expected!r})"


def _is_float(value) -> bool:
    return isinstance(value, float)
