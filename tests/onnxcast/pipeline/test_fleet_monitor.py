"""The production monitor of a fleet model on real data: 80 M3 monthly series (tests/real_panels.py,
the series of at least 120 months, a seeded sample), a tiny global DLinear trained on every series
up to 1998-07 (its holdout: each series' last 18 months before then) and judged per series on the
18 months after (the competition's own test period), as they are (not degraded, no drift) and with a change on most series after
training (degraded, the changed series named as the worst, drift in ``y``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from fleet_run_fixtures import fleet_tracking_uri  # noqa: F401  (fixture)

from onnxcast.pipeline.monitor import (
    MIN_SERIES,
    MonitorInput,
    degradation_test,
    holdout_per_series,
    monitor,
    reasons,
)
from onnxcast.registry.monitoring import TAG_FIELDS

TRAINED_UNTIL = "1998-07-01"  # the 18 months after: M3's official test period
N_SERIES = 80


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    """The M3 monthly series of at least 120 months, a seeded sample of 80, and the rest."""
    from real_panels import load_panel

    whole = load_panel("m3-monthly")
    lengths = whole.frame.groupby("unique_id").size()
    long = sorted(lengths[lengths >= 120].index)
    picked = set(np.random.default_rng(0).choice(long, N_SERIES, replace=False))
    frame = whole.frame[whole.frame["unique_id"].isin(picked)]
    others = whole.frame[whole.frame["unique_id"].isin(sorted(set(long) - picked)[:3])]
    path = tmp_path_factory.mktemp("m3") / "m3-monthly.csv"
    frame.to_csv(path, index=False)
    return {"panel": whole, "frame": frame, "others": others, "path": str(path)}


@pytest.fixture(scope="module")
def deployed(panel, tmp_path_factory) -> dict:
    """A real fleet run of the pipeline (about 17 s on 2 cores): report, served ONNX file, table."""
    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.run import run_pipeline

    out = tmp_path_factory.mktemp("fleet-run")
    cfg = PipelineConfig.from_dict(panel["panel"].settings(
        data_uri=panel["path"], out_dir=str(out), trained_until=TRAINED_UNTIL, models=["dlinear"], max_epochs=2,
        hidden_size=16, num_layers=1, lookback=36, fleet_windows_per_epoch=2000, reference_max_series=4,
        fleet_shards=1, latency_repeats=3, coverage_tolerance=0.3))
    run_pipeline(cfg)
    report = json.loads((out / "report.json").read_text())
    chosen = report["selected"]["edge"]
    family = out / "models" / chosen["family"]
    return {"report": report, "model": family / "onnx" / f"{chosen['variant']}.onnx",
            "table": family / "per_series.parquet", "variant": chosen["variant"]}


def judge(deployed, tmp_path, data: str | None = None, *, table: bool = True) -> dict:
    started = time.monotonic()
    result = monitor(MonitorInput(deployed["model"], deployed["report"], "edge", data,
                                  deployed["table"] if table else None), tmp_path / "work")
    print(f"fleet monitor: {time.monotonic() - started:.2f}s, {result['fleet']['series']} series, "
          f"{result['origins']} origins, realised {result['mase']:.4g} vs holdout {result['holdout_mase']:.4g} "
          f"{result['holdout_ci']}, p={result['p_value']:.3g}, degraded {result['degraded']}, drift {result['drift']}")
    return result


def changed(panel, folder: Path, name: str, change, share: float = 0.8, seed: int = 1) -> tuple[str, set[str]]:
    """The panel with ``change(y)`` applied after training on a seeded ``share`` of the series."""
    import pandas as pd

    frame = panel["frame"].copy()
    ids = sorted(frame["unique_id"].unique())
    hit = set(np.random.default_rng(seed).choice(ids, int(share * len(ids)), replace=False))
    rows = (pd.to_datetime(frame["ds"]) > pd.Timestamp(TRAINED_UNTIL)) & frame["unique_id"].isin(hit)
    frame.loc[rows, "y"] = change(frame.loc[rows, "y"].to_numpy())
    path = folder / f"{name}.csv"
    frame.to_csv(path, index=False)
    return str(path), hit


@pytest.mark.slow  # the module's model is trained once (about 17 s)
class TestHealthyFleet:
    def test_not_degraded_and_no_drift(self, deployed, tmp_path):
        result = judge(deployed, tmp_path)
        assert result["fleet"]["series"] == N_SERIES and result["fleet"]["left_out"] == 0
        assert result["from"].startswith("1998-08") and result["to"].startswith("2000-01")
        assert result["degraded"] is False and result["p_value"] > 0.05, result["test"]
        assert result["drift"] == [], [c for c in result["drift_check"]["checks"] if not c["passed"]]
        assert reasons(result) == []
        # what the version tag, the rollout page and retrain_signal read is there
        assert set(TAG_FIELDS) - {"at", "run_id"} <= set(result)
        assert {"baseline_mase", "new_rows", "channel", "family", "variant"} <= set(result)  # monitor_channel's summary

    def test_figures_beside_the_holdouts_own(self, deployed, tmp_path):
        import pandas as pd

        result = judge(deployed, tmp_path)
        aggregate = deployed["report"]["fleet"]["families"]["dlinear"][deployed["variant"]]
        assert result["holdout_mase"] == pytest.approx(aggregate["mase_mean"])
        assert result["holdout_ci"] == pytest.approx(aggregate["mase_ci95"])
        table = pd.read_parquet(deployed["table"])
        assert result["fleet"]["holdout_mase_judged"] == pytest.approx(table[f"{deployed['variant']}.mase"].mean())
        # 18 new months, horizon 18: one origin per series, the same for all (end-aligned), one time
        assert result["origins"] == N_SERIES and len(result["origin_times"]) == len(result["per_origin_mase"]) == 1
        assert result["per_origin_mase"][0] == pytest.approx(result["mase"])
        worst = result["fleet"]["worst"]
        assert len(worst) == 10 and [w["ratio"] for w in worst] == sorted((w["ratio"] for w in worst), reverse=True)
        assert result["baseline"] == deployed["report"]["baselines"]["seasonal_naive"]["name"]

    def test_recomputed_holdout_is_the_pipelines_per_series_table(self, deployed, tmp_path):
        """Without the table, the monitor recomputes each series' holdout MASE and scale with the
        served file: the same numbers as the pipeline's evaluation."""
        import pandas as pd

        from onnxcast.pipeline.data import parse_utc
        from onnxcast.pipeline.monitor import _runner, read_fleet
        from onnxcast.pipeline.sessions import open_model

        cfg, fleet, _ = read_fleet(deployed["report"], None, tmp_path)
        cut = parse_utc(TRAINED_UNTIL)
        first = np.array([np.searchsorted(fleet.timestamps(i), cut, side="right") for i in range(fleet.n_series)])
        session, _ = open_model(deployed["model"])
        ours, source = holdout_per_series(cfg, fleet, first, deployed["variant"], _runner(session), cfg.lookback, None)
        table = pd.read_parquet(deployed["table"]).set_index("series")
        assert source == "recomputed" and sorted(ours) == sorted(table.index)
        np.testing.assert_allclose([ours[s]["mase"] for s in table.index], table[f"{deployed['variant']}.mase"],
                                   rtol=1e-5)
        np.testing.assert_allclose([ours[s]["scale"] for s in table.index], table["mase_scale"], rtol=1e-9)
        assert judge(deployed, tmp_path, table=False)["p_value"] == pytest.approx(judge(deployed, tmp_path)["p_value"])


