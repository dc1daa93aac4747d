"""The child process of a target run: loads a model in one runtime, runs a batch of inputs, times it.

Run as a script (``python worker.py [--site FOLDERS] RUNTIME MODEL INPUTS.npz OUTPUT.npz REPEATS``, or
``python worker.py compile-tvm MODEL FOLDER SHAPES_JSON TARGET_JSON CC``), never imported by
onnxcast: it runs in interpreters where onnxcast is not installed (Debian's arm64 python3.11 under
qemu-user, with only numpy and onnxruntime's aarch64 wheels on its path), so it imports the standard
library, numpy and the one runtime it is asked for, nothing else. A crash of the runtime (OpenVINO's
reported SIGFPE in ``compile_model`` on some EPYCs) kills this process, not the caller.

Writes ``OUTPUT.npz`` (``out_<input>_<output>``: every graph output per input, in graph order) and
prints one JSON line: the runtime's environment, the output names and per-input latency (ms).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

EXIT_MODEL_REFUSED, EXIT_NO_RUNTIME = 3, 4  # onnxcast.targets.runners reads these


def main(argv: list[str]) -> int:
    # run with -I (no PYTHONPATH, no user site, not the script's folder): the extra folders are the
    # target's wheels (the Arm sysroot's site folders)
    if len(argv) > 2 and argv[1] == "--site":  # --site FOLDERS (os.pathsep-separated) first, if any
        sys.path[:0] = [p for p in argv[2].split(os.pathsep) if p]
        argv = [argv[0], *argv[3:]]
    if argv[1] == "compile-tvm":  # compile-tvm MODEL FOLDER SHAPES_JSON TARGET_JSON CC
        compile_tvm(argv[2], argv[3], json.loads(argv[4]), json.loads(argv[5]), argv[6])
        return 0
    runtime, model, inputs_path, output_path, repeats = argv[1], argv[2], argv[3], argv[4], int(argv[5])
    import numpy as np

    with np.load(inputs_path) as data:
        inputs = [data[f"in_{i}"] for i in range(len(data.files))]
    try:
        run, names, versions = RUNTIMES[runtime](model)
    except ImportError as exc:
        print(f"{runtime} is not installed: {exc}", file=sys.stderr)
        return EXIT_NO_RUNTIME
    except Exception as exc:  # each runtime raises its own types for a model it cannot read or compile
        print(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
        return EXIT_MODEL_REFUSED
    outputs, latency = {}, []
    for i, history in enumerate(inputs):
        got = run(history)
        for name, value in zip(names, got, strict=True):
            outputs[f"out_{i}_{name}"] = np.array(value, copy=True)  # OpenVINO returns views of its own buffers
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run(history)
            times.append((time.perf_counter() - start) * 1000.0)
        latency.append(times)
    np.savez(output_path, **outputs)
    versions["numpy"] = np.__version__
    print(json.dumps({"outputs": names, "latency_ms": latency, "environment": environment(versions)}))
    return 0


def onnxruntime_runner(model: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # like the pipeline's sessions (onnxcast.pipeline.sessions)
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return (lambda history: session.run(names, {"history": history})), names, {"onnxruntime": ort.__version__}


def openvino_runner(model: str, row_by_row: bool | None = None):
    """OpenVINO's CPU device, f32. ``row_by_row`` (None: where the history has more than one column):
    one history row per inference, because OpenVINO 2026.4.1 miscomputes a batch > 1 where a
    ReduceMean(keepdims) is followed by the Add of a [1, C, 1] constant with C > 1 (every family's
    normalisation of a target and its features; docs/targets.md has a two-node reproduction): rows
    after the first come out wrong. Batch 1, or one column, agrees with ONNX Runtime within 1e-6
    of the level."""
    import numpy as np
    import openvino as ov

    core = ov.Core()
    # f32: the PERFORMANCE mode silently computes in bf16 where the CPU has avx512_bf16, which costs
    # parity (PITFALLS.md, "OpenVINO on this AMD CPU")
    compiled = core.compile_model(core.read_model(model), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1})
    names = [o.get_any_name() for o in compiled.outputs]
    request = compiled.create_infer_request()

    def infer(history):
        result = request.infer({"history": history})
        return [np.array(result[o], copy=True) for o in compiled.outputs]  # views of OpenVINO's buffers

    def run(history):
        by_row = history.shape[-1] > 1 if row_by_row is None else row_by_row
        if not by_row or len(history) <= 1:
            return infer(history)
        rows = [infer(history[i:i + 1]) for i in range(len(history))]
        return [np.concatenate([r[k] for r in rows]) for k in range(len(names))]

    versions = {"openvino": ov.get_version(),
                "inference_precision": str(compiled.get_property("INFERENCE_PRECISION_HINT")),
                "batching": {None: "row by row where the history has more than one column", True: "row by row",
                             False: "as given"}[row_by_row]}
    return run, names, versions


def tvm_runner(model: str):
    """``model`` is a folder of libraries from :func:`compile_tvm`, one per input shape
    (``b<batch>_t<time>.so``): TVM compiles for a static shape. Only TVM's runtime library loads
    (``TVM_USE_RUNTIME_LIB``): under qemu the compiler's would take minutes to load."""
    import tvm
    from tvm import relax

    with open(os.path.join(model, "outputs.json"), encoding="utf-8") as f:
        names = json.load(f)
    machines = {}

    def run(history):
        key = f"b{history.shape[0]}_t{history.shape[1]}"
        if key not in machines:
            library = os.path.join(model, f"{key}.so")
            if not os.path.exists(library):
                raise SystemExit(f"no TVM library for input shape {list(history.shape)} in {model}")
            machines[key] = relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu())
        result = machines[key]["main"](tvm.runtime.tensor(history))
        values = [result] if hasattr(result, "numpy") else list(result)
        return [v.numpy() for v in values]

    return run, names, {"tvm": tvm.__version__}


def compile_tvm(model: str, folder: str, shapes: list[list[int]], target: dict, cc: str) -> None:
    """Compile ``model`` for each ``[batch, time, features]`` in ``shapes`` into ``folder`` with TVM's
    Relax ONNX frontend. onnxslim first folds the graph's shape arithmetic at that static shape: the
    frontend leaves it as tensors of unknown shape that it then cannot lower (the Transformer)."""
    import onnx
    import onnxslim
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    proto = onnx.load(model)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "outputs.json"), "w", encoding="utf-8") as f:
        json.dump([o.name for o in proto.graph.output], f)
    for shape in shapes:
        slim = onnxslim.slim(proto, input_shapes=[f"history:{','.join(str(d) for d in shape)}"])
        module = from_onnx(slim, shape_dict={"history": list(shape)}, keep_params_in_input=False)
        executable = tvm.compile(module, target=tvm.target.Target(target))
        executable.export_library(os.path.join(folder, f"b{shape[0]}_t{shape[1]}.so"), cc=cc)
    print(json.dumps({"compiled": len(shapes), "tvm": tvm.__version__}))


RUNTIMES = {"onnxruntime": onnxruntime_runner, "openvino": openvino_runner, "tvm": tvm_runner,
            "openvino-batched": lambda model: openvino_runner(model, row_by_row=False)}


def environment(versions: dict) -> dict:
    """Where this process ran: machine, Python, runtimes, the CPU model and flags it sees."""
    model, flags = "", []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu part") and not model:  # an Arm kernel prints the part number only
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = value.split()
    except OSError:
        pass
    return {"machine": platform.machine(), "python": platform.python_version(), "runtimes": versions,
            "cpu_model": model, "cpu_flags": flags}


if __name__ == "__main__":
    sys.exit(main(sys.argv))
