"""The DAG files: they import cleanly, document themselves, have typed params for the
trigger form, and parse fast without heavy libraries (Airflow's own per-file measure)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import airflow_support
import pytest

DAG_IDS = {"onnxcast_training", "onnxcast_promote", "onnxcast_rollback", "onnxcast_refresh",
           "onnxcast_registry_rollout", "onnxcast_monitor"}
# scheduled on an asset only, never from the trigger form: nothing to ask
NO_PARAMS = {"onnxcast_registry_rollout"}
DAG_FILES = sorted((airflow_support.REPO / "dags").glob("*.py"))
HEAVY = ("torch", "onnxruntime", "onnx", "mlflow", "pandas", "great_expectations", "numpy", "boto3",
         "onnxcast.pipeline.training", "onnxcast.pipeline.export", "onnxcast.pipeline.optimize", "onnxcast.pipeline.validate", "onnxcast.pipeline.models")
MAX_PARSE_SECONDS = 0.3

# A fresh interpreter per file, so no file profits from modules another one imported.
# DagBag's dagbag_stats[].duration is what `airflow dags report` shows as parse time.
PARSE_ONE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
stat = bag.dagbag_stats[0]
heavy = sorted(m for m in sys.argv[2].split(",") if m in sys.modules)
print(json.dumps({"seconds": stat.duration.total_seconds(), "dags": stat.dag_num, "heavy": heavy,
                  "errors": {str(k): v for k, v in bag.import_errors.items()}}))
"""


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(airflow_support.REPO / "dags"))


class TestDagBag:
    def test_no_import_errors(self, dagbag):
        assert dagbag.import_errors == {}
        assert set(dagbag.dag_ids) == DAG_IDS

    @pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
    def test_dag_is_documented_and_tagged(self, dagbag, dag_id):
        dag = dagbag.dags[dag_id]
        assert "onnxcast" in dag.tags
        assert dag.doc_md and len(dag.doc_md) > 100
        assert dag.catchup is False

    @pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
    def test_params_are_typed_and_described(self, dagbag, dag_id):
        dag = dagbag.dags[dag_id]
        assert dag.params or dag_id in NO_PARAMS, f"{dag_id} has no params"
        for name, param in dag.params.items():
            param = dag.params.get_param(name)
            assert param.schema.get("type"), f"{dag_id}.{name} has no type"
            assert param.description, f"{dag_id}.{name} has no description"

    @pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
    def test_params_with_an_empty_default_are_optional_in_the_trigger_form(self, dagbag, dag_id):
        """The form marks a typed field required unless its type allows null (Airflow's params
        tutorial): an empty default ([], {}, None) means the field may be left out."""
        dag = dagbag.dags[dag_id]
        for name in dag.params:
            param = dag.params.get_param(name)
            types = param.schema.get("type")
            types = types if isinstance(types, list) else [types]
            if param.value in (None, [], {}, ""):
                assert "null" in types, f"{dag_id}.{name} (default {param.value!r}) shows as required"

    def test_training_dag_shape(self, dagbag):
        dag = dagbag.dags["onnxcast_training"]
        # weekly, and unpausing starts no run at once (issue 18 item 12): no start_date, so the
        # timetable's run_immediately decides; tests/scripts/test_airflow_standalone.py checks the
        # scheduler's view of it on a running Airflow. Also on the monitor's onnxcast_retrain asset.
        weekly = dag.timetable.timetable
        assert (weekly.expression, weekly.run_immediately) == ("0 0 * * 0", timedelta(minutes=10))
        assert [a.name for a in dag.timetable.asset_condition.objects] == ["onnxcast_retrain"]
        assert dag.start_date is None
        for name in ("families", "channels"):  # multi-selects in the trigger form, not free text
            schema = dag.params.get_param(name).schema
            assert schema["examples"] == schema["items"]["enum"], name
        assert dag.max_active_runs == 1
        mapped = {t.task_id for t in dag.tasks if getattr(t, "_is_mapped", False) or type(t).__name__ == "MappedOperator"}
        assert mapped == {"check_series", "train_or_fetch", "export", "optimize", "reference", "evaluate", "validate"}
        assert [o.name for o in dag.get_task("promote").outlets] == ["onnxcast_rollout"]
        assert dag.params["families"] == ["nhits", "dlinear", "lstm", "transformer"]
        assert dag.params["serving_url"] is None  # waiting for onnxcast serve is opt-in
        # what champion/challenger compares (the setting, so it reaches config.json and decide())
        assert dag.params["champion_metric"] == "mase"
        assert dag.params.get_param("champion_metric").schema == {"type": "string", "pattern": "^(mase|msis)$"}
        # the interval gate that refuses a family (issue 30): off unless the trigger form turns it on
        assert dag.params["strict_intervals"] is False
        assert dag.params.get_param("strict_intervals").schema["type"] == "boolean"
        assert dag.get_task("wait_until_serving").upstream_task_ids == {"promote"}
        for task in dag.tasks:
            assert [link.name for link in task.operator_extra_links] == ["MLflow run"], task.task_id


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_dag_file_parses_fast_without_heavy_imports(path):
    out = subprocess.run([sys.executable, "-c", PARSE_ONE, str(path), ",".join(HEAVY)], capture_output=True,
                         text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert result["dags"] == 1
    assert result["heavy"] == [], f"{path.name} imports {result['heavy']} at parse time"
    assert result["seconds"] < MAX_PARSE_SECONDS, f"{path.name} parsed in {result['seconds']:.3f} s"


DAG_IMPORTS = {"onnxcast.airflow.operators", "onnxcast.airflow.params", "onnxcast.pipeline.config"}


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_dag_files_import_only_the_operators_the_params_and_the_channel_names(path):
    """What docs/architecture.md promises of a DAG file: onnxcast through the provider's
    operators and params (and the channel names of the stdlib-only config), nothing deeper."""
    import ast

    tree = ast.parse(path.read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert {m for m in imported if m.split(".")[0] == "onnxcast"} <= DAG_IMPORTS


def test_provider_registers_the_link_and_the_mlflow_connection_type():
    """onnxcast is an installed Airflow provider (entry point apache_airflow_provider): Airflow
    finds its extra link, hooks and the mlflow connection form without a plugins folder."""
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert "onnxcast" in manager.providers
    assert "onnxcast.airflow.links.MlflowRunLink" in manager.extra_links_class_names
    assert manager.hooks["mlflow"].hook_class_name == "onnxcast.airflow.hooks.MlflowHook"
    assert {"extra__mlflow__tracking_uri", "extra__mlflow__ui_url"} <= set(manager.connection_form_widgets)
    assert manager.field_behaviours["mlflow"]["relabeling"]["host"] == "Tracking URI"


def test_providers_list_shows_onnxcast_through_the_airflow_command():
    out = subprocess.run([str(Path(sys.executable).parent / "airflow"), "providers", "list", "-o", "json"],
                         capture_output=True, text=True, timeout=300, check=True)
    providers = {p["package_name"]: p for p in json.loads(out.stdout[out.stdout.index("["):])}
    assert providers["onnxcast"]["version"] == __import__("onnxcast").__version__

