"""The layout of a run directory: one place that names every file the steps hand each other.

A run directory is a local folder: the CLI's output folder, or the scratch folder an
Airflow task staged from the run store (:mod:`onnxcast.runstore`). Every module that
reads or writes a run's files asks a :class:`RunLayout` for the path::

    config.json                                   the run's settings (prepare_data)
    plan.json                                     families and where they come from (data check)
    data/fleet/, dataset.json                     the checked series (a FleetData, one or many) and the split
    data/baselines.json                           baselines and the statistical reference
    quality/                                      the data-quality report
    models/<family>/model.pt, model.json          trained or fetched model
    models/<family>/skipped.json                  why a family was not made (the ensemble, < 2 members)
    models/<family>/onnx/<variant>.onnx           fp32 (export), fp32-opt/int8/fp16 (optimize)
    models/<family>/onnx/variants.json            the variants optimize made
    models/<family>/validation.json               validate
    report.json | failed-report.json              the report (written last)
    champion_challenger.json                      the champion/challenger decision
    staged.json                                   a registered version laid out again (promote DAG)
    plots/                                        figures logged to MLflow

Fleet mode (``series_column`` set, docs/fleet.md) adds::

    data/shards.json                              shards of series (check_data)
    data/shards/<k>/rows.parquet                  the shard's raw rows (check_data)
    data/shards/<k>/                              the shard's checked series, a FleetData (check_series)
    quality/shards/<k>/                           the shard's per-series GX results (check_series)
    quality/series.parquet                        one row per series, with why it was excluded (merge)
    data/reference/shards/<k>.parquet             baselines and the statistical reference per series
    data/reference/per_series.parquet             the same for every series (merged)
    models/<family>/shards/<k>.parquet            every variant's errors per series of shard k
    models/<family>/per_series.parquet            the same for every series (validate)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPORT = "report.json"
FAILED_REPORT = "failed-report.json"


@dataclass(frozen=True)
class RunLayout:
    """Paths inside the run directory ``root``."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def dataset(self) -> Path:
        return self.data / "dataset.json"

    @property
    def baselines(self) -> Path:
        return self.data / "baselines.json"

    @property
    def quality(self) -> Path:
        return self.root / "quality"

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def trigger(self) -> Path:
        """Why the run was started when not by the schedule or a person: the monitor's retraining
        event (onnxcast.airflow.retraining), the report's ``trigger``."""
        return self.root / "trigger.json"

    @property
    def failed_report(self) -> Path:
        return self.root / FAILED_REPORT

    @property
    def decision(self) -> Path:
        return self.root / "champion_challenger.json"

    @property
    def staged(self) -> Path:
        return self.root / "staged.json"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def models(self) -> Path:
        return self.root / "models"

    def family(self, family: str) -> Path:
        return self.models / family

    def model_pt(self, family: str) -> Path:
        return self.family(family) / "model.pt"

    def model_json(self, family: str) -> Path:
        return self.family(family) / "model.json"

    def validation(self, family: str) -> Path:
        return self.family(family) / "validation.json"

    def skipped(self, family: str) -> Path:
        """Why ``family`` was not made (``{"family", "reason"}``: the ensemble with fewer than two members)."""
        return self.family(family) / "skipped.json"

    def onnx_dir(self, family: str) -> Path:
        return self.family(family) / "onnx"

    def onnx(self, family: str, variant: str = "fp32") -> Path:
        return self.onnx_dir(family) / f"{variant}.onnx"

    def variants(self, family: str) -> Path:
        return self.onnx_dir(family) / "variants.json"

    def targets_dir(self, family: str) -> Path:
        """The family's deployment-target evidence (onnxcast.targets.step) and compiled artifacts."""
        return self.family(family) / "targets"

    def target_evidence(self, family: str, target: str) -> Path:
        """The evidence of every eligible variant of ``family`` on ``target``."""
        return self.targets_dir(family) / f"{target}.json"

    def target_artifacts(self, family: str, target: str, variant: str) -> Path:
        """What a target compiles of a variant (TVM's libraries)."""
        return self.targets_dir(family) / target / variant

    # --- fleet mode ---------------------------------------------------------------------------

    @property
    def fleet(self) -> Path:
        return self.data / "fleet"

    @property
    def shards(self) -> Path:
        return self.data / "shards.json"

    def shard(self, shard: int) -> Path:
        return self.data / "shards" / f"{int(shard):03d}"

    def shard_rows(self, shard: int) -> Path:
        return self.shard(shard) / "rows.parquet"

    def quality_shard(self, shard: int) -> Path:
        return self.quality / "shards" / f"{int(shard):03d}"

    @property
    def series_table(self) -> Path:
        return self.quality / "series.parquet"

    @property
    def reference(self) -> Path:
        return self.data / "reference"

    def reference_shard(self, shard: int) -> Path:
        return self.reference / "shards" / f"{int(shard):03d}.parquet"

    @property
    def reference_table(self) -> Path:
        return self.reference / "per_series.parquet"

    def family_shard(self, family: str, shard: int) -> Path:
        return self.family(family) / "shards" / f"{int(shard):03d}.parquet"

    def per_series(self, family: str) -> Path:
        return self.family(family) / "per_series.parquet"

    def family_of(self, relative: str) -> str | None:
        """The family a run-relative path belongs to (``models/<family>/...``), else None."""
        parts = Path(relative).parts
        return parts[1] if len(parts) > 2 and parts[0] == "models" else None
