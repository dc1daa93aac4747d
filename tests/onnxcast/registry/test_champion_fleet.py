"""Champion/challenger between fleet models: mean MASE, a paired test across series, and
"not comparable" for a champion that is not a global model of the same fleet shape. The
champion is a real version in a real MLflow store (SQLite in tmp)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fleet_run_fixtures import add_intervals, build_fleet_run, fleet_tracking_uri  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

MODEL = "fleet-m"


@pytest.fixture(scope="module")
def registry(tmp_path_factory, fleet_tracking_uri):  # noqa: F811
    """A champion: a fleet run of nhits (MASE ratio 0.9 to the seasonal naive), logged,
    registered and promoted. Returns (tracking_uri, its run directory, its version)."""
    from onnxcast.registry.tracking import log_pipeline_run, register_model, set_champion

    root = tmp_path_factory.mktemp("fleet-champion")
    uri = fleet_tracking_uri
    run = add_intervals(build_fleet_run(root / "champion-run", skills={"nhits": 0.9}, noise=0.1), {"nhits": 1.0})
    tracked = log_pipeline_run(run, model_name=MODEL, run_key="dag/champion", families=["nhits"], tracking_uri=uri)
    version = register_model(run, tracked, model_name=MODEL, run_key="dag/champion", tracking_uri=uri)
    set_champion(MODEL, version.version, record={"by": "test"}, tracking_uri=uri)
    return uri, run, version.version


def challenger_run(tmp_path: Path, champion_run: Path, version: str, skill: float, *, noise: float = 0.1,
                   evaluated: bool = True) -> Path:
    """A challenger run (dlinear) with the champion evaluated in it: the champion's files from its
    own run stand for "validated again on this run's series" (same series and origins here)."""
    run = build_fleet_run(tmp_path / "run", skills={"dlinear": skill}, noise=noise, noise_seed=7,
                          champion={"family": "champion", "source": f"models:/{MODEL}/{version}", "role": "champion",
                                    "version": version})
    if evaluated:
        shutil.copytree(champion_run / "models" / "nhits", run / "models" / "champion")
    return run


def test_a_better_global_challenger_wins_on_paired_series(registry, tmp_path):
    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    decision = decide(challenger_run(tmp_path, champion_run, version, 0.7), tracking_uri=uri)
    champion_mase = json.loads((champion_run / "report.json").read_text())["fleet"]["families"]["nhits"]["fp32"]
    assert decision["promote"] is True, decision["reason"]
    assert decision["metric"] == "mase" and decision["champion_mase"] == pytest.approx(champion_mase["mase_mean"])
    assert decision["challenger_mae"] == decision["challenger_mase"] < decision["champion_mase"]
    assert decision["paired_test"]["origins"] == 60 and decision["paired_test"]["p_value"] < 0.05
    assert decision["paired_test"]["robust_p"] < 0.05
    assert decision["comparison"] == "paired across 60 series (this run's series and origins)"
    assert "mean MASE" in decision["reason"] and "across series" in decision["reason"]


def test_a_worse_or_equal_challenger_keeps_the_champion(registry, tmp_path):
    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    worse = decide(challenger_run(tmp_path / "a", champion_run, version, 1.0), tracking_uri=uri)
    assert worse["promote"] is False and "does not beat" in worse["reason"]
    # 6 % lower on average, but the series disagree (p ~0.37 with these draws)
    noisy = decide(challenger_run(tmp_path / "b", champion_run, version, 0.78, noise=0.6), tracking_uri=uri)
    assert noisy["challenger_mase"] < noisy["champion_mase"] and noisy["paired_test"]["p_value"] > 0.05
    assert noisy["promote"] is False and "not significantly" in noisy["reason"]


def _blow_up(run: Path, family: str, series: int) -> None:
    """The challenger's fp32 MASE infinite on its first ``series`` series (a forecast that blew up)."""
    import numpy as np
    import pandas as pd

    path = run / "models" / family / "per_series.parquet"
    table = pd.read_parquet(path)
    table.loc[: series - 1, "fp32.mase"] = np.inf
    table.to_parquet(path, index=False)


