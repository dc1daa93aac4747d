"""The Open Inference Protocol (KServe V2) for the onnxcast model contract: decode and check
an inference request, encode the response.

Both the JSON form and the binary tensor extension (``Inference-Header-Content-Length``, as
``tritonclient[http]`` sends by default) are understood. Every problem with a request is a
:class:`RequestError` carrying the HTTP status and a one-line message naming what is wrong;
whatever of the request it names goes through :func:`shown` (clipped: a 10 MB ``datatype``
once came back whole in a 10 MB answer). JSON ``data`` must be of the declared datatype's
JSON type (numbers for FP16/FP32/FP64, never booleans or strings), as the Open Inference
Protocol says; the other V2 datatypes are refused before any data is read.

A model answers with ``forecast`` [batch, horizon] and, when it has one, ``quantiles``
[batch, horizon, Q]: a request that names no ``outputs`` gets every output of the model, in
that order; one that names some gets those, in its order, each as JSON or binary data as its
``binary_data`` parameter (or the request's ``binary_data_output``) says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import orjson

from onnxcast.base.contract import INPUT_NAME, OUTPUT_NAME
from onnxcast.base.untrusted import MAX_QUOTED, quote

TOO_DEEP = "request body is nested too deep (a V2 request nests 4 levels)"
MAX_ID_CHARS = 256  # a request id is echoed in the answer (V2): a longer one is refused, not echoed
MAX_ERROR_CHARS = 1000  # backstop: no error line is longer, whatever a message holds

HEADER_LENGTH = "inference-header-content-length"
DATATYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16}  # history must be float


class RequestError(ValueError):
    """A request the service refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """What a request may hold, from the served model and the settings."""

    n_features: int
    min_history: int
    max_history: int
    max_batch: int


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool  # sent as binary data after the JSON header, not as "data"


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    history: np.ndarray  # float32 [batch, time, n_features], finite
    outputs: tuple[RequestedOutput, ...]  # what to answer with, in order

    @property
    def binary_output(self) -> bool:
        """Whether the response uses the binary tensor extension (any output as binary data)."""
        return any(output.binary for output in self.outputs)


def decode_request(body: bytes, header_length: str | None, limits: Limits,
                   outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> InferRequest:
    """Parse and check a V2 infer request body (JSON, or JSON + binary tensors); ``outputs``
    are the served model's output names, in the order a request naming none gets them."""
    binary = b""
    if header_length is not None:
        try:
            size = int(header_length)
        except ValueError:
            raise RequestError(f"Inference-Header-Content-Length {shown(header_length)} is not an integer") from None
        if not 0 < size <= len(body):
            raise RequestError(f"Inference-Header-Content-Length {size} is outside the body's {len(body)} bytes")
        body, binary = body[:size], body[size:]
    try:
        request = orjson.loads(body)  # ~6x faster than json for a history of floats
    except orjson.JSONDecodeError as exc:
        # Past orjson's 1,024 levels the stdlib fallback below recursed into a RecursionError
        # (a 500): refuse the depth here, and catch it there for input orjson stopped on earlier.
        if str(exc).startswith("depth limit"):
            raise RequestError(TOO_DEEP) from None
        try:  # NaN and Infinity are not JSON, but Python clients send them: say which value
            request = json.loads(body)
        except RecursionError:
            raise RequestError(TOO_DEEP) from None
        except (ValueError, UnicodeDecodeError):
            raise RequestError("request body is not valid JSON") from None
    if not isinstance(request, dict):
        raise RequestError("request body must be a JSON object with 'inputs'")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise RequestError(f"'inputs' must list exactly one tensor named {INPUT_NAME!r}")
    tensor = inputs[0]
    if tensor.get("name") != INPUT_NAME:
        raise RequestError(f"unknown input {shown(tensor.get('name'))}: this model takes {INPUT_NAME!r}")
    history = _tensor(tensor, binary, limits)
    _check_finite(history)
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError("'id' must be a string")
    if request_id is not None and len(request_id) > MAX_ID_CHARS:
        raise RequestError(f"'id' is {len(request_id):,} characters; at most {MAX_ID_CHARS} (it is echoed in the answer)")
    return InferRequest(request_id, history, _requested_outputs(request, outputs))


def encode_response(model: str, version: str, request_id: str | None, results: dict[str, np.ndarray] | np.ndarray,
                    binary: bool | tuple[RequestedOutput, ...]) -> tuple[bytes, dict[str, str]]:
    """The V2 response body and its extra headers. ``results``: the model's outputs by name
    (a bare array is ``forecast``); ``binary``: the request's outputs (a bool: ``forecast``
    alone, binary or not). Binary outputs follow the JSON header in the order listed."""
    if not isinstance(results, dict):
        results = {OUTPUT_NAME: results}
    wanted = (RequestedOutput(OUTPUT_NAME, binary),) if isinstance(binary, bool) else binary
    response = {"model_name": model, "model_version": version, "outputs": []}
    if request_id is not None:
        response["id"] = request_id
    headers = {"x-model-version": version}
    raws = []
    for requested in wanted:
        values = results[requested.name]
        output = {"name": requested.name, "datatype": "FP32", "shape": list(values.shape)}
        if requested.binary:
            raws.append(np.ascontiguousarray(values, dtype="<f4").tobytes())
            output["parameters"] = {"binary_data_size": len(raws[-1])}
        else:
            output["data"] = np.ascontiguousarray(values, dtype=np.float32).ravel()
        response["outputs"].append(output)
    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if raws:
        headers[HEADER_LENGTH] = str(len(header))
        return header + b"".join(raws), headers
    return header, headers


def error_body(message: str) -> bytes:
    """``{"error": message}``, the message cut at MAX_ERROR_CHARS characters (a backstop:
    values a message names are clipped by :func:`shown` already)."""
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 3] + "..."
    return orjson.dumps({"error": message})


