"""KServe's Python model server (``kserve.ModelServer``) serving an onnxcast ONNX model, for the
engine comparison in ``bench/serve.py --kserve-python``. Runs in its own environment: kserve
0.21 pins psutil<6, which the main environment (Airflow) cannot take.

Usage: ``python bench/kserve_server.py MODEL.onnx NAME PORT``
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class Forecaster(Model):
    def __init__(self, name: str, path: str):
        super().__init__(name)
        self.path = path
        self.load()

    def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        self.ready = True
        return True

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        history = payload.inputs[0].as_numpy().astype(np.float32)
        forecast = self.session.run(["forecast"], {"history": history})[0]
        output = InferOutput(name="forecast", shape=list(forecast.shape), datatype="FP32")
        output.set_data_from_numpy(forecast, binary_data=False)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=[output])


if __name__ == "__main__":
    path, name, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ModelServer(http_port=port, enable_grpc=False, workers=1, enable_latency_logging=False).start(
        [Forecaster(name, path)])