def test_the_paired_test_leaves_out_non_finite_series_and_counts_the_finite_ones(registry, tmp_path):
    """Issue 31 (T16): the champion decision tests across series as the pipeline does
    (significance.paired_across_series): a series with an infinite MASE is left out, not
    turned into a NaN p-value that keeps the champion whatever the other series say, and the
    minimum of paired series counts the finite pairs."""
    from onnxcast.pipeline.significance import MIN_PAIRED_SERIES
    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    run = challenger_run(tmp_path / "one", champion_run, version, 0.7)
    _blow_up(run, "dlinear", 1)
    decision = decide(run, tracking_uri=uri)
    test = decision["paired_test"]
    assert test["series"] == test["origins"] == 59 and test["min_series"] == MIN_PAIRED_SERIES
    assert test["p_value"] < 0.05 and test["significant"] and test["robust_p"] < 0.05
    assert decision["promote"] is True and "on 59 paired series" in decision["reason"], decision["reason"]
    assert decision["comparison"] == "paired across 59 series (this run's series and origins)"

    few = challenger_run(tmp_path / "few", champion_run, version, 0.7)
    _blow_up(few, "dlinear", 60 - (MIN_PAIRED_SERIES - 1))
    decision = decide(few, tracking_uri=uri)
    assert decision["paired_test"]["series"] == MIN_PAIRED_SERIES - 1 and decision["paired_test"]["p_value"] is None
    assert decision["promote"] is False and "fewer than" in decision["reason"], decision["reason"]


def test_without_a_local_table_the_champion_table_comes_from_mlflow(registry, tmp_path):
    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    run = challenger_run(tmp_path, champion_run, version, 0.7)
    (run / "models/champion/per_series.parquet").unlink()
    decision = decide(run, tracking_uri=uri)
    assert decision["promote"] is True and decision["paired_test"]["origins"] == 60
    assert "from its own MLflow run" in decision["comparison"]


def test_a_champion_not_evaluated_in_this_run_is_judged_on_its_registered_figures(registry, tmp_path):
    """Its mean MASE and interval from its version's tags, its per-series table from its MLflow run."""
    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    decision = decide(challenger_run(tmp_path, champion_run, version, 0.7, evaluated=False), tracking_uri=uri)
    fp32 = json.loads((champion_run / "report.json").read_text())["fleet"]["families"]["nhits"]["fp32"]
    assert decision["champion_mase"] == pytest.approx(fp32["mase_mean"])
    assert decision["champion_mase_ci95"] == pytest.approx(fp32["mase_ci95"])
    assert decision["champion_family"] == "nhits" and "not evaluated in this run" in decision["champion_figures"]
    assert decision["promote"] is True and "from its own MLflow run" in decision["comparison"]


def test_without_per_series_tables_only_the_aggregates_are_compared(registry, tmp_path):
    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    run = challenger_run(tmp_path, champion_run, version, 0.7)
    (run / "models/dlinear/per_series.parquet").unlink()
    decision = decide(run, tracking_uri=uri)
    assert decision["paired_test"] is None and decision["comparison"].startswith("aggregate only")
    overlap = decision["challenger_mase_ci95"][1] >= decision["champion_mase_ci95"][0]
    assert decision["promote"] is (not overlap)
    assert "aggregate only" in decision["reason"]


