"""The ``onnxcast`` command line.

Exit codes: 0 success, 2 bad settings or data (one ``error:`` line on stderr, no traceback),
3 a validation gate failed, 1 any other onnxcast error.
"""

from __future__ import annotations

import argparse
import logging
import sys

from onnxcast.config import QualitySettings
from onnxcast.errors import ConfigError, DataError, DataQualityError, GateError, OnnxcastError

log = logging.getLogger("onnxcast")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        return int(args.handler(args) or 0)
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
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("pipeline", help="check data, train, export, optimize and validate",
                            description="Run the whole pipeline and write DIR/report.json and the ONNX files.")
    p.add_argument("--data", required=True, help="CSV or Parquet file: local path or s3:// URI ('example' for the built-in data)")
    p.add_argument("--time-column", default="ds")
    p.add_argument("--target-column", default="y")
    p.add_argument("--feature-columns", default="", help="comma-separated extra numeric columns")
    p.add_argument("--freq", default=None, help="pandas frequency alias (h, 30min, D, W-SUN, MS); inferred if omitted")
    p.add_argument("--horizon", type=int, default=24)
    p.add_argument("--lookback", type=int, default=168)
    p.add_argument("--season", type=int, default=None, help="seasonal-naive period; derived from the frequency if omitted")
    p.add_argument("--models", default="lstm,transformer", help="comma-separated: lstm, transformer")
    p.add_argument("--out", required=True, help="output folder for report.json and the ONNX files")
    p.add_argument("--max-epochs", type=int, default=30)
    p.add_argument("--max-minutes", type=float, default=10.0)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1, help="threads per step (training, validation, latency figures); 1 keeps parallel workers from thrashing")
    p.add_argument("--opset", type=int, default=None, help="convert the export to this ONNX opset")
    p.add_argument("--trained-until", default=None, help="ignore rows after this timestamp")
    p.add_argument("--accuracy-budget", type=float, default=0.01)
    p.add_argument("--fill-gaps", type=int, default=0, metavar="STEPS", help="repair: interpolate gaps up to STEPS long")
    p.add_argument("--drop-duplicates", action="store_true", help="repair: keep the last row of duplicate timestamps")
    p.add_argument("--max-missing-fraction", type=float, default=QualitySettings.max_missing_fraction,
                   help="data check: largest share of missing target values (default %(default)s)")
    p.set_defaults(handler=run_pipeline_command)

    try:
        from onnxcast.rollout_cli import add_rollout_commands
    except ImportError:  # rollout commands arrive with onnxcast.rollout_cli
        pass
    else:
        add_rollout_commands(commands)
    from onnxcast.serving.cli import add_serve_command

    add_serve_command(commands)
    return parser


def run_pipeline_command(args: argparse.Namespace) -> int:
    from onnxcast.config import PipelineConfig
    from onnxcast.pipeline import run_pipeline

    data = args.data
    if data == "example":
        from onnxcast.data import example_data_path

        data = example_data_path()
    cfg = PipelineConfig.from_dict({
        "data_uri": data, "out_dir": args.out, "time_column": args.time_column,
        "target_column": args.target_column, "feature_columns": args.feature_columns,
        "freq": args.freq, "horizon": args.horizon, "lookback": args.lookback, "season": args.season,
        "models": args.models, "max_epochs": args.max_epochs, "max_minutes": args.max_minutes,
        "hidden_size": args.hidden_size, "num_layers": args.num_layers, "seed": args.seed,
        "threads": args.threads, "opset": args.opset, "trained_until": args.trained_until,
        "accuracy_budget": args.accuracy_budget,
        "quality": QualitySettings(fill_gaps_max_steps=args.fill_gaps, drop_duplicate_timestamps=args.drop_duplicates,
                                   max_missing_fraction=args.max_missing_fraction),
    })
    report = run_pipeline(cfg)
    print(summarize_report(report, args.out))
    return 0


def summarize_report(report: dict, out: str) -> str:
    """A short human summary of report.json for the terminal."""
    base = report["baselines"]["seasonal_naive"]
    lines = [f"report: {out}/report.json",
             f"seasonal naive (season {base['season']}): MAE {base['mae']:.4g}  sMAPE {base['smape']:.2f}%  MASE {base['mase']:.3f}"]
    for m in report["models"]:
        t = m["torch"]
        lines.append(f"{m['family']}: torch MAE {t['holdout']['mae']:.4g}, batch1 p50 {t['latency_ms']['batch1_p50']:.2f} ms")
        for v in m["variants"]:
            h = v["holdout"] or {}
            speed = v.get("speedup_vs_torch", {})
            lines.append(f"  {v['name']:<8} MAE {h.get('mae', float('nan')):.4g}  size {v['size_bytes'] / 1024:.0f} KiB  "
                         f"b1 x{speed.get('batch1_p50', float('nan')):.2f}  b64 x{speed.get('batch64_p50', float('nan')):.2f}  "
                         f"{'eligible' if v['eligible'] else 'not eligible: ' + '; '.join(v['reasons'])}")
    for channel, choice in report["selected"].items():
        lines.append(f"selected for {channel}: {choice['family']} {choice['variant']}")
    return "\n".join(lines)


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