@pytest.mark.slow  # the module's model is trained once (about 17 s)
class TestChangedFleet:
    def test_a_change_on_most_series_is_degraded_and_names_them(self, panel, deployed, tmp_path):
        data, hit = changed(panel, tmp_path, "scaled", lambda y: 1.3 * y)
        result = judge(deployed, tmp_path, data)
        assert result["degraded"] is True and result["p_value"] < 0.01, result["test"]
        worst = [w["series"] for w in result["fleet"]["worst"]]
        assert set(worst) <= hit, set(worst) - hit
        assert result["drift"] == ["y"]
        lines = reasons(result)
        assert any("worse than their holdout" in line and worst[0] in line for line in lines), lines
        assert any("input drift in 'y'" in line for line in lines)

    def test_small_level_changes_on_most_series_are_seen(self, panel, deployed, tmp_path):
        """+2%, +5%, +10% on 80% of the series after training (the figures of docs/airflow.md):
        each degraded, the evidence growing with the change, the changed series named worst."""
        p_values = []
        for factor in (1.02, 1.05, 1.1):
            data, hit = changed(panel, tmp_path, f"x{factor}", lambda y, f=factor: f * y)
            result = judge(deployed, tmp_path / str(factor), data)
            worst = [w["series"] for w in result["fleet"]["worst"]]
            print(f"  x{factor}: worse share {result['fleet']['worse_share']:.2f}, {len(set(worst) & hit)}/10 of the "
                  f"worst changed, baseline {result['baseline_mase']:.4g} (holdout {result['holdout_baseline_mase']:.4g})")
            assert result["degraded"] is True, (factor, result["test"])
            assert len(set(worst) & hit) >= 8, (factor, worst)
            p_values.append(result["p_value"])
        assert p_values == sorted(p_values, reverse=True)

    def test_unseen_and_too_short_series_are_left_out_with_their_reason(self, panel, deployed, tmp_path):
        import pandas as pd

        frame = pd.concat([panel["frame"], panel["others"]], ignore_index=True)
        short = sorted(panel["frame"]["unique_id"].unique())[:2]
        cut = pd.Timestamp(TRAINED_UNTIL) + pd.DateOffset(months=10)  # 10 new months: fewer than the horizon
        frame = frame[~(frame["unique_id"].isin(short) & (pd.to_datetime(frame["ds"]) > cut))]
        path = tmp_path / "with-others.csv"
        frame.to_csv(path, index=False)
        result = judge(deployed, tmp_path, str(path))
        fleet = result["fleet"]
        assert fleet["left_out_because"] == {"not_in_training": 3, "too_short": 2}
        assert fleet["series"] == N_SERIES - 2
        named = {e["series"]: e["because"] for e in fleet["left_out_series"]}
        assert {named[s] for s in short} == {"too_short"}
        assert {named[s] for s in panel["others"]["unique_id"].unique()} == {"not_in_training"}
        assert result["p_value"] is not None

    def test_no_new_data_judges_nothing(self, panel, deployed, tmp_path):
        import pandas as pd

        frame = panel["frame"]
        path = tmp_path / "old.csv"
        frame[pd.to_datetime(frame["ds"]) <= pd.Timestamp(TRAINED_UNTIL)].to_csv(path, index=False)
        result = monitor(MonitorInput(deployed["model"], deployed["report"], "edge", str(path), deployed["table"]),
                         tmp_path / "work")
        assert (result["origins"], result["degraded"], result["mase"], result["drift"]) == (0, False, None, [])
        assert result["fleet"]["left_out_because"] == {"too_short": N_SERIES} and reasons(result) == []

    def test_one_series_left_to_judge_is_judged_on_its_origins(self, panel, deployed, tmp_path):
        """Issue 31: the sample chooses the test. One series of the fleet, three times larger after
        training: judged over its origins (batch means), not across one series. M3's 18 new
        months make one origin at horizon 18, too few to judge (and the holdout of a global model
        records no per-origin errors to compare with)."""
        frame = panel["frame"]
        one = frame[frame["unique_id"] == sorted(frame["unique_id"].unique())[0]].copy()
        path, _ = changed({"frame": one}, tmp_path, "one", lambda y: 3.0 * y, share=1.0)
        result = monitor(MonitorInput(deployed["model"], deployed["report"], "edge", path, deployed["table"]),
                         tmp_path / "work")
        assert result["fleet"]["judged"] == 1 and result["origins"] == len(result["per_origin_mase"]) > 0
        assert result["test"]["test"].startswith("t on batch means") and result["test"]["origins"] == result["origins"]
        assert result["degraded"] is False and result["test"]["note"].endswith("not judged")
        assert "min_series" not in result["test"] and result["drift"] == ["y"]  # the drift check still sees it

    def test_the_monitor_plot_draws_a_fleet(self, deployed, tmp_path):
        from onnxcast.registry.monitoring import plot_monitor

        path = plot_monitor(judge(deployed, tmp_path), tmp_path / "monitor.png")
        assert path.stat().st_size > 10_000


