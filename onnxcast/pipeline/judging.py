"""How a run's results are judged, chosen by what the sample supports, not by a mode: statistics
over the (dependent) holdout origins of one series, or across series. Written in the report
and each family's validation.json as ``judging`` (docs/report.schema.json), which every reader
routes on (:func:`report_judging`). Imports nothing: the command line, the registry and the
monitor read it without numpy.
"""

from __future__ import annotations

OVER_ORIGINS = "over_origins"
ACROSS_SERIES = "across_series"
# Fewest series judged across series; fewer are judged over their origins. Today exactly one
# series (what the single-series runs always were); two or more are judged across series.
ACROSS_SERIES_FROM = 2


def judging_for(n_series: int) -> str:
    """How a run of ``n_series`` is judged: :data:`OVER_ORIGINS` (few series: statistics over
    the dependent holdout origins, a block bootstrap and paired tests over origins) or
    :data:`ACROSS_SERIES` (many: aggregates and paired tests across series). What the sample
    supports decides, not a mode: the split, the training windows, the calibration windows,
    the validation and the report all follow it."""
    return OVER_ORIGINS if int(n_series) < ACROSS_SERIES_FROM else ACROSS_SERIES


def report_judging(report: dict) -> str:
    """How the run of ``report`` (report.json, or one family's validation.json) was judged: its
    ``judging`` field, which every reader routes on (tracking, champion/challenger, the monitor,
    the command line). A report written before the field existed (issue 31) says it by its
    shape only: judged across series when it has the ``fleet`` block, over origins otherwise."""
    written = report.get("judging")
    if written in (OVER_ORIGINS, ACROSS_SERIES):
        return written
    return ACROSS_SERIES if report.get("fleet") else OVER_ORIGINS  # written before the field
