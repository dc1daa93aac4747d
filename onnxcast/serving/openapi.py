"""The OpenAPI description of the V2 endpoints (route keyword arguments for FastAPI).

The inference body is decoded by hand for speed, so its schema is written here, once, as
the Open Inference Protocol (KServe V2) REST specification gives it, narrowed to the
onnxcast model contract (one FP32 input ``history``; the outputs ``forecast`` and, for a model
that has it, ``quantiles``).
"""

from __future__ import annotations

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}},
          "additionalProperties": False}


def _error(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ERROR}}}


_TENSOR_PARAMETERS = {"type": "object", "additionalProperties": True,
                      "properties": {"binary_data_size": {"type": "integer", "minimum": 0}}}
_INPUT = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
    "name": {"type": "string", "enum": ["history"]},
    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 3, "maxItems": 3,
              "description": "[batch, time, n_features]"},
    "datatype": {"type": "string", "enum": ["FP32", "FP64", "FP16"]},
    "parameters": _TENSOR_PARAMETERS,
    "data": {"type": "array", "items": {"type": "number"},
             "description": "row-major values (flat; omit when sent as binary data)"}}}
_REQUESTED_OUTPUT = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "enum": ["forecast", "quantiles"],
             "description": "forecast [batch, horizon]; quantiles [batch, horizon, Q] (levels in the model "
                            "metadata's parameters.quantile_levels), for a model that has it"},
    "parameters": {"type": "object", "properties": {"binary_data": {"type": "boolean"}}}}}
INFER_REQUEST = {"type": "object", "required": ["inputs"], "properties": {
    "id": {"type": "string", "maxLength": 256},
    "parameters": {"type": "object", "properties": {"binary_data_output": {"type": "boolean"}}},
    "inputs": {"type": "array", "items": _INPUT, "minItems": 1, "maxItems": 1},
    "outputs": {"type": "array", "items": _REQUESTED_OUTPUT,
                "description": "the outputs to answer with, in this order; none named: every output of the model, "
                               "forecast first"}}}
INFER_RESPONSE = {"type": "object", "required": ["model_name", "model_version", "outputs"], "properties": {
    "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
    "outputs": {"type": "array", "items": {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
        "name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer"}},
        "datatype": {"type": "string"}, "parameters": {"type": "object"},
        "data": {"type": "array", "items": {"type": "number"}}}}}}}
_TENSOR_METADATA = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
    "name": {"type": "string"}, "datatype": {"type": "string"},
    "shape": {"type": "array", "items": {"type": "integer"}}}}
_MODEL_METADATA = {"type": "object", "required": ["name", "platform", "inputs", "outputs"], "properties": {
    "name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
    "platform": {"type": "string"}, "inputs": {"type": "array", "items": _TENSOR_METADATA},
    "outputs": {"type": "array", "items": _TENSOR_METADATA}, "parameters": {"type": "object"}}}
_VERSION_HEADER = {"x-model-version": {"description": "the model version that answered",
                                       "schema": {"type": "string"}}}


# Answered by every endpoint but the liveness probe when the server has a bearer token, and
# by any endpoint on a bug: both are V2 errors.
_GUARDED = {401: _error("no or wrong 'Authorization: Bearer <token>' (the server was given a token)"),
            500: _error("internal error; the server log has the details")}


def _json(description: str, schema: dict, headers: dict | None = None) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}},
            **({"headers": headers} if headers else {})}


def health(kind: str) -> dict:
    ok = {"type": "object", "required": [kind], "properties": {kind: {"type": "boolean"}}}
    responses = {200: _json(f"server is {kind}", ok)}
    if kind == "ready":
        responses.update({503: _json("no verified model loaded yet", ok), **_GUARDED})
    return {"summary": f"Server {kind}ness (V2)", "responses": responses, "tags": ["health"]}


SERVER_METADATA = {"summary": "Server metadata (V2)", "tags": ["metadata"], "responses": {200: _json(
    "name, version and protocol extensions", {"type": "object", "required": ["name", "version", "extensions"],
                                               "properties": {"name": {"type": "string"},
                                                              "version": {"type": "string"},
                                                              "extensions": {"type": "array",
                                                                             "items": {"type": "string"}}}}),
    **_GUARDED}}
MODEL_METADATA = {"summary": "Model metadata (V2)", "tags": ["metadata"], "responses": {
    200: _json("the served version's tensors and limits", _MODEL_METADATA, _VERSION_HEADER),
    404: _error("unknown model, or a version that is not the one served"),
    503: _error("no verified model loaded yet"), **_GUARDED}}
MODEL_READY = {"summary": "Model readiness (V2)", "tags": ["health"], "responses": {
    200: _json("model ready", {"type": "object", "required": ["name", "ready"],
                               "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}},
               _VERSION_HEADER),
    404: _error("unknown model, or a version that is not the one served"),
    503: _error("no verified model loaded yet"), **_GUARDED}}
INFER = {"summary": "Inference (V2)", "tags": ["inference"],
         "openapi_extra": {"requestBody": {"required": True, "content": {
             "application/json": {"schema": INFER_REQUEST},
             "application/octet-stream": {"schema": {"type": "string", "format": "binary"},
                                          "description": "binary tensor extension: JSON header of "
                                                         "Inference-Header-Content-Length bytes, then tensors"}}}},
         "responses": {
             200: {"description": "forecast [batch, horizon] and, for a model with quantiles, quantiles "
                                  "[batch, horizon, Q], from the version named in model_version",
                   "headers": _VERSION_HEADER, "content": {
                       "application/json": {"schema": INFER_RESPONSE},
                       "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
             400: _error("the request does not fit the model: shape, datatype, non-finite values, history length, "
                         "an output it does not have"),
             404: _error("unknown model, or a version that is not the one served"),
             408: _error("the request was not received within the server's read timeout"),
             413: _error("too many histories in one request, or body too large"),
             503: _error("no verified model loaded yet"), **_GUARDED}}
METRICS = {"summary": "Prometheus metrics", "tags": ["operations"], "responses": {
    200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
    **_GUARDED}}
