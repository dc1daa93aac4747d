"""The ``onnxcast serve`` command: follow a channel and serve it over the Open Inference Protocol.

``add_serve_command(subparsers)`` registers it on the main parser (``onnxcast.cli``); S3
settings come from the environment as for the other rollout commands.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxcast.base import environment
from onnxcast.base.errors import ConfigError
from onnxcast.base.files import onnxcast_home
from onnxcast.base.untrusted import UntrustedInputError, read_regular_file
from onnxcast.rollout.store import check_name


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` on ``subparsers`` (from ``add_subparsers()``)."""
    p = subparsers.add_parser("serve", help="serve a channel's model over the Open Inference Protocol (KServe V2)",
                              description="Pull and verify the channel's model as 'edge pull' does, serve it over "
                                          "HTTP (KServe V2), follow the channel and swap versions atomically.")
    p.add_argument("--store", required=True, help="rollout store: a folder or s3://bucket/prefix")
    p.add_argument("--model", required=True, help="model name in the store")
    p.add_argument("--channel", default="cloud", help="channel to follow (default: cloud)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other address needs a bearer token)")
    p.add_argument("--token-file", help="file holding the bearer token every endpoint but /v2/health/live then "
                                        "requires (default: $ONNXCAST_SERVE_TOKEN; never on the command line)")
    p.add_argument("--dest", help="folder for the pulled versions (default: $ONNXCAST_HOME/serve/MODEL-CHANNEL)")
    p.add_argument("--trust", help="trust root file the pulls verify with (default: $ONNXCAST_TRUST, else "
                                   "DEST/trust/root.json)")
    p.add_argument("--poll-interval", type=float, default=10.0, help="seconds between channel polls (default 10)")
    p.add_argument("--max-batch-size", type=int, default=64, help="histories per ONNX Runtime call at most (default 64)")
    p.add_argument("--max-delay-ms", type=float, default=5.0,
                   help="longest wait for more requests to batch, in ms (default 5; a lone client never waits)")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    p.add_argument("--min-history", type=int, help="shortest history accepted (default and lowest: the model's "
                                                   "lookback, or its onnxcast.min_history metadata)")
    p.add_argument("--max-history", type=int, help="longest history accepted (default: the model's lookback)")
    p.add_argument("--max-request-batch", type=int, default=1024, help="histories per request at most (default 1024)")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds to finish in-flight requests on SIGTERM (default 30)")
    p.add_argument("--read-timeout", type=float, default=10.0,
                   help="seconds a client has to send a whole request, headers and body (default 10; then 408)")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0,
                   help="idle seconds before a keep-alive connection is closed (default 5)")
    p.add_argument("--max-connections", type=int, default=1024,
                   help="open connections at most; more are answered 503 and closed (default 1024)")
    p.add_argument("--poll-timeout", type=float, default=60.0,
                   help="seconds a channel poll may take before it is logged and counted as stuck (default 60)")
    p.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from onnxcast.serving.app import TOKEN_ENV, ServeSettings, serve

    check_name("model", args.model)
    check_name("channel", args.channel)
    dest = Path(args.dest) if args.dest else onnxcast_home() / "serve" / f"{args.model}-{args.channel}"
    settings = ServeSettings(store=args.store, model=args.model, channel=args.channel, dest=dest.absolute(),
                             host=args.host, port=args.port, poll_interval=args.poll_interval,
                             max_batch_size=args.max_batch_size, max_delay_ms=args.max_delay_ms,
                             threads=args.threads, min_history=args.min_history, max_history=args.max_history,
                             max_request_batch=args.max_request_batch, graceful_timeout=args.graceful_timeout,
                             trust=Path(args.trust).absolute() if args.trust else None,
                             token=_token(args.token_file, environment.get(TOKEN_ENV)),
                             read_timeout=args.read_timeout, keep_alive_timeout=args.keep_alive_timeout,
                             max_connections=args.max_connections, poll_timeout=args.poll_timeout)
    serve(settings)
    return 0


def _token(path: str | None, environment: str | None) -> str | None:
    """The bearer token from ``--token-file`` (first line, surrounding blanks dropped), else the
    environment; None when neither is set. The token is never echoed in an error."""
    if path is None:
        return environment.strip() if environment and environment.strip() else None
    try:
        data = read_regular_file(path, what="--token-file", limit=4096)
    except UntrustedInputError as exc:
        raise ConfigError(str(exc)) from None
    try:
        lines = data.decode("ascii").strip().splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"--token-file {path!r}: the token must be printable ASCII") from None
    if not lines:
        raise ConfigError(f"--token-file {path!r} is empty")
    return lines[0].strip()
