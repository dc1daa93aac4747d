"""The cloud inference service: ``onnxcast serve`` follows a rollout channel (verified pulls
through :mod:`onnxcast.rollout.edge`), swaps versions atomically, batches concurrent requests into one
ONNX Runtime call, and speaks the Open Inference Protocol (KServe V2) over HTTP.

Modules: ``protocol`` (V2 request/response codec and validation), ``model`` (loading a
verified model, following the channel), ``batching`` (adaptive batching), ``connections``
(read timeouts, connection limits), ``openapi``, ``app`` (the HTTP service and its metrics),
``cli`` (the ``serve`` command). The Triton / KServe model repository the promotion publishes
is :mod:`onnxcast.rollout.repository`. See docs/serving.md.
"""
