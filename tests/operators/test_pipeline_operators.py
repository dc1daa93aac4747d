"""Pipeline-step operators: templated fields, and a retry (execute twice) is harmless."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import OPS_SETTINGS, assert_template_fields_stored_unchanged, commit, make_context

pytestmark = pytest.mark.slow


def read(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


class TestCheckDataOperator:
    def test_template_fields(self):
        from onnxcast.airflow.operators import CheckDataOperator

        values = {"settings": {"horizon": "{{ params.horizon }}"}, "extra_settings": "{{ params.extra_settings }}",
                  "run_root": "/r", "fetch_from": "{{ params.fetch_from }}", "trained_until": "{{ ds }}",
                  "compare_with_champion": "{{ params.compare_with_champion }}"}
        op = CheckDataOperator(task_id="check_data", **values)
        assert set(op.template_fields) == set(values)
        assert_template_fields_stored_unchanged(op, values)

    def test_retry_gives_the_same_run(self, tmp_path):
        from onnxcast.airflow.operators import CheckDataOperator

        op = CheckDataOperator(task_id="check_data", settings=OPS_SETTINGS, run_root=str(tmp_path),
                               compare_with_champion=False)
        first, second = make_context(), make_context()
        assert op.execute(first) == op.execute(second) == [0]  # one series: one shard
        assert first["ti"].xcoms["families"] == second["ti"].xcoms["families"] == ["lstm"]
        run_dir = Path(first["ti"].xcoms["run_dir"])
        assert second["ti"].xcoms["run_dir"] == str(run_dir)
        assert run_dir.parent.name == "operator_tests" and ":" not in run_dir.name
        config = read(run_dir / "config.json")
        assert config["trained_until"] == "2026-11-29T00:00:00+00:00"  # the run's data interval end
        assert read(run_dir / "plan.json")["notes"] == ["comparison with the champion is off"]

    @pytest.mark.parametrize(("bad", "fragment"), [
        ({"horizon": 0}, "horizon must be in [1, 10000], got 0"),
        # issue 9: a ZeroDivisionError, so the task retried instead of failing fast
        ({"extra_settings": {"n_heads": 0}}, "n_heads must be in [1, 1024], got 0"),
        ({"extra_settings": {"batch_size": 0}}, "batch_size must be in [1, 1000000], got 0"),
        ({"extra_settings": {"d_model": 30}}, "d_model (30) must be divisible by n_heads (4)"),
        ({"extra_settings": '{"n_heads": 0}'}, "n_heads must be in [1, 1024], got 0"),  # JSON text from the form
        ({"extra_settings": "n_heads=0"}, "extra_settings must be a JSON object, got 'n_heads=0'"),
        ({"extra_settings": ["n_heads"]}, "extra_settings must be a mapping of setting to value, got list"),
    ])
    def test_bad_settings_fail_without_retry(self, tmp_path, bad, fragment):
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.operators import CheckDataOperator

        extra = bad.pop("extra_settings", None)
        op = CheckDataOperator(task_id="check_data", settings={**OPS_SETTINGS, **bad}, run_root=str(tmp_path),
                               extra_settings=extra)
        with pytest.raises(AirflowFailException) as err:
            op.execute(make_context())
        assert fragment in str(err.value)


class TestTrainOrFetchModelOperator:
    def test_template_fields(self):
        from onnxcast.airflow.operators import TrainOrFetchModelOperator

        op = TrainOrFetchModelOperator(task_id="t", run_dir="{{ ti.xcom_pull('check_data', key='run_dir') }}",
                                       family="lstm")
        assert set(op.template_fields) == {"run_dir", "family"}
        assert_template_fields_stored_unchanged(op, {"run_dir": "{{ ti.xcom_pull('check_data', key='run_dir') }}"})

    def test_retry_trains_the_same_weights(self, run_dir):
        import torch

        from onnxcast.airflow.operators import TrainOrFetchModelOperator

        op = TrainOrFetchModelOperator(task_id="t", run_dir=run_dir, family="lstm", mlflow_conn_id=None)
        first = op.execute(make_context())
        weights = torch.load(Path(run_dir, "models/lstm/model.pt"), weights_only=True)
        assert op.execute(make_context()) == first
        again = torch.load(Path(run_dir, "models/lstm/model.pt"), weights_only=True)
        assert all(torch.equal(weights[k], again[k]) for k in weights)

    def test_fetch_from_a_folder_when_the_plan_names_a_source(self, run_dir, prepared_run):
        from onnxcast.airflow.operators import TrainOrFetchModelOperator
        from onnxcast.registry.plan import write_plan

        write_plan(run_dir, [{"family": "lstm", "source": str(prepared_run / "models/lstm"), "role": "challenger"}])
        commit(run_dir)
        op = TrainOrFetchModelOperator(task_id="t", run_dir=run_dir, family="lstm", mlflow_conn_id=None)
        assert op.execute(make_context()) == op.execute(make_context())
        record = read(Path(run_dir, "models/lstm/model.json"))
        assert record["source"]["kind"] == "local"


@pytest.mark.parametrize("name", ["ExportModelOperator", "OptimizeModelOperator", "ValidateModelOperator"])
class TestFamilyStepOperators:
    def test_template_fields(self, name):
        import onnxcast.airflow.operators as operators

        op = getattr(operators, name)(task_id="x", run_dir="{{ run_dir }}", family="{{ family }}")
        assert tuple(op.template_fields) == ("run_dir", "family")
        assert_template_fields_stored_unchanged(op, {"run_dir": "{{ run_dir }}", "family": "{{ family }}"})

    def test_retry_gives_the_same_result(self, name, run_dir):
        import onnxcast.airflow.operators as operators

        op = getattr(operators, name)(task_id="x", run_dir=run_dir, family="lstm")
        first_context, second_context = make_context(), make_context()
        first = op.execute(first_context)
        files = {p.name: p.read_bytes() for p in Path(run_dir, "models/lstm/onnx").glob("*.onnx")}
        second = op.execute(second_context)
        if name == "ValidateModelOperator":  # latency differs between runs, accuracy does not
            assert second["fp32_holdout_mae"] == first["fp32_holdout_mae"]
            assert second["gates_passed"] is first["gates_passed"] is True
        else:
            assert second == first
            assert {p.name: p.read_bytes() for p in Path(run_dir, "models/lstm/onnx").glob("*.onnx")}.keys() == files.keys()
        assert "/#/experiments/" in second_context["ti"].xcoms["mlflow_run_url"]


class TestCheckDataOperatorFailures:
    def test_bad_data_fails_without_retry_and_is_recorded_in_mlflow(self, tmp_path, example_csv):
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.operators import CheckDataOperator
        from onnxcast.registry.tracking import client_for

        settings = {**OPS_SETTINGS, "data_uri": example_csv, "model_name": "ops-bad-data",
                    "time_column": "no_such_column"}
        op = CheckDataOperator(task_id="check_data", settings=settings, run_root=str(tmp_path))
        context = make_context(run_id="bad-data")
        with pytest.raises(AirflowFailException, match="no_such_column"):
            op.execute(context)
        client = client_for()
        experiment = client.get_experiment_by_name("ops-bad-data")
        (run,) = client.search_runs([experiment.experiment_id])
        assert run.info.status == "FAILED" and "no_such_column" in run.data.tags["onnxcast.error"]
        assert run.info.run_id in context["ti"].xcoms["mlflow_run_url"]


class TestTargetOperators:
    def test_the_runs_targets_then_one_task_per_target_that_writes_its_evidence(self, run_dir):
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.operators import RunTargetsOperator, ValidateTargetOperator
        from onnxcast.base.target_evidence import STATUSES

        assert RunTargetsOperator(task_id="targets", run_dir=run_dir).execute(make_context()) == ["x86_64"]
        op = ValidateTargetOperator(task_id="validate_target", run_dir=run_dir, target="openvino")
        assert tuple(op.template_fields) == ("run_dir", "target")
        result = op.execute(make_context())
        assert result["target"] == "openvino" and result["statuses"]["lstm"]
        assert set(result["statuses"]["lstm"].values()) <= set(STATUSES)
        evidence = read(Path(run_dir) / "models" / "lstm" / "targets" / "openvino.json")
        assert {v: r["status"] for v, r in evidence["variants"].items()} == result["statuses"]["lstm"]
        with pytest.raises(AirflowFailException, match="unknown target 'riscv'"):
            ValidateTargetOperator(task_id="v", run_dir=run_dir, target="riscv").execute(make_context())
