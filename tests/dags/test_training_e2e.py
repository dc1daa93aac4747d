"""onnxcast_training end to end with Airflow's dag.test() on the real example data, then the
promote and rollback DAGs on what it registered. Embedded defaults: SQLite Airflow, SQLite
MLflow and a local rollout store under the session's ONNXCAST_HOME."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import airflow_support
import pytest

pytestmark = pytest.mark.slow

MODEL = "e2e-forecaster"


def load_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    airflow_support.ensure_db()
    bag = DagBag(dag_folder=str(airflow_support.REPO / "dags" / f"{dag_id}.py"))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def store_dir() -> Path:
    return airflow_support.configure() / "rollout" / MODEL


def client():
    from onnxcast.registry.tracking import client_for

    return client_for()


@pytest.fixture(scope="module", autouse=True)
def _module_release_key(release_key):
    # The module's runs are made by module fixtures, before the per-test key environment
    # (conftest._release_key_env) applies: without this the training runs signed with the
    # embedded development key and the promote DAG's writer, holding the session key, rightly
    # refused to re-sign a pointer it cannot verify.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONNXCAST_SIGNING_KEY", str(release_key["private"]))
        patch.setenv("ONNXCAST_TRUST", str(release_key["root"]))
        yield


@pytest.fixture(scope="module")
def first_run():
    conf = {**airflow_support.TINY, "families": ["lstm", "transformer"], "model_name": MODEL}
    run = load_dag("onnxcast_training").test(run_conf=conf)
    return run


@pytest.fixture(scope="module")
def second_run(first_run):
    """Same data and settings, LSTM only: the LSTM trains to the same weights as in the first
    run (same seed), so it cannot beat the champion, the better of the first run's two."""
    pointers = {p.name: p.read_bytes() for p in (store_dir() / "channels").glob("*.json")}
    conf = {**airflow_support.TINY, "families": ["lstm"], "model_name": MODEL}
    run = load_dag("onnxcast_training").test(run_conf=conf)
    return run, pointers


class TestFirstRun:
    def test_every_task_succeeded(self, first_run):
        states = airflow_support.task_states(first_run)
        assert set(states.values()) == {"success"}, states
        assert {"train_or_fetch[0]", "train_or_fetch[1]", "validate[1]", "register", "promote"} <= set(states)
        assert airflow_support.xcom(first_run, "merge_data") == ["lstm", "transformer"]
        # one series: one shard, whose tasks ran once and did nothing (nothing skipped)
        assert airflow_support.xcom(first_run, "check_data") == [0]
        assert {states[f"{task}[0]"] for task in ("check_series", "reference", "evaluate")} == {"success"}

    def test_registered_version_is_champion_with_artifacts(self, first_run, tmp_path):
        import mlflow

        registered = airflow_support.xcom(first_run, "register")
        version = client().get_model_version_by_alias(MODEL, "champion")
        assert str(version.version) == str(registered["version"])
        assert version.tags["onnxcast.run_key"] == f"onnxcast_training/{first_run.run_id}"
        assert version.tags["onnxcast.decision.promote"] == "True"
        files = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}/{version.version}", dst_path=str(tmp_path)))
        names = {p.name for p in files.rglob("*") if p.is_file()}
        assert {"MLmodel", "model.onnx", "fp32.onnx", "fp32-opt.onnx", "int8.onnx", "model.pt", "model.json",
                "report.json", "input_example.json"} <= names
        mlmodel = (files / "MLmodel").read_text()
        assert "onnx:" in mlmodel and "signature:" in mlmodel and "CPUExecutionProvider" in mlmodel
        inputs = json.loads(mlflow.models.get_model_info(f"models:/{MODEL}/{version.version}").signature.to_dict()["inputs"])
        assert inputs == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, -1, 1]}, "name": "history"}]

    def test_mlflow_runs_hold_report_plot_quality_and_variant_metrics(self, first_run):
        registered = airflow_support.xcom(first_run, "register")
        c = client()
        parent = c.get_run(registered["parent_run_id"])
        artifacts = {a.path for a in c.list_artifacts(parent.info.run_id)}
        assert {"report.json", "plots", "quality"} <= artifacts
        assert parent.data.params["horizon"] == "12"
        child = c.get_run(registered["run_id"])
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert {"fp32.holdout_mae", "int8.holdout_mae", "fp32-opt.latency_batch1_p50_ms"} <= set(child.data.metrics)
        assert {a.path for a in c.list_artifacts(child.info.run_id, "onnx")} >= {"onnx/fp32.onnx", "onnx/int8.onnx"}

    def test_rollout_manifest_sha256s_match_files(self, first_run):
        version = str(airflow_support.xcom(first_run, "register")["version"])
        folder = store_dir() / "versions" / version
        manifest = json.loads((folder / "manifest.json").read_text())["signed"]
        assert manifest["artifacts"]
        for name, entry in manifest["artifacts"].items():
            data = (folder / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"]
            assert len(data) == entry["size_bytes"]
        for channel in ("edge", "cloud"):
            pointer = json.loads((store_dir() / "channels" / f"{channel}.json").read_text())["signed"]
            assert pointer["version"] == version
            assert pointer["artifact"] in manifest["artifacts"]

    def test_each_task_links_to_its_mlflow_run(self, first_run):
        registered = airflow_support.xcom(first_run, "register")
        for task_id, index in (("check_data", -1), ("train_or_fetch", 0), ("validate", 1), ("promote", -1)):
            url = airflow_support.xcom(first_run, task_id, "_link_MlflowRunLink", index)
            assert url and "/#/experiments/" in url, (task_id, url)
        assert airflow_support.xcom(first_run, "register", "_link_MlflowRunLink").endswith(registered["parent_run_id"])

    def test_promotion_published_the_asset(self, first_run):
        from airflow.models.asset import AssetEvent
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            events = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == first_run.run_id)).all()
            assert [(e.source_task_id, e.extra["model"]) for e in events] == [("promote", MODEL)]


