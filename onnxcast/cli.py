"""The onnxcast command line.

Exit codes: 0 success, 2 bad settings or data (one ``error:`` line on stderr, no traceback),
3 a validation gate failed, 1 any other onnxcast error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from onnxcast import __version__
from onnxcast.base.errors import ConfigError, DataError, DataQualityError, GateError, OnnxcastError
from onnxcast.pipeline.config import MODEL_FAMILIES, PipelineConfig, QualitySettings
from onnxcast.rollout.cli import add_edge_commands, add_keys_commands, store_arguments

log = logging.getLogger("onnxcast")


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:  # the reader went away (`onnxcast edge predict ... | head`): not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return 0


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # --help, --version, usage errors: flush here, where a closed pipe is caught
        sys.stdout.flush()
        raise
    _configure_logging(args.verbose)
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()
        return code
    except (ConfigError, DataError) as exc:
        _print_error(exc)
        return 2
    except GateError as exc:
        _print_error(exc)
        return 3
    except OnnxcastError as exc:
        _print_error(exc)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnxcast", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("pipeline", help="check data, train, export, optimize and validate",
                            description="Run the whole pipeline and write DIR/report.json and the ONNX files.",
                            formatter_class=_DefaultsHelp)
    d = PipelineConfig  # defaults come from the settings class: one source of truth
    data = p.add_argument_group("data")
    data.add_argument("--data", required=True,
                      help="CSV or Parquet file: local path or s3:// URI ('example' for the built-in data)")
    data.add_argument("--time-column", default=d.time_column, help="column of timestamps (ISO 8601)")
    data.add_argument("--target-column", default=d.target_column, help="column to forecast")
    data.add_argument("--feature-columns", default="", help="comma-separated extra numeric input columns")
    data.add_argument("--freq", default=None,
                      help="pandas frequency alias (h, 30min, D, W-SUN, MS); inferred from the timestamps if omitted")
    data.add_argument("--trained-until", default=None, help="ignore rows after this ISO timestamp")
    data.add_argument("--fill-gaps", type=int, default=0, metavar="STEPS",
                      help="repair: interpolate gaps up to STEPS long (0: refuse any gap)")
    data.add_argument("--drop-duplicates", action="store_true",
                      help="repair: keep the last row of duplicate timestamps")
    data.add_argument("--max-missing-fraction", type=float, default=QualitySettings.max_missing_fraction,
                      help="data check: largest share of missing target values")
    task = p.add_argument_group("forecast")
    task.add_argument("--horizon", type=int, default=d.horizon, help="steps to forecast")
    task.add_argument("--lookback", type=int, default=d.lookback, help="history steps the models are trained on")
    task.add_argument("--season", type=int, default=None,
                      help="seasonal-naive period in steps; derived from the frequency if omitted")
    model = p.add_argument_group("models and training")
    model.add_argument("--models", default=",".join(d.models),
                       help="comma-separated families: " + ", ".join(MODEL_FAMILIES))
    model.add_argument("--max-epochs", type=int, default=d.max_epochs, help="training epochs at most")
    model.add_argument("--max-minutes", type=float, default=d.max_minutes, help="training minutes per family at most")
    model.add_argument("--patience", type=int, default=d.patience,
                       help="stop after this many epochs without a better validation loss")
    model.add_argument("--batch-size", type=int, default=d.batch_size, help="training windows per step")
    model.add_argument("--learning-rate", type=float, default=d.learning_rate, help="AdamW learning rate")
    model.add_argument("--hidden-size", type=int, default=d.hidden_size, help="LSTM hidden units (N-HiTS: MLP width 8x this)")
    model.add_argument("--num-layers", type=int, default=d.num_layers, help="LSTM and Transformer layers")
    model.add_argument("--d-model", type=int, default=d.d_model, help="Transformer width")
    model.add_argument("--n-heads", type=int, default=d.n_heads,
                       help="Transformer attention heads (must divide --d-model)")
    model.add_argument("--seed", type=int, default=d.seed, help="random seed (training is repeatable)")
    check = p.add_argument_group("export and validation")
    check.add_argument("--opset", type=int, default=None, help="convert the export to this ONNX opset")
    check.add_argument("--accuracy-budget", type=float, default=d.accuracy_budget,
                       help="largest relative holdout-MAE loss of int8/fp16 vs fp32 for a variant to be chosen")
    check.add_argument("--baseline-margin", type=float, default=d.baseline_margin,
                       help="how much lower (relative) a family's fp32 holdout MAE must be than the best "
                            "baseline's for the family to be eligible (0.01: 1%% lower)")
    check.add_argument("--latency-repeats", type=int, default=d.latency_repeats,
                       help="timed runs per batch size for the latency figures")
    check.add_argument("--threads", type=int, default=d.threads,
                       help="threads per step (training, validation, latency figures); 1 keeps parallel "
                            "workers from thrashing")
    p.add_argument("--out", required=True, help="output folder for report.json and the ONNX files")
    p.set_defaults(handler=run_pipeline_command)

    add_release_commands(commands)
    from onnxcast.serving.cli import add_serve_command

    add_serve_command(commands)
    return parser


class _DefaultsHelp(argparse.HelpFormatter):
    """Show an option's default in its help, unless it has none (required, or derived)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or action.default in (None, False, "", argparse.SUPPRESS) or "%(default)" in text:
            return text
        return text + " (default: %(default)s)"


