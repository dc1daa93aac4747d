"""A fetched model.json is input: every way it can be wrong is one FetchError naming the field,
before any weight is loaded or anything is written (it raised ValueError, TypeError or
RecursionError before). A folder source, so no training and no server is needed."""

from __future__ import annotations

import json
import os

import pytest

from onnxcast.registry.fetch import FetchError, fetch_model, read_source_spec

GOOD = {"family": "lstm", "n_features": 1, "horizon": 12, "lookback": 56, "hidden_size": 16, "num_layers": 1,
        "d_model": 64, "n_heads": 4, "season": 24, "seasons": []}


def source(tmp_path, spec_text: str):
    folder = tmp_path / "source"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"never loaded: the spec is refused first")
    (folder / "model.json").write_text(spec_text)
    return folder


@pytest.mark.parametrize(("spec", "fragment"), [
    ({**GOOD, "family": "gru"}, "model.json spec field 'family' is 'gru', expected one of ['lstm', 'transformer', "
                                "'nhits', 'dlinear', 'base', 'ensemble']"),
    ({**GOOD, "family": ["lstm"]}, "field 'family' is ['lstm']"),
    ({**GOOD, "lookback": "56"}, "model.json spec field 'lookback' must be an integer, got '56'"),
    ({**GOOD, "lookback": -5}, "model.json spec field 'lookback' must be in [2, 100000], got -5"),
    ({**GOOD, "horizon": 2.5}, "field 'horizon' must be an integer, got 2.5"),
    ({**GOOD, "hidden_size": True}, "field 'hidden_size' must be an integer, got True"),
    ({**GOOD, "hidden_size": 65536}, "field 'hidden_size' must be in [1, 4096], got 65536"),
    ({**GOOD, "family": "nhits", "hidden_size": 4000, "lookback": 1000},
     "describes a nhits model of about 3,207,907,053 parameters, over the limit of 50,000,000"),
    ({**GOOD, "seasons": "24"}, "field 'seasons' must be a list of at most 8 integers"),
    ({**GOOD, "family": "dlinear", "seasons": [24, 500]}, "field 'seasons' holds 500, longer than 'lookback' 56"),
    ({**GOOD, "d_model": 30}, "field 'd_model' (30) is not divisible by 'n_heads' (4)"),
    ({**GOOD, "patch": 0}, "field 'patch' must be an integer in [1, 56] (the lookback), got 0"),
    ({**GOOD, "patch": 57}, "field 'patch' must be an integer in [1, 56] (the lookback), got 57"),
    ({**GOOD, "patch": "7"}, "field 'patch' must be an integer in [1, 56] (the lookback), got '7'"),
    ({**GOOD, "global_model": "yes"}, "field 'global_model' must be true or false, got 'yes'"),
    ({**GOOD, "nonnegative": "false"}, "field 'nonnegative' must be true or false, got 'false'"),
    ({**GOOD, "normalisation": "robust"}, "field 'normalisation' must be one of ['window', 'recent'], got 'robust'"),
    ({**GOOD, "n_series": -1}, "field 'n_series' must be a non-negative integer, got -1"),
    ({**GOOD, "evil": 1}, "model.json spec has unknown field(s) 'evil'"),
    ({k: v for k, v in GOOD.items() if k != "horizon"}, "model.json spec has no 'horizon'"),
])
def test_a_bad_spec_is_a_fetch_error_naming_the_field(tmp_path, spec, fragment):
    folder = source(tmp_path, json.dumps({"spec": spec}))
    for call in (lambda: read_source_spec(str(folder)), lambda: fetch_model(str(folder), tmp_path / "m")):
        with pytest.raises(FetchError) as error:
            call()
        assert fragment in str(error.value)
        assert str(error.value).startswith(str(folder))
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(("text", "fragment"), [
    ('{"spec": ' + "[" * 100_000 + "]" * 100_000 + "}", "model.json is nested deeper than 64 levels"),
    ("[1, 2]", "model.json is not a JSON object with a 'spec' object"),
    ('{"spec": 3}', "not a JSON object with a 'spec' object"),
    ("{not json", "model.json is not valid JSON at byte 1"),
])
def test_a_model_json_that_is_not_a_spec_document_is_a_fetch_error(tmp_path, text, fragment):
    folder = source(tmp_path, text)
    with pytest.raises(FetchError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        read_source_spec(str(folder))


def test_model_json_is_read_only_from_a_regular_file(tmp_path):
    folder = tmp_path / "source"
    folder.mkdir()
    os.mkfifo(folder / "model.json")  # a read would block forever
    (folder / "model.pt").write_bytes(b"x")
    with pytest.raises(FetchError, match="is not a regular file \\(a FIFO\\)"):
        read_source_spec(str(folder))