class TestSecondRunThatDoesNotBeatTheChampion:
    def test_registered_but_not_promoted(self, first_run, second_run):
        run, pointers_before = second_run
        states = airflow_support.task_states(run)
        assert states.pop("promote") == "skipped"
        assert set(states.values()) == {"success"}, states
        assert airflow_support.xcom(run, "merge_data") == ["lstm", "champion"]
        first = str(airflow_support.xcom(first_run, "register")["version"])
        second = str(airflow_support.xcom(run, "register")["version"])
        assert second != first
        c = client()
        assert str(c.get_model_version_by_alias(MODEL, "champion").version) == first
        assert str(c.get_model_version_by_alias(MODEL, "challenger").version) == second
        assert pointers_before == {p.name: p.read_bytes() for p in (store_dir() / "channels").glob("*.json")}
        assert not (store_dir() / "versions" / second).exists()

    def test_decision_compares_both_on_the_same_holdout(self, second_run):
        run, _ = second_run
        decision = airflow_support.xcom(run, "champion_challenger")
        assert decision["promote"] is False
        # the champion is kept when the challenger is worse, or better by a difference the
        # paired test does not find significant (seen: 0.6384 vs 0.6405, both trained alike)
        assert decision["challenger_mae"] >= decision["champion_mae"] or "not significantly" in decision["reason"]
        tags = client().get_model_version(MODEL, decision["challenger_version"]).tags
        assert tags["onnxcast.decision.promote"] == "False"
        assert float(tags["onnxcast.decision.champion_mae"]) == pytest.approx(decision["champion_mae"])


class TestPromoteAndRollbackDags:
    def test_promote_challenger_to_edge_then_roll_back(self, first_run, second_run):
        run, _ = second_run
        first = str(airflow_support.xcom(first_run, "register")["version"])
        second = str(airflow_support.xcom(run, "register")["version"])

        promoted = load_dag("onnxcast_promote").test(run_conf={"model_name": MODEL, "version": "challenger",
                                                               "channels": ["edge"], "reason": "e2e"})
        assert set(airflow_support.task_states(promoted).values()) == {"success"}
        edge = json.loads((store_dir() / "channels" / "edge.json").read_text())["signed"]
        cloud = json.loads((store_dir() / "channels" / "cloud.json").read_text())["signed"]
        assert (edge["version"], cloud["version"]) == (second, first)
        assert str(client().get_model_version_by_alias(MODEL, "champion").version) == second

        rolled = load_dag("onnxcast_rollback").test(run_conf={"model_name": MODEL, "channel": "edge",
                                                              "reason": "e2e rollback"})
        assert set(airflow_support.task_states(rolled).values()) == {"success"}
        edge = json.loads((store_dir() / "channels" / "edge.json").read_text())["signed"]
        assert edge["action"] == "rollback" and edge["rollback"]["version"] == first  # the signed record
        assert edge["version"] == first
        assert [h["action"] for h in edge["history"]] == ["promote", "promote", "rollback"]
        assert str(client().get_model_version_by_alias(MODEL, "champion").version) == first