class TestDegradationAcrossSeries:
    def test_the_same_errors_with_noise_are_not_degraded(self):
        rng = np.random.default_rng(0)
        holdout = rng.lognormal(0, 0.5, 200)
        test = degradation_test(holdout * rng.lognormal(0, 0.3, 200), holdout, series=200)
        assert test["degraded"] is False and test["p_value"] > 0.05

    def test_most_series_worse_is_degraded(self):
        rng = np.random.default_rng(0)
        holdout = rng.lognormal(0, 0.5, 200)
        test = degradation_test(holdout * rng.lognormal(np.log(1.2), 0.3, 200), holdout, series=200)
        assert test["degraded"] is True and test["p_value"] < 0.001 and test["worse_share"] > 0.6

    def test_better_series_are_not_degraded(self):
        rng = np.random.default_rng(0)
        holdout = rng.lognormal(0, 0.5, 200)
        test = degradation_test(0.7 * holdout, holdout, series=200)
        assert test["degraded"] is False and test["p_value"] > 0.99

    def test_one_non_finite_series_does_not_hide_the_degraded_ones(self):
        holdout = np.ones(30)
        realised = np.r_[np.full(29, 3.0), np.nan]
        test = degradation_test(realised, holdout, series=30, non_finite=["s29"])
        assert test["degraded"] is True and test["p_value"] is None and "non-finite forecasts" in test["note"]
        result = {"channel": "edge", "degraded": True, "test": test, "drift": [], "fleet": {"worst": []}}
        assert reasons(result) == ["edge: non-finite forecasts in 1 series (s29)"]

    def test_too_few_series_are_not_judged(self):
        test = degradation_test(np.full(MIN_SERIES - 1, 10.0), np.full(MIN_SERIES - 1, 1.0), series=MIN_SERIES - 1)
        assert test["degraded"] is False and test["p_value"] is None and "fewer than" in test["note"]


