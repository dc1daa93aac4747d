"""Rollout operators: promote, stage a registered version, roll back; retries are no-ops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_template_fields_stored_unchanged, make_context
from test_registry_operators import rename

pytestmark = pytest.mark.slow


def register(run_dir: str, model: str, run_id: str) -> str:
    from onnxcast.airflow.operators import RegisterModelOperator

    rename(run_dir, model)
    return RegisterModelOperator(task_id="register", run_dir=run_dir).execute(make_context(run_id=run_id))["version"]


class TestPromoteModelOperator:
    def test_template_fields(self):
        from onnxcast.airflow.operators import PromoteModelOperator

        values = {"run_dir": "{{ r }}", "version": "{{ v }}", "channels": "{{ params.channels }}",
                  "store_uri": "{{ params.store_uri }}", "decision": "{{ ti.xcom_pull('decide') }}", "reason": "why",
                  "signing_key": "{{ var.value.onnxcast_signing_key }}", "source": "{{ params.source }}",
                  "alias": "{{ params.alias }}"}
        op = PromoteModelOperator(task_id="promote", **values)
        assert set(op.template_fields) == set(values)
        assert_template_fields_stored_unchanged(op, values)

    def test_skips_when_the_champion_wins(self, run_dir):
        from airflow.sdk.exceptions import AirflowSkipException

        from onnxcast.airflow.operators import PromoteModelOperator

        op = PromoteModelOperator(task_id="promote", run_dir=run_dir, version="1",
                                  decision={"promote": False, "reason": "champion is better"})
        with pytest.raises(AirflowSkipException, match="champion is better"):
            op.execute(make_context())

    @pytest.mark.parametrize("decision", ["{'promote': False, 'reason': 'champion is better'}", "None", None, "",
                                          ["promote"], {"reason": "no flag"}, {"promote": "yes"}])
    def test_refuses_when_the_decision_is_not_a_decision(self, run_dir, tmp_path, decision):
        """Issue 9: a decision rendered as a string (or missing) promoted anyway."""
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.operators import PromoteModelOperator

        store = tmp_path / "store"
        op = PromoteModelOperator(task_id="promote", run_dir=run_dir, version="1", store_uri=str(store),
                                  decision="{{ ti.xcom_pull(task_ids='champion_challenger') }}")
        op.decision = decision  # what template rendering left
        with pytest.raises(AirflowFailException, match="refusing to promote: decision must be"):
            op.execute(make_context())
        assert not store.exists()

    def test_retry_is_a_no_op(self, run_dir, tmp_path):
        from onnxcast.airflow.operators import PromoteModelOperator
        from onnxcast.registry.tracking import alias_version

        version = register(run_dir, "ops-promote", "promote-retry")
        store = tmp_path / "store"
        op = PromoteModelOperator(task_id="promote", run_dir=run_dir, version=version, channels=["edge", "cloud"],
                                  store_uri=str(store), decision={"promote": True, "reason": "first"})
        first, second = op.execute(make_context()), op.execute(make_context())
        assert first["changed"] is True and second["changed"] is False
        assert first["version"] == second["version"] == version
        assert second["channels"] == {"edge": "unchanged", "cloud": "unchanged"}
        assert alias_version("ops-promote", "champion") == version
        manifest = json.loads(Path(first["manifest"]).read_text())["signed"]
        assert manifest["mlflow"]["version"] == version

    def test_a_registry_run_whose_alias_moved_on_moves_nothing(self, run_dir, tmp_path):
        """A late run of the alias watcher's request: the alias it came from names another version
        (here none) right before the channels would move; skipped, the XCom says what it names."""
        from airflow.sdk.exceptions import AirflowSkipException

        from onnxcast.airflow.operators import PromoteModelOperator
        from onnxcast.airflow.rollout import SUPERSEDED_KEY

        version = register(run_dir, "ops-superseded", "promote-superseded")
        store = tmp_path / "store"
        context = make_context()
        op = PromoteModelOperator(task_id="promote", run_dir=run_dir, version=version, channels=["edge"],
                                  store_uri=str(store), source="registry", alias="edge")
        with pytest.raises(AirflowSkipException, match=f"superseded: alias edge of ops-superseded names no version "
                                                       f"now, not v{version}"):
            op.execute(context)
        assert context["ti"].xcoms[SUPERSEDED_KEY] == ""
        assert not (store / "ops-superseded" / "channels").exists()

    def test_the_log_reads_channel_by_channel_not_as_a_dict(self, run_dir, tmp_path, capsys):
        """Issue 18 item 16: "Promoted m v1 to {'edge': 'moved', 'cloud': 'moved'} in ..." in the task log."""
        from onnxcast.airflow.operators import PromoteModelOperator

        version = register(run_dir, "ops-promote-log", "promote-log")
        PromoteModelOperator(task_id="promote", run_dir=run_dir, version=version, channels=["edge", "cloud"],
                             store_uri=str(tmp_path / "store"),
                             decision={"promote": True, "reason": "first"}).execute(make_context())
        line = next(line for line in capsys.readouterr().out.splitlines() if "Promoted ops-promote-log" in line)
        assert f"v{version} to edge=moved, cloud=moved in " in line
        assert "{" not in line

    def test_embedded_mode_signs_with_a_development_key_that_devices_can_trust(self, run_dir, tmp_path, monkeypatch):
        from onnxcast.airflow.operators import PromoteModelOperator
        from onnxcast.rollout.edge import pull

        home = tmp_path / "home"
        monkeypatch.setenv("ONNXCAST_HOME", str(home))
        monkeypatch.delenv("ONNXCAST_SIGNING_KEY")
        monkeypatch.delenv("ONNXCAST_TRUST")
        version = register(run_dir, "ops-demo-key", "promote-demo-key")
        PromoteModelOperator(task_id="promote", run_dir=run_dir, version=version, channels=["edge"]).execute(
            make_context())
        assert oct((home / "keys/signing.key").stat().st_mode & 0o777) == "0o600"
        result = pull(str(home / "rollout"), "ops-demo-key", "edge", tmp_path / "device", trust=home / "keys/root.json")
        assert result.version == version

    def test_a_configured_store_without_a_key_fails_clearly(self, run_dir, tmp_path, monkeypatch):
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.operators import PromoteModelOperator

        monkeypatch.delenv("ONNXCAST_SIGNING_KEY")
        version = register(run_dir, "ops-no-key", "promote-no-key")
        op = PromoteModelOperator(task_id="promote", run_dir=run_dir, version=version, channels=["edge"],
                                  store_uri=str(tmp_path / "store"))
        with pytest.raises(AirflowFailException, match="no signing key: set ONNXCAST_SIGNING_KEY"):
            op.execute(make_context())
        assert not (tmp_path / "store").exists()


class TestStageRegisteredVersionOperator:
    def test_template_fields(self):
        from onnxcast.airflow.operators import StageRegisteredVersionOperator

        values = {"model_name": "{{ params.model_name }}", "ref": "{{ params.version }}", "run_root": "/r"}
        op = StageRegisteredVersionOperator(task_id="stage", **values)
        assert set(op.template_fields) == set(values)
        assert_template_fields_stored_unchanged(op, values)

    def test_retry_stages_the_same_files(self, run_dir, tmp_path):
        from onnxcast.airflow.operators import StageRegisteredVersionOperator

        version = register(run_dir, "ops-stage", "stage-retry")
        op = StageRegisteredVersionOperator(task_id="stage", model_name="ops-stage", ref="challenger",
                                            run_root=str(tmp_path))
        first, second = op.execute(make_context()), op.execute(make_context())
        assert first == second and first["version"] == version and first["family"] == "lstm"
        staged = Path(first["run_dir"])
        original = json.loads(Path(run_dir, "report.json").read_text())
        for variant in original["models"][0]["variants"]:
            assert (staged / variant["onnx_path"]).read_bytes() == Path(run_dir, variant["onnx_path"]).read_bytes()

    def test_unknown_alias_fails_with_a_clear_message(self, tmp_path):
        from airflow.sdk.exceptions import AirflowFailException

        from onnxcast.airflow.operators import StageRegisteredVersionOperator

        op = StageRegisteredVersionOperator(task_id="stage", model_name="ops-stage-none", ref="champion",
                                            run_root=str(tmp_path))
        with pytest.raises(AirflowFailException, match="no alias 'champion'"):
            op.execute(make_context())


class TestRollbackChannelOperator:
    def test_template_fields(self):
        from onnxcast.airflow.operators import RollbackChannelOperator

        values = {"model_name": "m", "channel": "{{ params.channel }}", "to_version": "{{ params.to_version }}",
                  "store_uri": "{{ params.store_uri }}", "reason": "{{ params.reason }}",
                  "move_champion": "{{ params.move_champion }}", "signing_key": "{{ var.value.key }}"}
        op = RollbackChannelOperator(task_id="rollback", **values)
        assert set(op.template_fields) == set(values)
        assert_template_fields_stored_unchanged(op, values)

    def test_retry_is_a_no_op(self, run_dir, tmp_path):
        from onnxcast.airflow.operators import PromoteModelOperator, RollbackChannelOperator
        from onnxcast.registry.tracking import alias_version

        store = str(tmp_path / "store")
        versions = []
        for run_id in ("rollback-1", "rollback-2"):
            version = register(run_dir, "ops-rollback", run_id)
            PromoteModelOperator(task_id="promote", run_dir=run_dir, version=version, channels=["edge", "cloud"],
                                 store_uri=store).execute(make_context(run_id=run_id))
            versions.append(version)
        op = RollbackChannelOperator(task_id="rollback", model_name="ops-rollback", channel="edge", store_uri=store,
                                     reason="bad edge results")
        first, second = op.execute(make_context()), op.execute(make_context())
        assert (first["version"], first["from_version"], first["changed"]) == (versions[0], versions[1], True)
        # a retry of the same task walks back no further
        assert (second["version"], second["changed"]) == (versions[0], False)
        assert alias_version("ops-rollback", "champion") == versions[0]
        # the channels' aliases followed each move: edge back with the channel, cloud where it was
        assert (alias_version("ops-rollback", "edge"), alias_version("ops-rollback", "cloud")) == (versions[0],
                                                                                                versions[1])


class TestRefreshChannelsOperator:
    def test_template_fields(self):
        from onnxcast.airflow.operators import RefreshChannelsOperator

        values = {"model_name": "{{ params.model_name }}", "channels": "{{ params.channels }}",
                  "store_uri": "{{ params.store_uri }}", "expires_days": "{{ params.expires_days }}",
                  "signing_key": "{{ var.value.key }}"}
        op = RefreshChannelsOperator(task_id="refresh", **values)
        assert set(op.template_fields) == set(values)
        assert_template_fields_stored_unchanged(op, values)

    def test_re_signs_existing_channels_and_skips_missing_ones(self, run_dir, tmp_path):
        from onnxcast.airflow.operators import PromoteModelOperator, RefreshChannelsOperator

        store = str(tmp_path / "store")
        version = register(run_dir, "ops-refresh", "refresh-1")
        PromoteModelOperator(task_id="promote", run_dir=run_dir, version=version, channels=["edge"],
                             store_uri=store).execute(make_context(run_id="refresh-1"))
        before = json.loads((tmp_path / "store/ops-refresh/channels/edge.json").read_text())["signed"]
        result = RefreshChannelsOperator(task_id="refresh", model_name="ops-refresh", channels=["edge", "cloud"],
                                         store_uri=store, expires_days="60").execute(make_context())
        assert set(result["channels"]) == {"edge"}
        after = json.loads((tmp_path / "store/ops-refresh/channels/edge.json").read_text())["signed"]
        assert after["version"] == before["version"] == version
        assert after["counter"] > before["counter"] and after["expires"] > before["expires"]
        assert after["action"] == "refresh" and after["history"] == before["history"]
