"""Paired tests and bootstrap intervals over origins and across series
(onnxcast.pipeline.significance): what makes a difference more than noise."""

from __future__ import annotations

import numpy as np

from onnxcast.pipeline.significance import (
    MIN_PAIRED_ORIGINS,
    MIN_PAIRED_SERIES,
    block_bootstrap_interval,
    bootstrap_interval,
    paired_across_series,
    paired_test,
)


def test_an_interval_covers_the_mean_and_narrows_with_more_origins():
    rng = np.random.default_rng(1)
    few, many = rng.normal(10, 2, 30), rng.normal(10, 2, 600)
    low, high = block_bootstrap_interval(few, block=3)
    assert low < few.mean() < high
    low2, high2 = block_bootstrap_interval(many, block=3)
    assert (high2 - low2) < (high - low)


def test_paired_test_separates_a_real_difference_from_noise():
    rng = np.random.default_rng(2)
    shared = 50 + 20 * np.sin(np.arange(120) / 4.0)  # hard and easy stretches both models share
    a = shared + rng.normal(0, 1, 120)
    better = paired_test(a - 2.0, a, block=5)
    assert better["significant"] and better["mean_diff"] < 0 and better["p_value"] < 0.01
    noise = paired_test(shared + rng.normal(0, 5, 120), shared + rng.normal(0, 5, 120), block=5)
    assert not noise["significant"] and noise["p_value"] > 0.05
    same = paired_test(a, a, block=5)
    assert same["p_value"] == 1.0 and not same["significant"]
    short = paired_test(a[:MIN_PAIRED_ORIGINS - 1] - 5, a[:MIN_PAIRED_ORIGINS - 1], block=1)
    assert not short["significant"] and "fewer than" in short["note"]



def test_a_bootstrap_interval_over_series_covers_the_mean_of_the_population():
    rng = np.random.default_rng(0)
    covered = 0
    for trial in range(40):
        sample = rng.lognormal(0.0, 0.5, 300)  # heavy-ish tail, like MASE; mean exp(0.125)
        low, high = bootstrap_interval(sample, seed=trial)
        covered += low <= np.exp(0.125) <= high
        assert low < sample.mean() < high
    assert covered >= 34  # ~95% of 40; a broken bootstrap covers far less or always


def test_across_series_identical_arrays_are_not_significant():
    a = np.random.default_rng(1).lognormal(0, 0.5, 200)
    result = paired_across_series(a, a.copy())
    assert not result["significant"] and result["series"] == 200 and result["p_value"] == 1.0
    few = paired_across_series(a[:5], a[:5] * 0.5)
    assert not few["significant"] and "5 paired series" in few["note"]




def test_across_series_non_finite_pairs_are_left_out_and_not_counted():
    """A series a forecaster did not run on (NaN) or blew up on (inf) is not evidence: the test
    runs on the finite pairs, and the minimum counts only those."""
    rng = np.random.default_rng(3)
    champion = rng.lognormal(0, 0.3, 60)
    challenger = champion * 0.8
    challenger[:2] = np.inf
    champion[2] = np.nan
    test = paired_across_series(challenger, champion)
    assert test["series"] == 57 and test["min_series"] == MIN_PAIRED_SERIES
    assert np.isfinite(test["p_value"]) and test["significant"] and np.isfinite(test["robust_p"])
    assert test["test"] == "Diebold-Mariano across series (block 1, HLN)"
    few = paired_across_series(challenger[: MIN_PAIRED_SERIES + 1], champion[: MIN_PAIRED_SERIES + 1])
    assert few["series"] == MIN_PAIRED_SERIES - 2 and few["p_value"] is None and not few["significant"]
    assert few["robust_p"] is None and f"{MIN_PAIRED_SERIES - 2} paired series" in few["note"]
