"""The ``onnxcast serve`` command: follow a channel and serve it over the Open Inference Protocol.

``add_serve_command(subparsers)`` registers it on the main parser (``onnxcast.cli``); S3
settings come from the environment as for the other rollout commands.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` on ``subparsers`` (from ``add_subparsers()``)."""
    p = subparsers.add_parser("serve", help="serve a channel's model over the Open Inference Protocol (KServe V2)",
                              description="Pull and verify the channel's model as 'edge pull' does, serve it over "
                                          "HTTP (KServe V2), follow the channel and swap versions atomically.")
    p.add_argument("--store", required=True, help="rollout store: a folder or s3://bucket/prefix")
    p.add_argument("--model", required=True, help="model name in the store")
    p.add_argument("--channel", default="cloud", help="channel to follow (default: cloud)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--dest", help="folder for the pulled versions (default: $ONNXCAST_HOME/serve/MODEL-CHANNEL)")
    p.add_argument("--trust", help="trust root file the pulls verify with (default: $ONNXCAST_TRUST, else "
                                   "DEST/trust/root.json)")
    p.add_argument("--poll-interval", type=float, default=10.0, help="seconds between channel polls (default 10)")
    p.add_argument("--max-batch-size", type=int, default=64, help="histories per ONNX Runtime call at most (default 64)")
    p.add_argument("--max-delay-ms", type=float, default=5.0,
                   help="longest wait for more requests to batch, in ms (default 5; a lone client never waits)")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    p.add_argument("--min-history", type=int, help="shortest history accepted (default: the model's lookback)")
    p.add_argument("--max-history", type=int, help="longest history accepted (default: the model's lookback)")
    p.add_argument("--max-request-batch", type=int, default=1024, help="histories per request at most (default 1024)")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds to finish in-flight requests on SIGTERM (default 30)")
    p.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from onnxcast.serving.app import ServeSettings, serve
    from onnxcast.store import check_name

    check_name("model", args.model)
    check_name("channel", args.channel)
    home = Path(os.environ.get("ONNXCAST_HOME") or ".onnxcast")
    dest = Path(args.dest) if args.dest else home / "serve" / f"{args.model}-{args.channel}"
    settings = ServeSettings(store=args.store, model=args.model, channel=args.channel, dest=dest.absolute(),
                             host=args.host, port=args.port, poll_interval=args.poll_interval,
                             max_batch_size=args.max_batch_size, max_delay_ms=args.max_delay_ms,
                             threads=args.threads, min_history=args.min_history, max_history=args.max_history,
                             max_request_batch=args.max_request_batch, graceful_timeout=args.graceful_timeout,
                             trust=Path(args.trust).absolute() if args.trust else None)
    serve(settings)
    return 0