def test_a_champion_that_is_not_a_global_model_is_not_comparable(registry, tmp_path):
    """A version from before fleet mode (no onnxcast.global tag): its MAE is one series' MAE."""
    from onnxcast.registry.champion import decide
    from onnxcast.registry.tracking import client_for

    uri, champion_run, _ = registry
    client = client_for(uri)
    experiment = client.get_experiment_by_name(MODEL).experiment_id
    run_id = client.create_run(experiment).info.run_id
    old = client.create_model_version(MODEL, f"runs:/{run_id}/model", run_id,
                                      tags={"onnxcast.family": "lstm", "onnxcast.fp32_holdout_mae": "451.2"})
    run = challenger_run(tmp_path, champion_run, old.version, 0.7)
    decision = decide(run, tracking_uri=uri)
    assert decision["promote"] is False and decision["comparison"] == "not comparable"
    assert decision["differences"] == {"global": [False, True]}
    assert "onnxcast_promote" in decision["reason"] and decision["champion_mae"] is None
    assert decide(run, tracking_uri=uri, require_beats_champion=False)["promote"] is True


def test_a_champion_of_another_series_column_or_judged_on_mae_is_not_comparable(registry, tmp_path):
    from onnxcast.registry.champion import decide
    from onnxcast.registry.tracking import client_for

    uri, champion_run, version = registry
    client = client_for(uri)
    client.set_model_version_tag(MODEL, version, "onnxcast.series_column", "meter_id")
    try:
        decision = decide(challenger_run(tmp_path / "a", champion_run, version, 0.7), tracking_uri=uri)
    finally:
        client.set_model_version_tag(MODEL, version, "onnxcast.series_column", "unique_id")
    assert decision["promote"] is False and decision["differences"] == {"series_column": ["meter_id", "unique_id"]}

    run = challenger_run(tmp_path / "b", champion_run, version, 0.7)
    validation = run / "models/champion/validation.json"
    entry = json.loads(validation.read_text())
    del entry["fleet"]  # judged on one series' MAE: never compared with a mean MASE
    validation.write_text(json.dumps(entry))
    decision = decide(run, tracking_uri=uri)
    assert decision["promote"] is False and decision["differences"] == {"metric": ["mae (one series)", "mase"]}


def test_no_champion_promotes_a_fleet_challenger(tmp_path):
    from onnxcast.registry.champion import decide

    run = build_fleet_run(tmp_path / "run", skills={"dlinear": 0.9})
    decision = decide(run)
    assert decision["promote"] is True and decision["metric"] == "mase"
    assert "no champion registered" in decision["reason"]


# --- champion_metric "msis": the 95% interval's mean scaled interval score ------------------

def msis_run(tmp_path: Path, champion_run: Path, version: str, msis_skill: float, **kwargs) -> Path:
    """A challenger run (dlinear, MASE 0.7 of the naive's) whose fp32 95% MSIS is ``msis_skill``
    of the champion's typical one, per series, on the same series."""
    return add_intervals(challenger_run(tmp_path, champion_run, version, 0.7, **kwargs), {"dlinear": msis_skill},
                         noise_seed=5)


def test_on_msis_a_challenger_with_better_intervals_wins_paired_across_series(registry, tmp_path):
    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    run = msis_run(tmp_path, champion_run, version, 0.8)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "champion_metric": "msis"}))  # the run's setting
    decision = decide(run, tracking_uri=uri)
    champion = json.loads((champion_run / "report.json").read_text())["fleet"]["families"]["nhits"]["fp32"]
    assert decision["metric"] == "msis" and decision["promote"] is True, decision["reason"]
    assert decision["champion_msis_95"] == pytest.approx(champion["intervals"]["msis_95"])
    assert decision["challenger_msis_95"] < decision["champion_msis_95"]
    assert decision["improvement"] == pytest.approx(1 - decision["challenger_msis_95"] / decision["champion_msis_95"])
    assert decision["comparison"] == "paired across 60 series (this run's series and origins)"
    assert decision["paired_test"]["p_value"] < 0.05 and "MSIS (95% interval)" in decision["reason"]
    assert json.loads((run / "champion_challenger.json").read_text()) == decision


