"""The validation report (``report.json``, a contract: docs/report.schema.json) and choosing
variants per channel."""

from __future__ import annotations

import json
from pathlib import Path

from onnxcast.base.errors import ConfigError
from onnxcast.base.files import read_json
from onnxcast.base.target_evidence import REFERENCE_TARGET, UNAVAILABLE, VALIDATED, reference_record
from onnxcast.pipeline.config import CHANNELS
from onnxcast.pipeline.layout import RunLayout

SCHEMA_PATH = Path(__file__).parents[1] / "schemas" / "report.schema.json"


def validate_report(report: dict) -> None:
    """Raise jsonschema.ValidationError if ``report`` breaks the contract."""
    import jsonschema

    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))


# Which batch size each channel is judged at: edge gateways forecast one series at a time,
# cloud services batch requests.
CHANNEL_BATCH = {"edge": 1, "cloud": 64}


def compare_families(models: list[dict], block: int = 1, *, per_series: dict | None = None) -> dict:
    """Paired comparison of the families that passed their gates, on the same origins.

    The most accurate family (lowest fp32 holdout MAE) is ``best``; each other family is
    tested against it (Diebold-Mariano on per-origin MAEs). A family whose difference is not
    significant is ``tied_with_best``: the choice between tied families is made by speed, not
    by a difference that may be noise.

    A fleet (``per_series``: ``{family: fp32 MASE per series}``, arrays aligned by series id,
    loaded from each family's per_series.parquet by the caller, NaN where a series is missing)
    is compared across series instead (``significance.paired_across_series``, block 1); its
    ``fp32_holdout_mae`` is the mean MASE.
    """
    import numpy as np

    from onnxcast.pipeline.significance import paired_across_series, paired_test

    def errors(m: dict):
        if per_series is not None:
            values = per_series.get(m["family"])
            return None if values is None else np.asarray(values, np.float64)
        fp32 = next((v for v in m["variants"] if v["name"] == "fp32"), None)
        values = (fp32 or {}).get("per_origin_mae")
        return np.asarray(values) if values else None

    passed = sorted((m for m in models if m["gates_passed"] and m.get("fp32_holdout_mae") is not None),
                    key=lambda m: m["fp32_holdout_mae"])
    if not passed:
        return {"best": None, "order": [], "tied_with_best": [], "tests": {}}
    best = passed[0]
    tests, tied = {}, [best["family"]]
    for m in passed[1:]:
        a, b = errors(m), errors(best)
        if a is None or b is None or len(a) != len(b):
            continue
        test = paired_across_series(a, b) if per_series is not None else paired_test(a, b, block)
        tests[m["family"]] = {"vs": best["family"], **test}
        if not tests[m["family"]]["significant"]:
            tied.append(m["family"])
    return {"best": best["family"], "order": [m["family"] for m in passed], "tied_with_best": tied,
            "tests": tests}


def select_variants(models: list[dict], family_choice: dict | None = None) -> tuple[dict, list[dict]]:
    """Choose a variant per channel by goals (as Microsoft Olive does).

    The family is the most accurate one (lowest fp32 holdout MAE) among those whose required
    gates passed; families statistically tied with it (``family_choice`` from
    ``compare_families``) rank with it, by speed. Within the family, per channel, the candidates are the eligible variants (their
    gates passed) whose ``accuracy_vs_fp32`` gate passed (the budget the validation used: the
    choice never re-derives a gate with another threshold) and
    whose p50 latency at the channel's batch (``CHANNEL_BATCH``) beats PyTorch eager measured
    in the same run; the fastest wins (ties: smaller file). When no variant of that family
    beats PyTorch for a channel, the next family is tried; when none does at all, the
    fastest eligible variant of the most accurate family is chosen and its ranking row says
    the latency goal was missed. Returns ``(selected, ranking)``: ``selected`` is
    ``{channel: {family, variant}}`` (empty when no family passed its gates), ``ranking``
    lists every candidate with its goal figures, its rank per channel and why it was or
    wasn't chosen.
    """
    ranking = [row for m in models for row in _ranking_rows(m)]
    passed = sorted((m for m in models if m["gates_passed"] and m.get("fp32_holdout_mae") is not None),
                    key=lambda m: m["fp32_holdout_mae"])
    families = [m["family"] for m in passed]
    tied = set((family_choice or {}).get("tied_with_best") or families[:1])

    def tier(family: str) -> int:
        return 0 if family in tied else 1 + families.index(family)

    selected: dict[str, dict] = {}
    for channel, batch in CHANNEL_BATCH.items():
        choice = _choose(ranking, channel, batch, families, tier)
        if choice is not None:
            choice["chosen_for"].append(channel)
            selected[channel] = {"family": choice["family"], "variant": choice["variant"]}
    assert not selected or set(selected) == set(CHANNELS)
    return selected, ranking


