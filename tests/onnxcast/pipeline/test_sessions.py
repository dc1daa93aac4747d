"""ONNX Runtime sessions (onnxcast.pipeline.sessions): threads explicit, spinning off, and a
served file ONNX Runtime cannot load named in one line."""

from __future__ import annotations

import pytest

from onnxcast.base.errors import VerificationError
from onnxcast.pipeline.sessions import onnx_session, open_model

SPINNING = "session.intra_op.allow_spinning"


def identity_model(path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["history"], ["forecast"])], "identity",
                              [helper.make_tensor_value_info("history", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("forecast", TensorProto.FLOAT, ["batch", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"onnxcast.lookback": "3"})
    onnx.save(model, str(path))
    return path


def test_a_session_has_explicit_threads_and_no_spinning(tmp_path):
    options = onnx_session(identity_model(tmp_path / "m.onnx"), threads=2).get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert options.get_session_config_entry(SPINNING) == "0"


def test_a_served_model_opens_like_the_pipelines_with_its_metadata(tmp_path):
    session, metadata = open_model(identity_model(tmp_path / "m.onnx"))
    assert metadata == {"onnxcast.lookback": "3"}
    assert session.get_session_options().get_session_config_entry(SPINNING) == "0"


def test_a_file_onnx_runtime_cannot_load_is_named(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"not a model\n")
    with pytest.raises(VerificationError, match=r"broken\.onnx: ONNX Runtime cannot load it: ") as error:
        open_model(path)
    assert "\n" not in str(error.value)
