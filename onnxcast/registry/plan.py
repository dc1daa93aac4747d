"""The plan of a run (``plan.json`` in the run directory): which families it evaluates, where
each comes from (trained here, or fetched from the registry or S3) and which is the champion.

It pins each family's source, so retried tasks see the same champion version even if the
alias moved meanwhile; the champion, when there is one, runs as the family ``champion``
(onnxcast.registry.champion decides with it; onnxcast.registry.fetch writes the plan of a
staged version). An entry with ``combines`` (the ensemble) is made from those families once
they trained, not trained on its own; a family the run skipped (``models/<family>/skipped.json``:
the ensemble with fewer than two trained members) is planned but not made.
"""

from __future__ import annotations

from pathlib import Path

from onnxcast.base.errors import OnnxcastError
from onnxcast.base.files import read_json, write_json
from onnxcast.pipeline.layout import RunLayout

CHAMPION_FAMILY = "champion"
# a plan entry's key: the families it combines once they trained (the ensemble, docs/ensemble.md)
COMBINES = "combines"


class PlanError(OnnxcastError):
    """The run directory has no plan, or the plan does not name the family asked for."""


def write_plan(run_dir: str | Path, entries: list[dict], notes: list[str] = (),
               incomparable_champion: dict | None = None) -> dict:
    """Record the families of the run: ``[{"family", "source", "role"}]``, role challenger|champion.

    ``incomparable_champion`` (``{"version", "differences"}``) records a champion that this
    run cannot evaluate (another horizon or other features): decide() then refuses to
    replace it automatically, since its consumers expect its input and output shapes."""
    names = [e["family"] for e in entries]
    if len(set(names)) != len(names):
        raise PlanError(f"duplicate family names in the plan: {names}")
    plan = {"families": entries, "notes": list(notes), "incomparable_champion": incomparable_champion}
    write_json(RunLayout(run_dir).plan, plan)
    return plan


def read_plan(run_dir: str | Path) -> dict:
    """The run's plan; PlanError when the data check step has not written it."""
    path = RunLayout(run_dir).plan
    if not path.exists():
        raise PlanError(f"{path}: no plan; run the data check step first")
    return read_json(path)


def plan_entry(run_dir: str | Path, family: str) -> dict:
    """The plan's entry of ``family``; PlanError when the plan does not name it."""
    plan = read_plan(run_dir)
    for entry in plan["families"]:
        if entry["family"] == family:
            return entry
    raise PlanError(f"{RunLayout(run_dir).plan}: no family {family!r}; the plan has "
                    f"{[e['family'] for e in plan['families']]}")


def trained_apart(plan: dict) -> list[str]:
    """The families of ``plan`` each trained or fetched on its own (in parallel in the training
    DAG), in its order: every one but those it combines from the others after they trained."""
    return [e["family"] for e in plan["families"] if COMBINES not in e]


def combined(plan: dict) -> list[str]:
    """The families of ``plan`` made from others once they trained (the ensemble)."""
    return [e["family"] for e in plan["families"] if COMBINES in e]


def made_families(run_dir: str | Path) -> list[str]:
    """The plan's families the run made, in its order: every one but those it skipped."""
    layout = RunLayout(run_dir)
    return [e["family"] for e in read_plan(run_dir)["families"] if not layout.skipped(e["family"]).exists()]


def challengers(run_dir: str | Path) -> list[str]:
    """The families the run trains or fetches to compete (not the champion, nor one it skipped)."""
    made = set(made_families(run_dir))
    return [e["family"] for e in read_plan(run_dir)["families"]
            if e.get("role", "challenger") == "challenger" and e["family"] in made]


def champion_entry(run_dir: str | Path) -> dict | None:
    """The champion's entry, None when the run has no champion to compare with."""
    return next((e for e in read_plan(run_dir)["families"] if e.get("role") == "champion"), None)
