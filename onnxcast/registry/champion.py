"""Champion/challenger: which models a run evaluates, and whether the challenger wins.

A run evaluates its challengers (trained or fetched families) and, when a champion
exists, the champion itself: it is fetched into the run as the family ``champion`` and
goes through the same export, optimize and validate steps on the same holdout window.
The decision then compares numbers measured in this run, never numbers from the past.

The plan (``plan.json`` in the run directory) pins what each family is and where it comes
from, so retried tasks see the same champion version even if the alias moved meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from onnxcast.base.errors import OnnxcastError
from onnxcast.pipeline.layout import RunLayout

CHAMPION_FAMILY = "champion"


class PlanError(OnnxcastError):
    """The run directory has no plan, or the plan does not name the family asked for."""


def write_plan(run_dir: str | Path, entries: list[dict], notes: list[str] = (),
               incomparable_champion: dict | None = None) -> dict:
    """Record the families of the run: ``[{"family", "source", "role"}]``, role challenger|champion.

    ``incomparable_champion`` (``{"version", "differences"}``) records a champion that this
    run cannot evaluate (another horizon or other features): decide() then refuses to
    replace it automatically, since its consumers expect its input and output shapes."""
    from onnxcast.base.files import write_json

    names = [e["family"] for e in entries]
    if len(set(names)) != len(names):
        raise PlanError(f"duplicate family names in the plan: {names}")
    plan = {"families": entries, "notes": list(notes), "incomparable_champion": incomparable_champion}
    write_json(RunLayout(run_dir).plan, plan)
    return plan


def read_plan(run_dir: str | Path) -> dict:
    from onnxcast.base.files import read_json

    path = RunLayout(run_dir).plan
    if not path.exists():
        raise PlanError(f"{path}: no plan; run the data check step first")
    return read_json(path)


def plan_entry(run_dir: str | Path, family: str) -> dict:
    plan = read_plan(run_dir)
    for entry in plan["families"]:
        if entry["family"] == family:
            return entry
    raise PlanError(f"{RunLayout(run_dir).plan}: no family {family!r}; the plan has "
                    f"{[e['family'] for e in plan['families']]}")


def challengers(run_dir: str | Path) -> list[str]:
    return [e["family"] for e in read_plan(run_dir)["families"] if e.get("role", "challenger") == "challenger"]


def champion_entry(run_dir: str | Path) -> dict | None:
    return next((e for e in read_plan(run_dir)["families"] if e.get("role") == "champion"), None)


def decide(run_dir: str | Path, *, min_improvement: float = 0.0, require_beats_champion: bool = True) -> dict:
    """Compare the report's selected challenger with the champion evaluated in this run.

    The challenger wins when its fp32 holdout MAE is lower than the champion's by more than
    ``min_improvement`` (relative; 0.0: any improvement, a tie loses) and a paired test on the
    same origins (onnxcast.pipeline.evaluation.paired_test) finds the difference significant; otherwise
    the champion stays. No champion: the challenger wins.
    Writes ``champion_challenger.json`` and returns the decision.
    """
    from onnxcast.base.files import read_json, write_json

    layout = RunLayout(run_dir)
    report = read_json(layout.report)
    family = report["selected"]["edge"]["family"]
    entry = next(m for m in report["models"] if m["family"] == family)
    decision = {
        "challenger_family": family,
        "challenger_mae": entry["fp32_holdout_mae"],
        "holdout_start": report["split"]["holdout_start"],
        "holdout_end": report["split"]["holdout_end"],
        "min_improvement": float(min_improvement),
        "champion_version": None, "champion_family": None, "champion_mae": None, "improvement": None,
    }
    champion = champion_entry(run_dir)
    plan = read_plan(run_dir)
    incomparable = plan.get("incomparable_champion")
    if champion is None and incomparable and require_beats_champion:
        decision.update(promote=False, champion_version=incomparable.get("version"),
                        reason=f"champion v{incomparable.get('version')} is not comparable with this run "
                               f"({incomparable.get('differences')}); its consumers expect its shapes: promote "
                               "this version explicitly (onnxcast_promote) if that is intended")
    elif champion is None:
        decision.update(promote=True, reason="no champion to compare with: " + ("; ".join(plan.get("notes", []))
                                                                               or "none registered"))
    else:
        validation = read_json(layout.validation(CHAMPION_FAMILY))
        spec = read_json(layout.model_json(CHAMPION_FAMILY))["spec"]
        champion_mae = validation["fp32_holdout_mae"]
        improvement = 1.0 - decision["challenger_mae"] / champion_mae if champion_mae else 0.0
        decision.update(champion_version=champion.get("version"), champion_family=spec["family"],
                        champion_mae=champion_mae, improvement=improvement)
        test = _paired(entry, validation, report)
        decision["paired_test"] = test
        better = decision["challenger_mae"] < champion_mae and improvement > min_improvement
        beats = better and test["significant"]
        if beats:
            decision.update(promote=True, reason=f"challenger MAE {decision['challenger_mae']:.4g} beats champion "
                                                 f"v{champion.get('version')} {champion_mae:.4g} "
                                                 f"({improvement:+.2%}, p={test['p_value']:.3g} on "
                                                 f"{test['origins']} paired origins) on the same holdout")
        elif better and require_beats_champion:
            decision.update(promote=False, reason=f"challenger MAE {decision['challenger_mae']:.4g} is lower than "
                                                  f"champion v{champion.get('version')} {champion_mae:.4g} "
                                                  f"({improvement:+.2%}) but not significantly ({_p_text(test)}): "
                                                  "the champion stays")
        elif not require_beats_champion:
            decision.update(promote=True, reason=f"challenger MAE {decision['challenger_mae']:.4g} does not beat "
                                                 f"champion {champion_mae:.4g}, promoted as asked "
                                                 "(require_beats_champion is off)")
        else:
            decision.update(promote=False, reason=f"challenger MAE {decision['challenger_mae']:.4g} does not beat "
                                                  f"champion v{champion.get('version')} {champion_mae:.4g} by more "
                                                  f"than {min_improvement:.2%} ({improvement:+.2%})")
    write_json(layout.decision, decision)
    return decision


def _paired(challenger: dict, champion: dict, report: dict) -> dict:
    """Diebold-Mariano test of the two fp32 models' per-origin MAEs on this run's origins."""
    import numpy as np

    from onnxcast.pipeline.evaluation import paired_test

    def errors(entry: dict):
        fp32 = next((v for v in entry.get("variants", []) if v["name"] == "fp32"), None)
        return np.asarray((fp32 or {}).get("per_origin_mae") or [], dtype=np.float64)

    block = int(((report.get("baselines") or {}).get("origins") or {}).get("block", 1))
    a, b = errors(challenger), errors(champion)
    if len(a) != len(b):
        a = b = np.zeros(0)
    return paired_test(a, b, block)


def _p_text(test: dict) -> str:
    if test.get("p_value") is None:
        return test.get("note") or f"{test.get('origins', 0)} paired origins"
    return f"p={test['p_value']:.3g} on {test['origins']} paired origins, alpha {test['alpha']}"
