"""MLflow operators: registration is idempotent; the decision is reproducible."""

from __future__ import annotations

import pytest
from conftest import assert_template_fields_stored_unchanged, commit, make_context

pytestmark = pytest.mark.slow


def model_versions(name: str) -> list:
    from onnxcast.registry.tracking import client_for

    return client_for().search_model_versions(f"name = '{name}'")


def rename(run_dir: str, model_name: str) -> None:
    from dataclasses import replace
    from pathlib import Path

    from onnxcast.pipeline.config import PipelineConfig

    path = Path(run_dir) / "config.json"
    replace(PipelineConfig.load(path), model_name=model_name).save(path)
    commit(run_dir)


class TestRegisterModelOperator:
    def test_template_fields(self):
        from onnxcast.airflow.operators import RegisterModelOperator

        op = RegisterModelOperator(task_id="register", run_dir="{{ ti.xcom_pull('check_data', key='run_dir') }}")
        assert tuple(op.template_fields) == ("run_dir",)
        assert_template_fields_stored_unchanged(op, {"run_dir": "{{ ti.xcom_pull('check_data', key='run_dir') }}"})

    def test_retry_registers_no_duplicate_version(self, run_dir):
        from onnxcast.airflow.operators import RegisterModelOperator

        rename(run_dir, "ops-register")
        op = RegisterModelOperator(task_id="register", run_dir=run_dir)
        first = op.execute(make_context(run_id="register-retry"))
        second = op.execute(make_context(run_id="register-retry"))
        assert first["created"] is True and second["created"] is False
        assert {k: v for k, v in first.items() if k != "created"} == {k: v for k, v in second.items() if k != "created"}
        assert len(model_versions("ops-register")) == 1
        from onnxcast.registry.tracking import alias_version

        assert alias_version("ops-register", "challenger") == first["version"]
        third = op.execute(make_context(run_id="another-dag-run"))
        assert third["version"] != first["version"] and len(model_versions("ops-register")) == 2


    def test_a_family_never_validated_is_refused_at_once_and_nothing_is_registered(self, run_dir):
        import json
        from pathlib import Path

        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.operators import RegisterModelOperator
        from onnxcast.pipeline.layout import RunLayout

        rename(run_dir, "ops-register-unvalidated")
        plan = RunLayout(run_dir).plan
        planned = json.loads(plan.read_text())  # dlinear planned too, its validate task failed: no validation.json
        planned["families"].append({"family": "dlinear", "source": None, "role": "challenger"})
        plan.write_text(json.dumps(planned))
        commit(run_dir, "plan-with-dlinear")
        op = RegisterModelOperator(task_id="register", run_dir=run_dir)
        with pytest.raises(AirflowFailException, match=r"^no validation of dlinear \(its validate task did not succeed\)"):
            op.execute(make_context(run_id="register-unvalidated"))
        assert model_versions("ops-register-unvalidated") == []
        assert not (Path(run_dir) / "report.json").exists() or "ops-register-unvalidated" not in (
            Path(run_dir) / "report.json").read_text()


class TestChampionChallengerOperator:
    def test_template_fields(self):
        from onnxcast.airflow.operators import ChampionChallengerOperator

        values = {"run_dir": "{{ r }}", "version": "{{ v }}", "min_improvement": "{{ params.min_improvement }}"}
        op = ChampionChallengerOperator(task_id="decide", **values)
        assert set(op.template_fields) == set(values)
        assert_template_fields_stored_unchanged(op, values)

    def test_retry_gives_the_same_decision(self, run_dir):
        from onnxcast.airflow.operators import ChampionChallengerOperator, RegisterModelOperator

        rename(run_dir, "ops-decide")
        version = RegisterModelOperator(task_id="register", run_dir=run_dir).execute(make_context())["version"]
        op = ChampionChallengerOperator(task_id="decide", run_dir=run_dir, version=version)
        first, second = op.execute(make_context()), op.execute(make_context())
        assert first == second
        assert first["promote"] is True and first["champion_version"] is None  # no champion yet