def test_on_msis_better_point_forecasts_do_not_win_with_worse_intervals(registry, tmp_path):
    """The same challenger wins on MASE and loses on MSIS: the metric decides."""
    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    run = msis_run(tmp_path, champion_run, version, 1.3)
    assert decide(run, tracking_uri=uri)["promote"] is True  # the run's setting: mase
    decision = decide(run, tracking_uri=uri, metric="msis")
    assert decision["promote"] is False and "does not beat" in decision["reason"]
    assert decision["challenger_msis_95"] > decision["champion_msis_95"]


def test_on_msis_a_champion_without_interval_figures_is_not_comparable(registry, tmp_path):
    """A champion evaluated before forecast distributions: no msis_95 anywhere, never a crash."""
    import pandas as pd

    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    run = msis_run(tmp_path, champion_run, version, 0.8)
    validation = run / "models/champion/validation.json"
    entry = json.loads(validation.read_text())
    for variant in entry["variants"]:
        variant["holdout"].pop("intervals")
        entry["fleet"]["variants"][variant["name"]].pop("intervals")
    validation.write_text(json.dumps(entry))
    table = pd.read_parquet(run / "models/champion/per_series.parquet")
    table[[c for c in table.columns if not c.endswith(("msis_95", "msis_80", "coverage_80", "coverage_95",
                                                       "pinball"))]].to_parquet(
        run / "models/champion/per_series.parquet", index=False)
    decision = decide(run, tracking_uri=uri, metric="msis")
    assert decision["promote"] is False and decision["comparison"] == "not comparable on msis"
    assert decision["champion_msis_95"] is None and "no fp32 95% interval figures" in decision["msis_missing"]
    assert decision["reason"].startswith(f"not comparable on msis: champion v{version} has no fp32 95% interval")
    assert decide(run, tracking_uri=uri, metric="msis", require_beats_champion=False)["promote"] is True


def test_on_msis_without_per_series_columns_only_the_aggregates_are_compared(registry, tmp_path):
    """The challenger's table lacks the interval columns: aggregate only, and with no interval
    of the mean MSIS nothing shows the difference is more than noise."""
    import pandas as pd

    from onnxcast.registry.champion import decide

    uri, champion_run, version = registry
    run = msis_run(tmp_path, champion_run, version, 0.8)
    path = run / "models/dlinear/per_series.parquet"
    pd.read_parquet(path).drop(columns=["fp32.msis_95"]).to_parquet(path, index=False)
    decision = decide(run, tracking_uri=uri, metric="msis")
    assert decision["paired_test"] is None
    assert decision["comparison"].startswith("aggregate only (the challenger's per-series table has no column "
                                             "'fp32.msis_95')")
    assert decision["challenger_msis_95"] < decision["champion_msis_95"]
    assert decision["promote"] is False and "not significantly" in decision["reason"]


def test_on_msis_a_champion_not_evaluated_in_this_run_is_judged_on_its_registered_figures(registry, tmp_path):
    """Its MSIS from its version's tag, its per-series table (with fp32.msis_95) from its MLflow run."""
    from onnxcast.registry.champion import decide
    from onnxcast.registry.tracking import client_for

    uri, champion_run, version = registry
    tags = client_for(uri).get_model_version(MODEL, version).tags
    fp32 = json.loads((champion_run / "report.json").read_text())["fleet"]["families"]["nhits"]["fp32"]
    assert float(tags["onnxcast.fp32_msis_95"]) == pytest.approx(fp32["intervals"]["msis_95"])
    assert float(tags["onnxcast.fp32_coverage_80"]) == pytest.approx(fp32["intervals"]["coverage_80"])
    decision = decide(msis_run(tmp_path, champion_run, version, 0.8, evaluated=False), tracking_uri=uri, metric="msis")
    assert decision["champion_msis_95"] == pytest.approx(fp32["intervals"]["msis_95"])
    assert decision["promote"] is True and "from its own MLflow run" in decision["comparison"]
    assert decision["paired_test"]["origins"] == 60
