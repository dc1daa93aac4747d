"""Peak memory of one candidate, measured in a fresh process (run by bench/run.py).

    python bench/memprobe.py torch RUN_DIR FAMILY      PyTorch eager from the run's state dict
    python bench/memprobe.py onnx MODEL.onnx N_FEATURES LOOKBACK
    python bench/memprobe.py openvino MODEL.onnx N_FEATURES LOOKBACK

Prints JSON ``{"1": MiB, "64": MiB, "1024": MiB}``: the growth of the peak resident set size
(VmHWM) over the process's size after its imports, through loading the model and running batch
1, then 64, then 1,024 (so each figure includes the smaller runs' buffers, which are reused).
A fresh process is needed because a long-lived one reuses freed heap pages and hides growth.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

BATCHES = (1, 64, 1024)


def status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def main(argv: list[str]) -> None:
    kind = argv[0]
    if kind == "torch":
        import torch

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from onnxcast.pipeline.models import ModelSpec, build_model

        torch.set_num_threads(1)
        directory = Path(argv[1]) / "models" / argv[2]
        spec = ModelSpec(**json.loads((directory / "model.json").read_text())["spec"])
        n_features, lookback = spec.n_features, spec.lookback
        inputs = {b: np.random.default_rng(0).standard_normal((b, lookback, n_features), dtype=np.float32)
                  for b in BATCHES}
        base = status_kib("VmRSS:")
        model = build_model(spec)
        model.load_state_dict(torch.load(directory / "model.pt", weights_only=True))
        model.eval()

        def run(x: np.ndarray) -> None:
            with torch.inference_mode():
                model(torch.from_numpy(x))
    elif kind == "openvino":  # the openvino deployment target: f32 hint (onnxcast.rollout.device_runtime)
        import openvino as ov

        n_features, lookback = int(argv[2]), int(argv[3])
        inputs = {b: np.random.default_rng(0).standard_normal((b, lookback, n_features), dtype=np.float32)
                  for b in BATCHES}
        base = status_kib("VmRSS:")
        core = ov.Core()
        compiled = core.compile_model(core.read_model(argv[1]), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
        request = compiled.create_infer_request()

        def run(x: np.ndarray) -> None:
            request.infer({"history": x})
    else:
        import onnxruntime as ort

        n_features, lookback = int(argv[2]), int(argv[3])
        inputs = {b: np.random.default_rng(0).standard_normal((b, lookback, n_features), dtype=np.float32)
                  for b in BATCHES}
        base = status_kib("VmRSS:")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(argv[1], options, providers=["CPUExecutionProvider"])

        def run(x: np.ndarray) -> None:
            session.run(["forecast"], {"history": x})

    out = {}
    for batch in BATCHES:
        run(inputs[batch])
        run(inputs[batch])
        out[str(batch)] = (status_kib("VmHWM:") - base) / 1024.0
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
