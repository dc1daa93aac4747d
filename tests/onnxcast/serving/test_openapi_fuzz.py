"""The service's OpenAPI document, fuzzed with schemathesis against a real ``onnxcast serve``:
no 5xx, only documented status codes, and answers that match the documented schemas."""

from __future__ import annotations

import json

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from serve_support import kill, launch  # noqa: E402

from onnxcast.rollout.promote import promote  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_onnx_quantiles, release_key):
    """A server with version 1 of model 'm' on the cloud channel, for the whole module: a model
    with both outputs (forecast and quantiles), as every export since forecast distributions."""
    import hashlib
    import shutil

    folder = tmp_path_factory.mktemp("fuzz")
    target = folder / "run/models/lstm/onnx/fp32.onnx"
    target.parent.mkdir(parents=True)
    shutil.copy(tiny_onnx_quantiles, target)
    data = target.read_bytes()
    variant = {"name": "fp32", "onnx_path": "models/lstm/onnx/fp32.onnx", "sha256": hashlib.sha256(data).hexdigest(),
               "size_bytes": len(data), "opset": 18, "eligible": True, "reasons": [], "gates": {},
               "holdout": {"mae": 1.0, "rmse": 1.0, "smape": 1.0, "mase": 1.0}}
    report = {"dataset": {"uri": "x", "sha256": "cd" * 32, "target": "y", "features": ["x1"]},
              "models": [{"family": "lstm", "gates_passed": True, "variants": [variant]}],
              "selected": {"cloud": {"family": "lstm", "variant": "fp32"}}}
    (folder / "run/report.json").write_text(json.dumps(report))
    # Module scope runs before the per-test signing-key environment: sign and trust explicitly.
    promote(folder / "run/report.json", str(folder / "store"), "m", "cloud", version="1",
            signers=[release_key["private"]])
    server = launch(str(folder / "store"), folder, "--trust", str(release_key["root"]))
    server.wait_ready("1")
    yield server
    kill(server)


def test_openapi_document_holds(served):
    from hypothesis import given
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    schema = schemathesis.openapi.from_url(served.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /v2/models/{name}/infer", "GET /v2/models/{name}", "GET /v2/health/ready"}
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def holds(case):
            if case.path_parameters:  # the served model, so that bodies reach the decoder
                case.path_parameters.update({"name": "m", **({"version": "1"} if "version" in case.path_parameters else {})})
            # A schema-valid body may still not fit the served model (values for every shape
            # element, the model's features and history length): those 400s are the contract.
            case.call_and_validate(excluded_checks=[positive_data_acceptance])

        holds()
    assert served.process.poll() is None
    metrics = served.metrics()
    assert 'code="5' not in metrics
    answered = {line.split("code=")[1].split('"')[1]: float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("onnxcast_serve_requests_total{")}
    print("infer answers by code:", answered)
    assert sum(answered.values()) >= 40 and "400" in answered  # fuzzed bodies reached the decoder