def shown(value: object, limit: int = MAX_QUOTED) -> str:
    """``value`` (anything a client sent) as an error line may echo it: its repr cut at
    ``limit`` characters, with the length of a long string or list. A long value is cut
    before it is formatted, so a million-entry shape costs no million-entry repr."""
    if isinstance(value, (str, bytes, list, tuple)) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes" if isinstance(value, bytes) else "entries"
        return f"{quote(value[:limit], limit)} ({len(value):,} {unit})"
    return quote(value, limit)


# --- helpers ------------------------------------------------------------------------------

def _tensor(tensor: dict, binary: bytes, limits: Limits) -> np.ndarray:
    """The history tensor; its shape is checked against the limits before any data is read
    (a shape of 2**62 x 0 x 2**62 holds no values, but numpy cannot make it)."""
    shape, datatype = tensor.get("shape"), tensor.get("datatype")
    # the length first: nothing of a longer list is looked at (it is only named, clipped)
    if not isinstance(shape, list) or len(shape) != 3 or not all(type(d) is int and d >= 0 for d in shape):
        raise RequestError(f"{INPUT_NAME}: shape must be [batch, time, n_features], got {shown(shape)}")
    _check_shape(shape, limits)
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise RequestError(f"{INPUT_NAME}: datatype {shown(datatype)} is not supported; send FP32")
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    count = shape[0] * shape[1] * shape[2]
    parameters = tensor.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise RequestError(f"{INPUT_NAME}: 'parameters' must be an object")
    size = parameters.get("binary_data_size")
    if size is not None:
        if type(size) is not int or size != len(binary) or size != count * dtype.itemsize:
            raise RequestError(f"{INPUT_NAME}: binary_data_size {shown(size)} does not match shape {shape} of "
                               f"{datatype} ({count * dtype.itemsize} bytes) and the {len(binary)} bytes sent")
        return np.frombuffer(binary, dtype=dtype).reshape(shape).astype(np.float32)
    if binary:
        raise RequestError("binary data sent but the input has no binary_data_size parameter")
    values = _json_numbers(tensor.get("data"), datatype)
    if values.size != count:
        raise RequestError(f"{INPUT_NAME}: 'data' holds {values.size} values, shape {shape} needs {count}")
    with np.errstate(over="ignore"):
        return values.reshape(shape).astype(np.float32)


# The JSON type of each element of ``data`` for the datatypes served (V2: FP16/FP32/FP64 are
# JSON numbers). bool is its own type here: ``true`` is not a number, though numpy takes it as 1.
JSON_NUMBERS = frozenset({int, float})


