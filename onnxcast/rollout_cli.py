"""CLI commands for rollout: ``promote``, ``rollback``, ``edge pull`` and ``edge predict``.

``add_rollout_commands(subparsers)`` registers them; each sets ``handler`` (what ``onnxcast.cli.main`` calls) to a function that
takes the parsed namespace and returns an exit code. User errors are raised as
OnnxcastError for the main CLI to print on one line. S3 endpoint, region, credentials and
encryption come from the environment (``AWS_*``, ``ONNXCAST_STORE_SSE``,
``ONNXCAST_STORE_SSE_KMS_KEY_ID``), never from flags that would land in shell history.
"""

from __future__ import annotations

import argparse
import sys

from onnxcast.errors import ConfigError


def add_rollout_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register the rollout subcommands on ``subparsers`` (from ``add_subparsers()``)."""
    p = subparsers.add_parser("promote", help="publish a validated run to the rollout store and move channels")
    p.add_argument("--report", required=True, help="report.json of a pipeline run (or its folder)")
    _store_arguments(p)
    p.add_argument("--channel", required=True, action="append",
                   help="channel to move (repeat or comma-separate: edge,cloud)")
    p.add_argument("--version", help="version id (default: the MLflow version, else derived from the content)")
    p.add_argument("--actor", help="who promotes (default: $ONNXCAST_ACTOR or user@host)")
    p.add_argument("--reason", default="", help="why, recorded in the channel history")
    p.set_defaults(handler=run_promote)

    p = subparsers.add_parser("rollback", help="move a channel back to an earlier version")
    _store_arguments(p)
    p.add_argument("--channel", required=True, help="channel to move back (edge or cloud)")
    p.add_argument("--to", dest="to_version", help="version to move to (default: the one before the current)")
    p.add_argument("--reason", required=True, help="why, recorded in the channel history")
    p.add_argument("--actor", help="who rolls back (default: $ONNXCAST_ACTOR or user@host)")
    p.set_defaults(handler=run_rollback)

    edge = subparsers.add_parser("edge", help="device side: pull a channel's model, run it")
    commands = edge.add_subparsers(dest="edge_command", required=True)
    p = commands.add_parser("pull", help="download, verify and install the channel's model")
    _store_arguments(p)
    p.add_argument("--channel", required=True, help="channel to follow (edge or cloud)")
    p.add_argument("--dest", required=True, help="device folder (DEST/current is the served model)")
    p.add_argument("--watch", action="store_true", help="keep polling the channel")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between polls (default 60)")
    p.add_argument("--max-polls", type=int, help="stop after this many polls (default: never)")
    p.set_defaults(handler=run_edge_pull)

    p = commands.add_parser("predict", help="forecast from a CSV with the installed model")
    p.add_argument("--dir", required=True, help="device folder given to 'edge pull --dest'")
    p.add_argument("--input", required=True, help="CSV with the target and feature columns")
    p.set_defaults(handler=run_edge_predict)


def run_promote(args: argparse.Namespace) -> int:
    from onnxcast.promote import promote

    result = promote(args.report, args.store, args.model, args.channel, version=args.version,
                     actor=args.actor, reason=args.reason)
    moves = ", ".join(f"{c} {state}" for c, state in result.channels.items())
    print(f"{result.model} version {result.version} at {result.store}: {len(result.written)} object(s) "
          f"written, {len(result.skipped)} already there; {moves}")
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    from onnxcast.promote import rollback

    result = rollback(args.store, args.model, args.channel, to_version=args.to_version, actor=args.actor,
                      reason=args.reason)
    if result.changed:
        print(f"{result.model} channel {result.channel}: rolled back from {result.from_version} to {result.version}")
    else:
        print(f"{result.model} channel {result.channel}: already at {result.version}")
    return 0


def run_edge_pull(args: argparse.Namespace) -> int:
    from onnxcast.edge import pull, watch

    if args.watch:
        if args.max_polls is not None and args.max_polls < 1:
            raise ConfigError(f"--max-polls must be >= 1, got {args.max_polls}")
        try:
            failures = watch(args.store, args.model, args.channel, args.dest, interval=args.interval,
                             max_polls=args.max_polls, on_poll=lambda line: print(line, flush=True))
        except KeyboardInterrupt:  # the usual way to stop an unbounded watch
            return 130
        return 1 if failures else 0
    result = pull(args.store, args.model, args.channel, args.dest)
    state = "installed" if result.changed else "already at"
    print(f"{result.model} channel {result.channel}: {state} version {result.version} ({result.path})")
    return 0


def run_edge_predict(args: argparse.Namespace) -> int:
    from onnxcast.edge import predict

    predict(args.dir, args.input, out=sys.stdout)
    return 0


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, help="rollout store: a folder or s3://bucket/prefix")
    parser.add_argument("--model", required=True, help="model name in the store")