def run_pipeline_command(args: argparse.Namespace) -> int:
    from onnxcast.pipeline.run import run_pipeline

    data = args.data
    if data == "example":
        from onnxcast.pipeline.data import example_data_path

        data = example_data_path()
    cfg = PipelineConfig.from_dict({
        "data_uri": data, "out_dir": args.out, "time_column": args.time_column,
        "target_column": args.target_column, "feature_columns": args.feature_columns,
        "freq": args.freq, "horizon": args.horizon, "lookback": args.lookback, "season": args.season,
        "models": args.models, "max_epochs": args.max_epochs, "max_minutes": args.max_minutes,
        "hidden_size": args.hidden_size, "num_layers": args.num_layers, "seed": args.seed,
        "patience": args.patience, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
        "d_model": args.d_model, "n_heads": args.n_heads, "latency_repeats": args.latency_repeats,
        "threads": args.threads, "opset": args.opset, "trained_until": args.trained_until,
        "accuracy_budget": args.accuracy_budget, "baseline_margin": args.baseline_margin,
        "quality": QualitySettings(fill_gaps_max_steps=args.fill_gaps, drop_duplicate_timestamps=args.drop_duplicates,
                                   max_missing_fraction=args.max_missing_fraction),
    })
    report = run_pipeline(cfg)
    print(summarize_report(report, args.out))
    return 0


def summarize_report(report: dict, out: str) -> str:
    """A short human summary of report.json for the terminal (the CLI and the demo)."""
    baselines = report["baselines"]
    base = baselines["seasonal_naive"]
    origins = baselines.get("origins") or {}
    lines = [f"report: {Path(out) / 'report.json'}"]  # not "out//report.json" for --out out/
    if origins:
        lines.append(f"holdout: {origins['count']} forecast origins, one every {origins['stride']} steps "
                     "(every phase of the season); MAE with its 95% interval")
    for name, row in (baselines.get("candidates") or {"seasonal_naive": base}).items():
        mark = "  <- the baseline to beat" if name == baselines.get("best") else ""
        lines.append(f"  {name:<20} MAE {_mae(row)}  MASE {row['mase']:.3f}{mark}")
    reference = report.get("reference")
    if reference:
        lines.append(f"  reference {reference['model']}: MAE {_mae(reference)}  MASE {reference['mase']:.3f}")
    for m in report["models"]:
        t = m["torch"]
        status = "" if m.get("gates_passed", True) else "  EXCLUDED: " + "; ".join(m.get("failures", []))
        vs = m.get("fp32_vs") or {}
        versus = "".join(f", x{c['mae_ratio']:.2f} of {name} (p={_p(c)})" for name, c in vs.items() if c.get("mae_ratio"))
        lines.append(f"{m['family']}: torch MAE {_mae(t['holdout'])}{versus}, batch1 p50 "
                     f"{t['latency_ms']['batch1_p50']:.2f} ms{status}")
        for v in m["variants"]:
            h = v["holdout"] or {}
            speed = v.get("speedup_vs_torch", {})
            lines.append(f"  {v['name']:<8} MAE {h.get('mae', float('nan')):.4g}  size {v['size_bytes'] / 1024:.0f} KiB  "
                         f"b1 x{speed.get('batch1_p50', float('nan')):.2f}  b64 x{speed.get('batch64_p50', float('nan')):.2f}  "
                         f"{'eligible' if v['eligible'] else 'not eligible: ' + '; '.join(v['reasons'])}")
    choice = report.get("family_choice") or {}
    if len(choice.get("tied_with_best") or []) > 1:
        lines.append(f"families not significantly different from {choice['best']}: "
                     f"{', '.join(choice['tied_with_best'][1:])} (chosen by speed among them)")
    for channel, pick in report["selected"].items():
        lines.append(f"selected for {channel}: {pick['family']} {pick['variant']}")
    return "\n".join(lines)