def _json_numbers(data: object, datatype: str) -> np.ndarray:
    """The flat float64 values of ``data``: a list of JSON numbers, row-major (or nested lists
    of them, as Triton also takes), nothing else: no strings, booleans or nulls."""
    if not isinstance(data, list):
        raise RequestError(f"{INPUT_NAME}: 'data' must be a list of numbers ({datatype})")
    for _ in range(3):  # [batch, time, n_features] nests 3 levels at most
        if not data or type(data[0]) is not list:
            break
        if any(type(row) is not list for row in data):
            raise RequestError(f"{INPUT_NAME}: 'data' mixes lists and values; send a flat list of numbers")
        data = [value for row in data for value in row]
    kinds = set(map(type, data))  # one C-level pass: ~45 ns a value (5 M values: 0.23 s, as np.asarray)
    if not kinds <= JSON_NUMBERS:
        at, wrong = next((i, v) for i, v in enumerate(data) if type(v) not in JSON_NUMBERS)
        raise RequestError(f"{INPUT_NAME}: 'data' holds {_json_kind(wrong)} at index {at}; {datatype} data must be "
                           "JSON numbers")
    try:
        return np.asarray(data, dtype=np.float64)
    except OverflowError:  # an integer beyond float64 (the stdlib fallback parses any length)
        raise RequestError(f"{INPUT_NAME}: 'data' holds a number beyond float64") from None


def _json_kind(value: object) -> str:
    """What a JSON value that is not a number is, in words, for an error line."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string {shown(value, 24)}"
    return {type(None): "null", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _check_shape(shape: list[int], limits: Limits) -> None:
    batch, steps, features = shape
    if features != limits.n_features:
        raise RequestError(f"{INPUT_NAME}: {features} feature(s) per step; this model takes {limits.n_features} "
                           "(target first, then the features in the model's order)")
    if not limits.min_history <= steps <= limits.max_history:
        want = str(limits.min_history) if limits.min_history == limits.max_history \
            else f"{limits.min_history} to {limits.max_history}" if limits.min_history < limits.max_history \
            else f"at least {limits.min_history}, above the server's --max-history of {limits.max_history}"
        raise RequestError(f"{INPUT_NAME}: history of {steps} step(s); this model takes {want}")
    if batch < 1:
        raise RequestError(f"{INPUT_NAME}: batch is 0; send at least one history")
    if batch > limits.max_batch:
        raise RequestError(f"{INPUT_NAME}: batch of {batch} histories; at most {limits.max_batch} a request", 413)


def _check_finite(history: np.ndarray) -> None:
    if not np.isfinite(history).all():
        b, t, f = (int(i) for i in np.argwhere(~np.isfinite(history))[0])
        raise RequestError(f"{INPUT_NAME}: value at [{b}, {t}, {f}] is not finite (NaN, infinity, or beyond float32)")


def _requested_outputs(request: dict, names: tuple[str, ...]) -> tuple[RequestedOutput, ...]:
    """The outputs a request asks for (all of the model's, in its order, when it names none
    or lists none), each binary as its ``binary_data`` parameter says, else as the request's
    ``binary_data_output`` does."""
    parameters = request.get("parameters") if isinstance(request.get("parameters"), dict) else {}
    default = parameters.get("binary_data_output") is True
    outputs = request.get("outputs")
    if outputs is None or outputs == []:
        return tuple(RequestedOutput(name, default) for name in names)
    if not isinstance(outputs, list):
        raise RequestError("'outputs' must be a list")
    wanted: list[RequestedOutput] = []
    for output in outputs:
        name = output.get("name") if isinstance(output, dict) else output
        if not isinstance(output, dict) or name not in names:
            gives = " and ".join(repr(n) for n in names)
            raise RequestError(f"unknown output {shown(name)}: this model gives {gives}")
        if any(w.name == name for w in wanted):
            raise RequestError(f"output {name!r} is named twice in 'outputs'")
        out_parameters = output.get("parameters")
        binary = out_parameters["binary_data"] is True \
            if isinstance(out_parameters, dict) and "binary_data" in out_parameters else default
        wanted.append(RequestedOutput(name, binary))
    return tuple(wanted)
