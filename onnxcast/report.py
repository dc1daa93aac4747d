"""The validation report (``report.json``, a contract: docs/report.schema.json) and choosing
variants per channel."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from onnxcast.config import CHANNELS

SCHEMA_PATH = Path(__file__).parent / "schemas" / "report.schema.json"


def write_json(path: str | Path, value: Any) -> Path:
    """Write JSON atomically: readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def validate_report(report: dict) -> None:
    """Raise jsonschema.ValidationError if ``report`` breaks the contract."""
    import jsonschema

    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))


def select_variants(models: list[dict]) -> tuple[dict, list[dict]]:
    """Choose a variant per channel from the most accurate family whose gates passed.

    ``edge``: the smallest eligible variant (ties: faster at batch 1). ``cloud``: the
    eligible variant fastest at batch 64. Returns ``(selected, ranking)``; the ranking lists
    every candidate with its figures and why it was or wasn't chosen.
    """
    passed = [m for m in models if m["gates_passed"]]
    ranking = []
    for m in models:
        for v in m["variants"]:
            ranking.append({"family": m["family"], "variant": v["name"], "eligible": v["eligible"],
                            "holdout_mae": v["holdout"]["mae"] if v.get("holdout") else None,
                            "size_bytes": v["size_bytes"],
                            "batch1_p50_ms": v["latency_ms"].get("batch1_p50"),
                            "batch64_p50_ms": v["latency_ms"].get("batch64_p50"),
                            "reasons": v.get("reasons", [])})
    if not passed:
        return {}, ranking
    best = min(passed, key=lambda m: m["fp32_holdout_mae"])
    eligible = [v for v in best["variants"] if v["eligible"]]
    edge = min(eligible, key=lambda v: (v["size_bytes"], v["latency_ms"]["batch1_p50"]))
    cloud = min(eligible, key=lambda v: v["latency_ms"]["batch64_p50"])
    selected = {"edge": {"family": best["family"], "variant": edge["name"]},
                "cloud": {"family": best["family"], "variant": cloud["name"]}}
    assert set(selected) == set(CHANNELS)
    for row in ranking:
        row["chosen_for"] = [c for c, s in selected.items()
                             if s["family"] == row["family"] and s["variant"] == row["variant"]]
    return selected, ranking
