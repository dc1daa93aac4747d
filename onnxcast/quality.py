"""Data-quality gate (placeholder until the Great Expectations suite lands: issue 4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from onnxcast.config import PipelineConfig
from onnxcast.data import SeriesData, load_series


@dataclass
class QualityResult:
    series: SeriesData
    warnings: list[str] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    json_path: str | None = None
    html_path: str | None = None

    def to_dict(self) -> dict:
        return {"passed": True, "warnings": self.warnings, "checks": self.checks,
                "json_path": self.json_path, "html_path": self.html_path}


def check_data(cfg: PipelineConfig, out_dir: str | Path) -> QualityResult:
    """Read the data, check it and return the regular series; raise DataError/DataQualityError."""
    return QualityResult(series=load_series(cfg))