@pytest.mark.slow  # the module's model, and a SQLite MLflow store (~15 s on 2 cores)
def test_the_fleet_result_is_logged_and_tagged_as_a_one_series_one(panel, deployed, tmp_path,
                                                                    fleet_tracking_uri):  # noqa: F811
    """The monitor run and the version tag ``onnxcast.monitor.<channel>`` of the registry take a
    fleet result unchanged; monitor.json keeps the fleet block (the worst series)."""
    from onnxcast.registry.monitoring import log_monitor_run, monitor_tag, set_monitor_tag
    from onnxcast.registry.tracking import client_for

    data, _ = changed(panel, tmp_path, "scaled", lambda y: 1.1 * y)
    result = judge(deployed, tmp_path, data)
    client = client_for(fleet_tracking_uri)
    name = "fleet-monitor-m"
    client.create_registered_model(name)
    version = client.create_model_version(name, str(deployed["model"].parent), run_id=None).version
    run = log_monitor_run(result, model_name=name, version=version, channel="edge", work_dir=tmp_path / "mlflow",
                          tracking_uri=fleet_tracking_uri)
    set_monitor_tag(name, version, "edge", result, run["run_id"], fleet_tracking_uri)
    tag = json.loads(client.get_model_version(name, version).tags[monitor_tag("edge")])
    assert set(tag) == set(TAG_FIELDS) and tag["degraded"] is True and tag["drift"] == ["y"]
    assert tag["mase"] == pytest.approx(result["mase"]) and tag["holdout_ci"] == pytest.approx(result["holdout_ci"])
    logged = client.get_run(run["run_id"]).data.metrics
    assert logged["degraded"] == 1.0 and logged["realised_mase"] == pytest.approx(result["mase"])
    saved = json.loads(Path(client.download_artifacts(run["run_id"], "monitor.json", str(tmp_path))).read_text())
    assert [w["series"] for w in saved["fleet"]["worst"]] == [w["series"] for w in result["fleet"]["worst"]]


