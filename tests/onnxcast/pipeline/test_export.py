import numpy as np
import onnx
import pytest
import torch

from onnxcast.base.contract import opset_of, read_metadata, signature
from onnxcast.base.errors import ExportError
from onnxcast.pipeline.export import export_onnx, io_contract_problems
from onnxcast.pipeline.models import ModelSpec, build_model
from onnxcast.pipeline.sessions import onnx_session

META = {"model_family": "x", "lookback": 48, "horizon": 12, "freq": "h", "target": "load",
        "features": "temp", "precision": "fp32", "trained_until": "2024-01-01T00:00:00Z",
        "dataset_sha256": "ab" * 32}


@pytest.fixture(scope="module", params=["lstm", "transformer", "nhits", "dlinear", "base"])
def exported(request, tmp_path_factory):
    spec = ModelSpec(family=request.param, n_features=2, horizon=12, lookback=48, hidden_size=16,
                     num_layers=2, d_model=16, n_heads=2, season=24, seasons=(24, 48))
    torch.manual_seed(0)
    model = build_model(spec, mean=np.array([5000.0, 20.0]), std=np.array([800.0, 5.0])).eval()
    if request.param in ("dlinear", "base"):  # their heads start at zero: give parity something to check
        with torch.no_grad():
            for parameter in model.core.parameters():
                parameter.normal_(0.0, 0.05)
    path = export_onnx(model, tmp_path_factory.mktemp("export") / "fp32.onnx", n_features=2, lookback=48,
                       metadata={**META, "model_family": request.param})
    return model, path


def test_signature_follows_the_contract_with_dynamic_batch_and_time(exported):
    _, path = exported
    sig = signature(onnx.load(path))
    assert sig["inputs"] == [{"name": "history", "dtype": "float32", "shape": ["batch", "time", 2]}]
    assert sig["outputs"][0]["name"] == "forecast"
    assert sig["outputs"][0]["shape"][1] == 12
    assert isinstance(sig["outputs"][0]["shape"][0], str)


def test_metadata_props_carry_the_contract(exported):
    _, path = exported
    meta = read_metadata(onnx.load(path))
    for key in ("model_family", "lookback", "horizon", "freq", "target", "features", "precision",
                "trained_until", "dataset_sha256"):
        assert key in meta
    assert meta["target"] == "load" and meta["lookback"] == "48"


@pytest.mark.parametrize(("batch", "time"), [(1, 48), (2, 48), (3, 49), (33, 48), (9, 200), (64, 97)])
def test_parity_with_pytorch_at_shapes_unlike_the_export(exported, batch, time):
    """Any batch, any history of at least the lookback (48): the contract."""
    model, path = exported
    rng = np.random.default_rng(batch * 1000 + time)
    history = (rng.normal(size=(batch, time, 2)) * [800.0, 5.0] + [5000.0, 20.0]).astype(np.float32)
    got = onnx_session(path).run(["forecast"], {"history": history})[0]
    with torch.no_grad():
        expected = model(torch.from_numpy(history)).numpy()
    assert got.shape == (batch, 12)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


def test_missing_metadata_is_refused(tmp_path):
    model = build_model(ModelSpec(family="lstm", n_features=1, horizon=2, lookback=8, hidden_size=4, num_layers=1, season=2))
    with pytest.raises(ExportError, match="missing ONNX metadata.*dataset_sha256"):
        export_onnx(model, tmp_path / "m.onnx", n_features=1, lookback=8,
                    metadata={k: v for k, v in META.items() if k != "dataset_sha256"})
    assert not (tmp_path / "m.onnx").exists()


def test_opset_conversion_on_request(tmp_path):
    model = build_model(ModelSpec(family="lstm", n_features=1, horizon=2, lookback=8, hidden_size=4, num_layers=1, season=2))
    path = export_onnx(model, tmp_path / "m.onnx", n_features=1, lookback=8,
                       metadata={**META, "model_family": "lstm"}, opset=18)
    assert opset_of(onnx.load(path)) == 18
    out = onnx_session(path).run(["forecast"], {"history": np.ones((3, 11, 1), np.float32)})[0]
    assert out.shape == (3, 2)


def test_a_silently_frozen_time_axis_is_refused(tmp_path):
    """The dynamo exporter specialised nn.LSTM to the example length after a first export in
    the process (torch 2.13); the contract check must refuse such a graph, never ship it."""
    spec = ModelSpec(family="lstm", n_features=1, horizon=2, lookback=8, hidden_size=4, num_layers=1, season=2)
    for attempt in range(2):
        try:
            export_onnx(build_model(spec), tmp_path / f"m{attempt}.onnx", n_features=1, lookback=8,
                        metadata={**META, "model_family": "lstm"}, exporter="dynamo")
        except ExportError as err:
            assert "history axis 1 is fixed at 8, expected dynamic" in str(err)
            assert not (tmp_path / f"m{attempt}.onnx").exists()
            return
        assert signature(onnx.load(tmp_path / f"m{attempt}.onnx"))["inputs"][0]["shape"][1] == "time"
    # both exports stayed dynamic: the exporter was fixed; the check still guards the contract


def test_contract_check_flags_a_frozen_batch_axis():
    history = onnx.helper.make_tensor_value_info("history", onnx.TensorProto.FLOAT, [1, "time", 1])
    forecast = onnx.helper.make_tensor_value_info("forecast", onnx.TensorProto.FLOAT, [1, 2])
    graph = onnx.helper.make_graph([], "g", [history], [forecast])
    problems = io_contract_problems(onnx.helper.make_model(graph))
    assert "history axis 0 is fixed at 1, expected dynamic" in problems
    assert "forecast axis 0 is fixed at 1, expected dynamic" in problems


@pytest.mark.parametrize("family", ["nhits", "dlinear", "base"])
def test_a_window_family_exports_and_quantizes_without_warnings(family, tmp_path, capfd, caplog):
    """Every export printed four "torchvision is not installed. Skipping torchvision::nms" lines
    (torch's ONNX registry; torchvision is not a dependency), and int8's shape inference warned
    "Cannot determine if time - 48 < 0" (the window slice started at ``time - lookback``)."""
    import logging

    from onnxcast.pipeline.optimize import make_variants

    spec = ModelSpec(family=family, n_features=2, horizon=12, lookback=48, hidden_size=16, season=24, seasons=(24, 48))
    model = build_model(spec, mean=np.array([5000.0, 20.0]), std=np.array([800.0, 5.0])).eval()
    caplog.set_level(logging.WARNING)
    path = export_onnx(model, tmp_path / "fp32.onnx", n_features=2, lookback=48, metadata={**META, "model_family": family})
    made = make_variants(path, tmp_path, family)
    assert "int8" in {v.name for v in made}
    printed = capfd.readouterr()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for text in (printed.out + printed.err, logged):
        assert "torchvision" not in text
        assert "Cannot determine" not in text
    # the window is read from the end: no Sub of the time dimension feeds a Slice of history
    graph = onnx.load(path).graph
    slices = [n for n in graph.node if n.op_type == "Slice" and n.input[0] == "history"]
    starts = {i.name: onnx.numpy_helper.to_array(i).tolist() for i in graph.initializer}
    assert [starts.get(n.input[1]) for n in slices] == [[-48]]