def _ranking_rows(model: dict) -> list[dict]:
    """The ranking rows of one family's variants: their goal figures, not yet ranked."""
    torch_latency = (model.get("torch") or {}).get("latency_ms", {})
    rows = []
    for v in model["variants"]:
        mae = v["holdout"]["mae"] if v.get("holdout") else None
        budget = (v.get("gates") or {}).get("accuracy_vs_fp32") or {}
        loss = budget.get("value")
        row = {"family": model["family"], "variant": v["name"], "eligible": bool(v.get("eligible")),
               "holdout_mae": mae, "accuracy_loss_vs_fp32": loss if isinstance(loss, float) else None,
               "within_accuracy_budget": bool(budget.get("passed")),
               "size_bytes": v["size_bytes"],
               "batch1_p50_ms": v["latency_ms"].get("batch1_p50"),
               "batch64_p50_ms": v["latency_ms"].get("batch64_p50"),
               "speedup_vs_torch": {}, "beats_torch": {}, "rank": {}, "chosen_for": [],
               "reasons": list(v.get("reasons", []))}
        for channel, batch in CHANNEL_BATCH.items():
            key = f"batch{batch}_p50"
            ours, theirs = v["latency_ms"].get(key), torch_latency.get(key)
            speedup = theirs / ours if ours and theirs else None
            row["speedup_vs_torch"][channel] = speedup
            row["beats_torch"][channel] = speedup is not None and speedup > 1.0
        rows.append(row)
    return rows


def _choose(ranking: list[dict], channel: str, batch: int, families: list[str], tier) -> dict | None:
    """Rank the qualified rows for ``channel`` (their ``rank``) and return the chosen one: the
    first qualified, else the fastest eligible variant of the most accurate family (its reasons
    say so), else None."""
    key = f"batch{batch}_p50_ms"

    def speed(row: dict) -> tuple[float, int]:
        latency = row[key]
        return (latency if latency is not None else float("inf"), row["size_bytes"])

    qualified = [r for r in ranking if r["family"] in families and r["eligible"]
                 and r["within_accuracy_budget"] and r["beats_torch"][channel]]
    # the best family and those tied with it first, by speed; then the others by accuracy
    qualified.sort(key=lambda r: (tier(r["family"]), *speed(r)))
    for position, row in enumerate(qualified, start=1):
        row["rank"][channel] = position
    if qualified:
        return qualified[0]
    fallback = [r for r in ranking if families and r["family"] == families[0] and r["eligible"]]
    if not fallback:
        return None
    choice = min(fallback, key=speed)
    choice["reasons"].append(f"{channel}: no variant beats PyTorch eager at batch {batch}; "
                             "chosen as the fastest eligible variant")
    return choice


def served_variant(report: dict, channel: str) -> tuple[dict, dict]:
    """The report's model entry and variant entry the channel was given."""
    chosen = (report.get("selected") or {}).get(channel)
    if not chosen:
        raise ConfigError(f"report: no variant selected for channel {channel!r}")
    for entry in report.get("models") or []:
        if entry.get("family") == chosen["family"]:
            for variant in entry.get("variants") or []:
                if variant.get("name") == chosen["variant"]:
                    return entry, variant
    raise ConfigError(f"report: channel {channel!r} names {chosen['family']}/{chosen['variant']}, "
                      "which the report's models do not hold")


# --- deployment targets (onnxcast.targets.step writes their evidence; docs/targets.md) -----------

def attach_targets(layout: RunLayout, targets: tuple[str, ...], models: list[dict], selected: dict) -> None:
    """Give every eligible variant its ``targets`` (the target step's records,
    ``layout.target_evidence``; x86_64 from its validation where the step wrote none) and every
    channel of ``selected`` the variant it runs per target (:func:`channel_targets`)."""
    for model in models:
        family = model["family"]
        found = {}
        for name in targets:
            path = layout.target_evidence(family, name)
            found[name] = read_json(path).get("variants", {}) if path.exists() else {}
        for variant in model["variants"]:
            if variant.get("eligible") is not True:
                continue
            variant["targets"] = {}
            for name in targets:
                record = found[name].get(variant["name"])
                if record is None:
                    record = reference_record(variant) if name == REFERENCE_TARGET else {
                        "status": UNAVAILABLE, "reason": f"the target step did not run {family}/{variant['name']} "
                        f"on {name} (no {path.name} under {path.parent.name}/)", "artifact": None, "sha256": None,
                        "size_bytes": None, "parity": None, "holdout": None, "latency_ms": {}, "latency_note": None,
                        "environment": {}}
                variant["targets"][name] = record
    by_family = {m["family"]: m for m in models}
    for choice in selected.values():
        choice["targets"], choice["targets_missing"] = channel_targets(by_family[choice["family"]], choice, targets)


def channel_targets(model: dict, choice: dict, targets: tuple[str, ...]) -> tuple[dict, dict]:
    """Per target, the variant a channel runs there: its own variant where validated on the target,
    else its family's fp32 where that is, else none (``missing``: target -> why)."""
    variants = {v["name"]: v for v in model["variants"]}
    family, chosen, missing = choice["family"], {}, {}
    for name in targets:
        tried = []
        for variant in dict.fromkeys((choice["variant"], "fp32")):
            record = ((variants.get(variant) or {}).get("targets") or {}).get(name) or {}
            if record.get("status") == VALIDATED:
                chosen[name] = {"family": family, "variant": variant}
                break
            tried.append(f"{family}/{variant}: {record.get('status', 'not run')}"
                         + (f" ({record['reason']})" if record.get("reason") else ""))
        else:
            missing[name] = "not validated on " + name + ": " + "; ".join(tried)
    return chosen, missing
