"""The deployment-target evidence of a variant as report.json and the rollout manifest carry it
(docs/targets.md, "In the report and the manifest"): plain dicts, shared by the pipeline (the
report), the targets step (onnxcast.targets.step) and the manifest (onnxcast.rollout.promote),
which may not import each other. Standard library only.

A variant's ``targets`` in report.json: ``{NAME: record}``, a record holding ``status`` (one of
:data:`STATUSES`), ``reason``, ``artifact`` (run-relative path), ``sha256``, ``size_bytes``,
``parity`` (``vs_x86``, ``vs_torch``), ``holdout``, ``latency_ms``, ``latency_note`` and
``environment``. The manifest lists per artifact ``{"status", "evidence": {...}}``
(:func:`manifest_target`).
"""

from __future__ import annotations

REFERENCE_TARGET = "x86_64"  # where the pipeline validates every variant: the reference of the others

VALIDATED = "validated"      # ran there, and matched x86 (and PyTorch for fp32 variants) and its accuracy
UNVALIDATED = "unvalidated"  # declared only (cuda, tensorrt): never run here, never chosen by a device
UNSUPPORTED = "unsupported"  # the target's runtime cannot take this model
UNAVAILABLE = "unavailable"  # this machine lacks what the target needs, or its runtime crashed
FAILED = "failed"            # ran there and missed parity or accuracy
STATUSES = (VALIDATED, UNVALIDATED, UNSUPPORTED, UNAVAILABLE, FAILED)

# what the manifest's evidence of a target holds (a device reads these names: onnxcast-edge pull)
EVIDENCE_FIELDS = ("parity", "holdout", "latency_ms", "latency_note", "environment", "size_bytes")
DERIVED_ENVIRONMENT = {"derived_from": "the variant's validation: ONNX Runtime's CPU provider on the machine "
                                       "that trained it"}


def holdout_figures(holdout: dict | None) -> dict | None:
    """The point-forecast figures of a holdout entry (numbers only: no intervals, no lists)."""
    if not holdout:
        return None
    return {k: v for k, v in holdout.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def reference_record(variant: dict, environment: dict | None = None) -> dict:
    """The x86_64 record of a validated variant entry of report.json: the pipeline validated it
    there (parity with PyTorch, holdout, latency), so its evidence is the validation's. A variant
    that is not eligible is ``failed`` with its reasons."""
    gates = variant.get("gates") or {}
    parity_gate = gates.get("parity") or {}
    eligible = variant.get("eligible") is True
    return {
        "status": VALIDATED if eligible else FAILED,
        "reason": None if eligible else "; ".join(variant.get("reasons") or ["not eligible"]),
        "artifact": variant.get("onnx_path"), "sha256": variant.get("sha256"),
        "size_bytes": variant.get("size_bytes"),
        "parity": {"vs_x86": {"judged": False, "reason": "x86_64 is the reference"},
                   "vs_torch": {"judged": variant.get("parity_max_abs_diff") is not None,
                                "passed": parity_gate.get("passed"),
                                "worst_tolerance_ratio": parity_gate.get("value"),
                                "max_abs_diff": variant.get("parity_max_abs_diff")}},
        "holdout": holdout_figures(variant.get("holdout")),
        "latency_ms": variant.get("latency_ms") or {},
        "latency_note": None,
        "environment": dict(environment or DERIVED_ENVIRONMENT),
    }


def manifest_target(record: dict) -> dict:
    """A target's entry in a manifest artifact: its status and the evidence behind it."""
    entry = {"status": record.get("status"),
             "evidence": {name: record.get(name) for name in EVIDENCE_FIELDS}}
    if record.get("reason"):
        entry["evidence"]["reason"] = record["reason"]
    if record.get("recipe"):
        entry["evidence"]["recipe"] = record["recipe"]
    return entry


def variant_targets(variant: dict) -> dict:
    """``{NAME: record}`` of a report variant: its ``targets``, or for a report from before
    targets the x86_64 record derived from its validation."""
    targets = variant.get("targets")
    if isinstance(targets, dict) and targets:
        return targets
    return {REFERENCE_TARGET: reference_record(variant)}