class TestFetchPath:
    def test_start_from_a_registered_model_instead_of_training(self, first_run):
        """fetch_from: the first run's model is fetched (weights_only), then exported, optimized,
        validated, registered and promoted under another name, without training."""
        fetched_model = "e2e-fetched"
        conf = {**airflow_support.TINY, "model_name": fetched_model, "fetch_from": f"models:/{MODEL}@champion"}
        run = load_dag("onnxcast_training").test(run_conf=conf)
        states = airflow_support.task_states(run)
        assert set(states.values()) == {"success"}, states
        family = client().get_model_version_by_alias(MODEL, "champion").tags["onnxcast.family"]
        assert airflow_support.xcom(run, "merge_data") == [family]
        trained = airflow_support.xcom(run, "train_or_fetch", map_index=0)
        assert trained["source"] == f"models:/{MODEL}@champion"
        version = client().get_model_version_by_alias(fetched_model, "champion")
        assert version.tags["onnxcast.family"] == family
        store = airflow_support.configure() / "rollout" / fetched_model
        assert json.loads((store / "channels" / "edge.json").read_text())["signed"]["version"] == str(version.version)


def run_report(run) -> dict:
    """The run's report.json, from its run directory (embedded mode: a local folder)."""
    return json.loads((Path(airflow_support.xcom(run, "check_data", "run_dir")) / "report.json").read_text())


@pytest.fixture(scope="module")
def ensemble_run():
    """``families`` naming the ensemble, as a user ticks it in the trigger form: two members
    trained in parallel, then the ensemble task combines them (docs/ensemble.md)."""
    conf = {**airflow_support.TINY, "families": ["nhits", "dlinear", "ensemble"], "model_name": "e2e-ensemble",
            "compare_with_champion": False}
    return load_dag("onnxcast_training").test(run_conf=conf)


class TestEnsemble:
    def test_the_ensemble_is_made_after_its_members_and_goes_through_every_step(self, ensemble_run):
        states = airflow_support.task_states(ensemble_run)
        assert set(states.values()) == {"success"}, states
        assert airflow_support.xcom(ensemble_run, "merge_data") == ["nhits", "dlinear"]  # trained in parallel
        assert "train_or_fetch[2]" not in states
        assert airflow_support.xcom(ensemble_run, "ensemble") == ["nhits", "dlinear", "ensemble"]
        for task in ("export", "optimize", "validate"):
            assert airflow_support.xcom(ensemble_run, task, map_index=2)["family"] == "ensemble", task
        assert airflow_support.xcom(ensemble_run, "validate", map_index=2)["eligible"]

    def test_the_report_has_the_ensemble_with_its_members_weights_and_validated_variants(self, ensemble_run):
        report = run_report(ensemble_run)
        assert "skipped" not in report
        (entry,) = [m for m in report["models"] if m["family"] == "ensemble"]
        combination = entry["ensemble"]
        assert combination["members"] == ["nhits", "dlinear"]
        assert combination["combination"] in ("median", "weighted")
        weights = combination["weights"]  # one a member when fitted, none for the median
        assert (len(weights), sum(weights)) == ((2, pytest.approx(1.0)) if combination["combination"] == "weighted"
                                                else (0, 0))
        assert set(combination["in_graph"]) <= {"nhits", "dlinear"} and combination["in_graph"]
        names = {v["name"] for v in entry["variants"]}
        assert {"fp32", "fp32-opt", "int8"} <= names
        for variant in entry["variants"]:  # each validated on its own: parity, holdout, gates
            assert variant["parity_max_abs_diff"] is not None and variant["holdout"]["mae"] > 0, variant["name"]
            assert variant["gates"], variant["name"]

    def test_the_graph_and_the_mlflow_run_name_the_members(self, ensemble_run):
        import onnx

        run_dir = Path(airflow_support.xcom(ensemble_run, "check_data", "run_dir"))
        metadata = {p.key: p.value for p in onnx.load(run_dir / "models/ensemble/onnx/fp32.onnx").metadata_props}
        assert metadata["onnxcast.model_family"] == "ensemble"
        assert metadata["onnxcast.ensemble_members"] in ("nhits,dlinear", "nhits", "dlinear")
        registered = airflow_support.xcom(ensemble_run, "register")
        c = client()
        (child,) = [r for r in c.search_runs([c.get_run(registered["parent_run_id"]).info.experiment_id],
                                             filter_string="tags.`onnxcast.family` = 'ensemble'")]
        assert child.data.params["ensemble.members"] == "nhits,dlinear"
        assert child.info.status == "FINISHED"

    def test_the_dag_makes_the_ensemble_the_cli_makes_from_the_same_settings(self, ensemble_run, tmp_path):
        from dataclasses import replace

        from onnxcast.pipeline.config import PipelineConfig
        from onnxcast.pipeline.run import run_pipeline

        run_dir = Path(airflow_support.xcom(ensemble_run, "check_data", "run_dir"))
        cfg = replace(PipelineConfig.load(run_dir / "config.json"), out_dir=str(tmp_path / "cli"))
        cli = run_pipeline(cfg)  # what `onnxcast pipeline` runs: every family one after another in one process

        def ensemble(report: dict) -> dict:
            return next(m for m in report["models"] if m["family"] == "ensemble")

        dag, alone = ensemble(run_report(ensemble_run)), ensemble(cli)
        for key in ("members", "combination", "weights", "in_graph", "best_member", "validation_windows"):
            assert dag["ensemble"][key] == alone["ensemble"][key], key
        losses = dag["ensemble"]["validation_loss"], alone["ensemble"]["validation_loss"]
        assert losses[0]["members"] == pytest.approx(losses[1]["members"], rel=1e-5)
        assert {k: losses[0][k] for k in ("median", "weighted")} == pytest.approx(
            {k: losses[1][k] for k in ("median", "weighted")}, rel=1e-5)
        assert dag["fp32_holdout_mae"] == pytest.approx(alone["fp32_holdout_mae"], rel=1e-5)

    def test_with_one_member_the_ensemble_is_skipped_and_the_report_says_why(self):
        conf = {**airflow_support.TINY, "families": ["dlinear", "ensemble"], "model_name": "e2e-ensemble-one",
                "compare_with_champion": False}
        run = load_dag("onnxcast_training").test(run_conf=conf)
        states = airflow_support.task_states(run)
        assert set(states.values()) == {"success"}, states
        assert airflow_support.xcom(run, "ensemble") == ["dlinear"]
        assert "export[1]" not in states and "validate[1]" not in states
        report = run_report(run)
        assert [m["family"] for m in report["models"]] == ["dlinear"]
        assert report["skipped"] == [{"family": "ensemble", "reason": "needs at least two trained member families, "
                                                                      "the run trained 1 (dlinear)"}]
        c = client()  # no MLflow run of its own left behind, none left RUNNING
        experiment = c.get_experiment_by_name("e2e-ensemble-one").experiment_id
        runs = c.search_runs([experiment], filter_string=f"tags.`onnxcast.run_key` = 'onnxcast_training/{run.run_id}'")
        assert sorted(r.data.tags.get("onnxcast.family", "") for r in runs) == ["", "dlinear"]
        assert {r.info.status for r in runs} == {"FINISHED"}