def _mae(row: dict) -> str:
    interval = row.get("mae_ci95")
    if interval and all(v == v for v in interval):  # not NaN
        return f"{row['mae']:.4g} [{interval[0]:.4g}, {interval[1]:.4g}]"
    return f"{row['mae']:.4g}"


def _p(test: dict) -> str:
    return "n/a" if test.get("p_value") is None else f"{test['p_value']:.2g}"


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("onnxcast").setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("torch.onnx", "onnxscript", "onnx_ir"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _print_error(exc: BaseException) -> None:
    if isinstance(exc, DataQualityError):  # a header, then one line per failed check
        where = f" (report: {exc.report_path})" if exc.report_path else ""
        print(f"error: {exc.source}: {len(exc.failures)} data check(s) failed{where}", file=sys.stderr)
        for failure in exc.failures:
            print(f"  - {' '.join(failure.split())}", file=sys.stderr)
        return
    message = " ".join(str(exc).split())  # one line, whatever the exception held
    print(f"error: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())


# --- release commands: promote, rollback, refresh ------------------------------------------

def add_release_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register the release commands (``promote``, ``rollback``, ``refresh``) and the device's
    (``keys``, ``edge``) on ``subparsers``."""
    p = subparsers.add_parser("promote", help="publish a validated run to the rollout store and move channels")
    p.add_argument("--report", required=True, help="report.json of a pipeline run (or its folder)")
    store_arguments(p)
    p.add_argument("--channel", required=True, action="append",
                   help="channel to move (repeat or comma-separate: edge,cloud)")
    p.add_argument("--version", help="version id (default: the MLflow version, else derived from the content)")
    p.add_argument("--actor", help="who promotes (default: $ONNXCAST_ACTOR or user@host)")
    p.add_argument("--reason", default="", help="why, recorded in the channel history")
    p.add_argument("--overwrite-unverified-pointer", action="store_true",
                   help="move a channel whose current pointer does not verify (planted or damaged) to --version; "
                        "nothing of that pointer is kept")
    _signing_arguments(p)
    p.set_defaults(handler=run_promote)

    p = subparsers.add_parser("rollback", help="move a channel back to an earlier version (a signed rollback record)")
    store_arguments(p)
    p.add_argument("--channel", required=True, help="channel to move back (edge or cloud)")
    p.add_argument("--to", dest="to_version", help="version to move to (default: the one before the current)")
    p.add_argument("--reason", required=True, help="why, recorded in the channel history")
    p.add_argument("--actor", help="who rolls back (default: $ONNXCAST_ACTOR or user@host)")
    _signing_arguments(p)
    p.set_defaults(handler=run_rollback)

    p = subparsers.add_parser("refresh", help="re-sign a channel pointer (new counter and expiry, same version)")
    store_arguments(p)
    p.add_argument("--channel", required=True, help="channel whose pointer to re-sign (edge or cloud)")
    _signing_arguments(p)
    p.set_defaults(handler=run_refresh)

    add_keys_commands(subparsers)
    add_edge_commands(subparsers)


def run_promote(args: argparse.Namespace) -> int:
    from onnxcast.rollout.promote import promote

    result = promote(args.report, args.store, args.model, args.channel, version=args.version,
                     actor=args.actor, reason=args.reason, signers=args.signing_key, expires_days=args.expires_days,
                     overwrite_unverified=args.overwrite_unverified_pointer)
    moves = ", ".join(f"{c} {state}" for c, state in result.channels.items())
    print(f"{result.model} version {result.version} at {result.store}: {len(result.written)} object(s) "
          f"written, {len(result.skipped)} already there; {moves}")
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    from onnxcast.rollout.promote import rollback

    result = rollback(args.store, args.model, args.channel, to_version=args.to_version, actor=args.actor,
                      reason=args.reason, signers=args.signing_key, expires_days=args.expires_days)
    if result.changed:
        print(f"{result.model} channel {result.channel}: rolled back from {result.from_version} to {result.version}")
    else:
        print(f"{result.model} channel {result.channel}: already at {result.version}")
    return 0


def run_refresh(args: argparse.Namespace) -> int:
    from onnxcast.rollout.promote import refresh

    value = refresh(args.store, args.model, args.channel, signers=args.signing_key, expires_days=args.expires_days)
    print(f"{args.model} channel {args.channel}: version {value['version']} re-signed, counter {value['counter']}, "
          f"expires {value['expires']}")
    return 0


def _signing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--signing-key", action="append",
                        help="release key: a private key file or awskms:KEY (repeat for a threshold; "
                             "default $ONNXCAST_SIGNING_KEY)")
    parser.add_argument("--expires-days", type=float,
                        help="days the channel pointer stays valid (default $ONNXCAST_POINTER_EXPIRES_DAYS or 30)")
