"""``python -m onnxcast.pipeline.pretrained build --out onnxcast/pretrained_data/base.pt``: rebuild
the base forecaster's weights from the seeded corpus on 2 CPU cores, and write their provenance
(``base.json`` next to them). docs/pretrained.md."""

from __future__ import annotations

import argparse
import logging
import platform
import sys
from pathlib import Path

from onnxcast import __version__
from onnxcast.base.files import write_text_atomic
from onnxcast.pipeline.pretrained.corpus import GROUP_WEIGHTS, SYNTH_LENGTH, build_corpus
from onnxcast.pipeline.pretrained.weights import HELD_OUT, provenance_path, sha256

# the shipped weights' settings (docs/pretrained.md: about 20 minutes on 2 cores)
SEED = 20261205
STEPS = 9000
BATCH = 256
LEARNING_RATE = 1e-3
N_SYNTH = 6000


def build(out: Path, *, seed: int, steps: int, batch_size: int, learning_rate: float, n_synth: int,
          threads: int, command: str) -> dict:
    """Build the corpus, pretrain, write ``out`` and its provenance; returns the provenance."""
    import json
    import time

    import torch

    from onnxcast.pipeline.pretrained.train import LOOKBACK_P, LOOKBACKS, pretrain

    started = time.monotonic()
    torch.set_num_threads(threads)
    corpus = build_corpus(seed, n_kernelsynth=n_synth, n_generator=n_synth)
    corpus_seconds = round(time.monotonic() - started, 1)
    logging.getLogger(__name__).info("corpus: %s", corpus.describe())
    net, result = pretrain(corpus, steps=steps, batch_size=batch_size, learning_rate=learning_rate, seed=seed,
                           threads=threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".pt.partial")
    torch.save(net.state_dict(), partial)
    partial.replace(out)
    provenance = {
        "model": "BaseNet (onnxcast.pipeline.models): residual MLP over the normalised window",
        "held_out": HELD_OUT,
        "corpus": {"groups": corpus.describe(), "group_weights": GROUP_WEIGHTS, "synthetic_length": SYNTH_LENGTH,
                   "lookbacks": dict(zip(map(str, LOOKBACKS), LOOKBACK_P, strict=True)),
                   "real": "M3 (all 3,003 series) and the statsmodels series; no other real data"},
        "seed": seed, "steps": steps, "batch_size": batch_size, "learning_rate": learning_rate, "threads": threads,
        "command": command, "sha256": sha256(out), "onnxcast_version": __version__,
        "torch_version": torch.__version__, "python": platform.python_version(), "corpus_seconds": corpus_seconds,
        **result,
    }
    write_text_atomic(provenance_path(out), json.dumps(provenance, indent=2, sort_keys=True) + "\n")
    return provenance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onnxcast.pipeline.pretrained", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="rebuild the base model's weights and provenance")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--seed", type=int, default=SEED)
    b.add_argument("--steps", type=int, default=STEPS)
    b.add_argument("--batch-size", type=int, default=BATCH)
    b.add_argument("--learning-rate", type=float, default=LEARNING_RATE)
    b.add_argument("--synthetic-series", type=int, default=N_SYNTH, help="series of each synthetic group")
    # 1: two OpenMP threads made a step 12x slower while other work shared the 2 cores (docs/pretrained.md)
    b.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    command = "python -m onnxcast.pipeline.pretrained " + " ".join(argv if argv is not None else sys.argv[1:])
    provenance = build(args.out, seed=args.seed, steps=args.steps, batch_size=args.batch_size,
                       learning_rate=args.learning_rate, n_synth=args.synthetic_series, threads=args.threads,
                       command=command)
    print(f"wrote {args.out} ({provenance['sha256'][:12]}, {provenance['training_seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