class TestLikeSizedComparisonHoldsItsSize:
    """A seeded simulation (a few seconds): every series' errors from one distribution before
    and after training, the new rows of each series longer than its holdout (and unequal). The
    realised MASE the test compares (compared_mase: the latest rows laid out as the holdout)
    averages as many windows as the holdout's, so the false-alarm rate stays near alpha for
    normal and heavy-tailed t(3) errors; comparing the mean over all new windows instead called
    29% (normal) and 81% (t(3)) of healthy 1000-series fleets degraded. A 10% scale-up of the
    new rows is still found."""

    HORIZON, TRAIN, HOLDOUT, SERIES, RUNS = 6, 48, 36, 100, 400

    def fleet(self, rng, dist: str, scale_up: float):
        from onnxcast.pipeline.fleet_data import FleetData

        new = rng.integers(self.HOLDOUT, 5 * self.HOLDOUT + 1, self.SERIES)
        lengths = self.TRAIN + new
        draws = rng.standard_normal(int(lengths.sum())) if dist == "normal" else rng.standard_t(3, int(lengths.sum()))
        offsets = np.zeros(self.SERIES + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        after = np.concatenate([np.arange(n) >= self.TRAIN for n in lengths])
        values = np.where(after, scale_up * draws, draws).astype(np.float32)[:, None]
        return FleetData(values=values, offsets=offsets, starts=np.zeros(self.SERIES, np.int64),
                         ids=tuple(f"s{i:04d}" for i in range(self.SERIES)), columns=("y",), freq="MS", season=12,
                         source="simulated", sha256="0" * 64)

    def alarms(self, dist: str, scale_up: float = 1.0, seed: int = 0) -> float:
        from onnxcast.pipeline.fleet_eval import steps_back
        from onnxcast.pipeline.monitor import _truncated, compared_mase

        rng = np.random.default_rng(seed)
        back, _ = steps_back(self.HOLDOUT, self.HORIZON, (12,))
        zero = lambda h: np.zeros((len(h), self.HORIZON), np.float32)  # noqa: E731  (errors = |y|)
        index, ones, count = list(range(self.SERIES)), np.ones(self.SERIES), 0
        for _ in range(self.RUNS):
            fleet = self.fleet(rng, dist, scale_up)
            first_new = np.full(self.SERIES, self.TRAIN)
            before = _truncated(fleet, np.arange(self.SERIES), first_new)
            _, holdout = compared_mase(before, index, first_new - self.HOLDOUT, back, zero, 1, self.HORIZON, ones)
            like, realised = compared_mase(fleet, index, first_new, back, zero, 1, self.HORIZON, ones)
            assert len(like) == self.SERIES
            count += degradation_test(realised, holdout[like], series=len(like))["degraded"]
        print(f"{dist}, scale {scale_up}: {count}/{self.RUNS} runs degraded")
        return count / self.RUNS

    @pytest.mark.parametrize("dist", ["normal", "t3"])
    def test_false_alarms_near_alpha(self, dist):
        # the Wilcoxon test is exact here (like-sized windows are exchangeable), so the rate
        # is alpha up to the simulation's noise: 400 runs, a standard error of 1.1 points
        assert self.alarms(dist) <= 0.08

    @pytest.mark.parametrize("dist", ["normal", "t3"])
    def test_a_ten_percent_scale_up_is_found(self, dist):
        assert self.alarms(dist, scale_up=1.1, seed=1) >= 0.8