@pytest.fixture(scope="module")
def unserved_version(second_run) -> str:
    """A version no channel has served: a new registered version of the second run's files
    (the store already holds v2 from the promote test, and a version is written once)."""
    second = client().get_model_version(MODEL, str(airflow_support.xcom(second_run[0], "register")["version"]))
    return str(client().create_model_version(MODEL, second.source, run_id=second.run_id, tags=second.tags).version)


class TestRegistryDrivenPromotion:
    """onnxcast_promote as the alias watcher starts it (conf source "registry"): refused while
    one of the version's files is tampered with, then deployed."""

    @staticmethod
    def _promote_from_registry(version: str):
        client().set_registered_model_alias(MODEL, "edge", version)  # what the release manager did
        conf = {"model_name": MODEL, "version": version, "channels": ["edge"], "source": "registry",
                "alias": "edge", "reason": f"alias edge set to v{version} in the MLflow registry"}
        return load_dag("onnxcast_promote").test(run_conf=conf)

    @staticmethod
    def _rollout_tag(version: str) -> dict:
        return json.loads(client().get_model_version(MODEL, version).tags["onnxcast.rollout.edge"])

    @staticmethod
    def _edge() -> str:
        return json.loads((store_dir() / "channels" / "edge.json").read_text())["signed"]["version"]

    def test_refused_version_is_tagged_and_the_alias_moves_back(self, unserved_version):
        from urllib.parse import urlparse

        served = self._edge()
        files = Path(urlparse(client().get_model_version_download_uri(MODEL, unserved_version)).path)
        victim = sorted(files.rglob("*.onnx"))[0]
        original = victim.read_bytes()
        victim.write_bytes(original + b"\0")
        try:
            run = self._promote_from_registry(unserved_version)
        finally:
            victim.write_bytes(original)
        states = airflow_support.task_states(run)
        assert states["stage_version"] == "failed" and states["report_back"] == "failed", states
        tag = self._rollout_tag(unserved_version)
        assert tag["state"] == "refused" and tag["run_id"] == run.run_id
        assert tag["reason"].startswith("stage_version: ") and "differs from the sha256" in tag["reason"]
        assert str(client().get_model_version_by_alias(MODEL, "edge").version) == served
        assert self._edge() == served

    def test_passing_version_is_deployed_and_the_alias_stays(self, unserved_version):
        run = self._promote_from_registry(unserved_version)
        assert set(airflow_support.task_states(run).values()) == {"success"}
        tag = self._rollout_tag(unserved_version)
        assert (tag["state"], tag["run_id"], tag["source"]) == ("deployed", run.run_id, "registry")
        assert self._edge() == unserved_version
        assert str(client().get_model_version_by_alias(MODEL, "edge").version) == unserved_version
