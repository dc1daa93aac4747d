"""Holdout MAE of each family trained the pipeline's way, for judging a training change.

The accuracy half of bench/training.py's question "faster, and accuracy-neutral?". Per dataset
of bench/accuracy.py: the pipeline's data step once (``prepare_data``: checks, split,
baselines), then per family and seed the pipeline's own training step (``train_family``, the
CLI's default budget unless ``--settings`` says otherwise) and the fp32 model's holdout MAE on
the run's holdout origins (``holdout_windows`` + ``judge_holdout``: the figure report.json calls
``fp32_holdout_mae``, up to ONNX parity). Export, optimisation and latency are skipped: they do
not change what training learned.

It uses only functions that exist before and after the training-throughput change, so the same
script judges both trees::

    PYTHONPATH=/path/to/before .venv/bin/python bench/training_accuracy.py --out before.json
    .venv/bin/python bench/training_accuracy.py --out after.json
    .venv/bin/python bench/training_accuracy.py --settings '{"float32_training": true}' --out f32.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATASETS = ("victoria-electricity", "mauna-loa-co2")
DEFAULT_FAMILIES = ("lstm", "transformer", "nhits", "dlinear")
DEFAULT_SEEDS = (42, 7, 3)

log = logging.getLogger("bench.training_accuracy")


def holdout_mae(datasets, families, seeds, settings: dict, work: Path) -> list[dict]:
    """One row per dataset, family and seed: holdout MAE, epochs, best epoch, training seconds."""
    from onnxcast.base.files import read_json
    from onnxcast.pipeline.checkpoint import load_model
    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.fleet_data import load_split
    from onnxcast.pipeline.run import prepare_data, train_family
    from onnxcast.pipeline.training import predict
    from onnxcast.pipeline.validate import holdout_windows, judge_holdout

    rows = []
    for dataset in datasets:
        data = work / f"{dataset.name}.csv"
        dataset.make().to_csv(data, index=False)
        base = {"data_uri": str(data), "out_dir": str(work / dataset.name), **dataset.settings,
                "models": ",".join(families), **settings}
        cfg = PipelineConfig.from_dict(base)
        prepare_data(cfg)
        series, split = load_split(cfg.layout.fleet, cfg)
        holdout = holdout_windows(cfg, series, split, read_json(cfg.layout.baselines)["mase_scale"])
        for family in families:
            for seed in seeds:
                seeded = PipelineConfig.from_dict({**base, "seed": seed})
                started = time.monotonic()
                train_family(seeded, family)
                seconds = time.monotonic() - started
                model, _ = load_model(seeded, family)
                metrics, _ = judge_holdout(predict(model, holdout.history), holdout)
                training = read_json(seeded.layout.model_json(family))["training"]
                row = {"dataset": dataset.name, "family": family, "seed": seed, "holdout_mae": metrics["mae"],
                       "epochs": training["epochs"], "best_epoch": training["best_epoch"],
                       "best_validation_loss": training["best_validation_loss"],
                       "precision": training.get("precision", "float32"), "train_s": round(seconds, 1)}
                log.info("%s", row)
                rows.append(row)
    return rows


def _datasets(names: list[str]):
    spec = importlib.util.spec_from_file_location("onnxcast_bench_accuracy", REPO / "bench" / "accuracy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    known = {d.name: d for d in module.DATASETS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown dataset(s) {unknown}; expected some of {sorted(known)}")
    return [known[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(DEFAULT_DATASETS), help="bench/accuracy.py dataset names")
    parser.add_argument("--families", default=",".join(DEFAULT_FAMILIES), help="comma-separated families")
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="comma-separated seeds")
    parser.add_argument("--settings", default="{}", help="extra pipeline settings as JSON")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the rows")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("onnxcast", "statsforecast"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import onnxcast

    load = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="onnxcast-training-accuracy-") as work:
        rows = holdout_mae(_datasets(args.datasets.split(",")), args.families.split(","),
                           [int(s) for s in args.seeds.split(",")], json.loads(args.settings), Path(work))
    result = {"onnxcast_path": str(Path(onnxcast.__file__).parent), "settings": json.loads(args.settings),
              "load_average_before": load, "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "command": "bench/training_accuracy.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "rows": rows}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
