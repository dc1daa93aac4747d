"""Seasonal periods: what a frequency implies, what a model anchors on, what a holdout is
judged over. pandas reads the frequency (imported inside the functions)."""

from __future__ import annotations


def season_for_freq(freq: str) -> int:
    """A sensible seasonal period for ``freq``: daily cycle below a day, weekly for days,
    yearly for weeks, months and quarters."""
    import pandas as pd

    offset = pd.tseries.frequencies.to_offset(freq)
    if isinstance(offset, pd.offsets.Tick):  # fixed-length steps: hours, minutes, days
        step, day = pd.Timedelta(offset), pd.Timedelta(days=1)
        if step < day and (day % step) == pd.Timedelta(0):
            return int(day / step)
        return 7 if step == day else 1
    name = offset.name.upper()
    if name == "D":  # a calendar day is not a Tick in pandas 3
        return 7 if offset.n == 1 else 1
    if name.startswith("W"):
        return 52
    if name.startswith(("M", "BM", "SM")):
        return 12
    if name.startswith(("Q", "BQ")):
        return 4
    if name.startswith("B"):  # business days
        return 5
    return 1


def seasons_for_freq(freq: str) -> tuple[int, ...]:
    """Every seasonal period ``freq`` implies, shortest first: daily and weekly cycles below a
    day, weekly and yearly for days, yearly for weeks, months and quarters. ``(1,)`` when
    none (yearly data: the naive forecast is the only seasonal one)."""
    import pandas as pd

    offset = pd.tseries.frequencies.to_offset(freq)
    day, week = pd.Timedelta(days=1), pd.Timedelta(days=7)
    if isinstance(offset, pd.offsets.Tick):
        step = pd.Timedelta(offset)
        if step < day and (day % step) == pd.Timedelta(0):
            return (int(day / step), int(week / step))
        if step == day:
            return (7, 365)
        return (1,)
    name = offset.name.upper()
    if name == "D":
        return (7, 365) if offset.n == 1 else (1,)
    if name.startswith("B") and not name.startswith(("BM", "BQ", "BY", "BA")):
        return (5, 260)
    first = season_for_freq(freq)
    return (first,)


def model_seasons(season: int, implied: tuple[int, ...], lookback: int) -> tuple[int, ...]:
    """The seasonal periods a model anchors on: the run's ``season`` first, then every other
    period the frequency implies that fits in the lookback (hourly, lookback 168: 24, 168)."""
    return (season, *(s for s in dict.fromkeys(implied) if s != season and 1 < s <= lookback))


def evaluation_seasons(freq: str, season: int) -> tuple[int, ...]:
    """Every seasonality the frequency implies, plus the run's season: the seasons the holdout
    origins visit every phase of and the seasonal naives are made for."""
    return tuple(sorted({*seasons_for_freq(freq), season}))
