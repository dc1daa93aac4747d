"""Every pipeline setting is declared once (onnxcast.pipeline.config.setting): the
`onnxcast pipeline` options, the training DAG's params and check_data's templates, and the
range checks are generated from that declaration, so adding a setting is one edit."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from onnxcast.base.errors import ConfigError
from onnxcast.base.files import onnxcast_home
from onnxcast.pipeline.config import (
    EXAMPLE_DATA,
    FAMILY_LABELS,
    MODEL_FAMILIES,
    MODEL_NAME_PATTERN,
    TRAINING,
    PipelineConfig,
    QualitySettings,
    data_source,
    ranges,
    setting,
    settings,
)

REPO = Path(__file__).resolve().parents[3]


@dataclasses.dataclass(frozen=True)
class _OneMore(PipelineConfig):
    """PipelineConfig and one new setting, made by the one edit a new setting takes."""

    warmup_epochs: int = setting(3, help="epochs at a rising learning rate", cli="--warmup-epochs",
                                 group=TRAINING, dag=True, low=0, high=1000)


def _pipeline_parser(cls: type = PipelineConfig) -> argparse.ArgumentParser:
    from onnxcast.cli import add_settings_arguments

    parser = argparse.ArgumentParser(prog="onnxcast pipeline")
    add_settings_arguments(parser, cls)
    return parser


def _cli_default(s):
    return ",".join(s.default) if s.kind is tuple else s.default


@pytest.fixture(scope="module")
def airflow():
    import airflow_support

    airflow_support.configure()


def test_every_field_is_a_declared_setting_with_help():
    names = [s.name for s in settings()]
    fields = [f.name for f in dataclasses.fields(PipelineConfig) if f.name != "quality"]
    quality = [f"quality.{f.name}" for f in dataclasses.fields(QualitySettings)]
    assert names == fields + quality
    assert all(s.help and s.description for s in settings())


def test_every_cli_setting_is_an_option_of_onnxcast_pipeline_with_its_default():
    from onnxcast.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = {o: a for a in commands.choices["pipeline"]._actions for o in a.option_strings}
    declared = {s.cli: s for s in settings() if s.cli}
    assert set(options) - {"-h", "--help"} == set(declared)
    for flag, s in declared.items():
        action = options[flag]
        assert action.required == s.required, flag
        if not s.required:
            assert action.default == _cli_default(s), flag
        if s.kind in (int, float):
            assert action.type is s.kind, flag


def test_the_defaults_of_the_options_are_the_defaults_of_the_settings():
    from onnxcast.cli import settings_from_args

    args = _pipeline_parser().parse_args(["--data", "x.csv", "--out", "o"])
    cfg = PipelineConfig.from_dict(settings_from_args(args))
    assert cfg == PipelineConfig(data_uri="x.csv", out_dir="o")


def test_every_dag_setting_is_a_param_of_the_training_dag_with_its_default_and_range(airflow):
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags" / "onnxcast_training.py")).dags["onnxcast_training"]
    templates = dag.get_task("check_data").settings
    declared = [s for s in settings() if s.dag]
    assert {s.name for s in declared} >= {"data_uri", "horizon", "lookback", "models", "max_epochs", "model_name"}
    for s in declared:
        param = dag.params.get_param(s.dag)
        schema = param.schema
        default = s.dag_default
        assert param.value == (list(default) if isinstance(default, tuple) else default), s.name
        if s.default is not dataclasses.MISSING and s.dag_default is s.default:
            assert param.value == (list(s.default) if s.kind is tuple else s.default), s.name
        assert param.description == s.description, s.name
        assert schema.get("minimum", schema.get("exclusiveMinimum")) == s.low, s.name
        assert schema.get("maximum", schema.get("exclusiveMaximum")) == s.high, s.name
        if s.choices:
            # the form offers every choice; its default is a subset (base and the ensemble are chosen by name;
            # x86_64 of the targets)
            assert set(schema["items"]["enum"]) == set(s.choices) >= set(param.value), s.name
        assert templates[s.name] == f"{{{{ params.{s.dag} }}}}", s.name
    assert set(templates) == {s.name for s in declared}
    assert dag.params["data_uri"] == EXAMPLE_DATA
    assert dag.params.get_param("model_name").schema["pattern"] == MODEL_NAME_PATTERN


def test_adding_a_setting_is_one_edit(airflow):
    """One field declared with setting() is an option of the command, a param of the DAG
    with its range, a template of check_data, and range-checked."""
    from onnxcast.airflow.params import pipeline_params, pipeline_templates
    from onnxcast.cli import settings_from_args

    args = _pipeline_parser(_OneMore).parse_args(["--data", "x.csv", "--out", "o", "--warmup-epochs", "7"])
    assert _OneMore.from_dict(settings_from_args(args, _OneMore)).warmup_epochs == 7
    assert _pipeline_parser(_OneMore).parse_args(["--data", "x.csv", "--out", "o"]).warmup_epochs == 3
    param = pipeline_params(_OneMore)["warmup_epochs"]
    assert (param.value, param.schema["type"], param.schema["minimum"], param.schema["maximum"]) == (3, "integer", 0,
                                                                                                     1000)
    assert param.description == "Epochs at a rising learning rate"
    assert pipeline_templates(_OneMore)["warmup_epochs"] == "{{ params.warmup_epochs }}"
    assert ranges(_OneMore)["warmup_epochs"][:3] == (int, 0, 1000)
    with pytest.raises(ConfigError, match=r"warmup_epochs must be in \[0, 1000\], got 1001"):
        _OneMore(data_uri="x.csv", out_dir="o", warmup_epochs=1001)
    assert "warmup_epochs" not in ranges(PipelineConfig)


def test_the_form_shows_every_family_in_its_own_order():
    assert set(FAMILY_LABELS) == set(MODEL_FAMILIES)


def test_the_model_name_pattern_is_the_rollout_stores():
    from onnxcast.rollout.store import NAME_PATTERN

    assert MODEL_NAME_PATTERN == f"^{NAME_PATTERN.pattern}$"


def test_example_is_the_built_in_data_and_anything_else_itself():
    from onnxcast.pipeline.config import example_data_path

    assert data_source(EXAMPLE_DATA) == example_data_path()
    assert data_source("s3://bucket/example") == "s3://bucket/example"


def test_onnxcast_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ONNXCAST_HOME", str(tmp_path / "env"))
    assert onnxcast_home() == tmp_path / "env"
    assert onnxcast_home(tmp_path / "given") == tmp_path / "given"
    monkeypatch.delenv("ONNXCAST_HOME")
    monkeypatch.chdir(tmp_path)
    assert onnxcast_home() == tmp_path / ".onnxcast"
    assert onnxcast_home(default=tmp_path / "repo" / ".onnxcast") == tmp_path / "repo" / ".onnxcast"


def test_example_and_onnxcast_home_are_resolved_in_one_place():
    sources = [p for folder in ("onnxcast", "dags", "scripts") for p in (REPO / folder).rglob("*.py")]
    home = re.compile(r"environ(ment)?(\.get\(|\[)\s*[\"']ONNXCAST_HOME")  # os.environ or onnxcast.base.environment
    example = re.compile(r"==\s*[\"']example[\"']|(?<!def )example_data_path\(\)")
    assert [p.relative_to(REPO).as_posix() for p in sources if home.search(p.read_text())] == [
        "onnxcast/base/files.py"]
    assert sorted(p.relative_to(REPO).as_posix() for p in sources if example.search(p.read_text())) == [
        "onnxcast/pipeline/config.py"]
