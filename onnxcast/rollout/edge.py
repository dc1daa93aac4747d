"""The edge client: pull a channel's model from the rollout store, verify it, swap it in
atomically, and run it with ONNX Runtime and numpy only.

A device folder ``DEST`` looks like this::

    DEST/trust/root.json, state.json           (onnxcast.rollout.trust)
    DEST/versions/<version>/manifest.json, <artifact>.onnx, pulled.json
    DEST/current  -> versions/<version>       (symlink, swapped with os.replace)
    DEST/previous -> versions/<older>         (kept for a manual fallback)

``pull`` first brings the trust root up to date (the store's root chain), then reads the
channel pointer and checks its signatures, expiry and counter before it reads anything
else; the manifest is downloaded up to the length the pointer signs and checked against
its signed digest and its own signatures, the artifact up to the length the manifest
signs. It refuses (RefusedError/VerificationError, one line, nothing changed, the old
model keeps serving) whatever does not verify, a model whose ONNX I/O differs from the
contract or the manifest, or one that references external data (CVE-2024-27318). This
module must not import torch or pandas: devices do not have them.
"""

from __future__ import annotations

import calendar
import csv
import heapq
import json
import logging
import math
import os
import re
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from onnxcast.base.batches import CHUNK_ROWS, run_in_chunks
from onnxcast.base.contract import (
    METADATA_PREFIX,
    OUTPUT_NAME,
    QUANTILE_METADATA,
    QUANTILES_NAME,
    contract_problems,
    has_quantiles,
    opset_of,
    parse_quantile_levels,
    quantile_problems,
    read_metadata,
    signature,
)
from onnxcast.base.csvcells import text_cell
from onnxcast.base.errors import (
    ConfigError,
    DataError,
    OnnxcastError,
    RefusedError,
    StoreError,
    VerificationError,
)
from onnxcast.base.files import sha256_bytes
from onnxcast.base.s3 import S3Settings
from onnxcast.base.untrusted import (
    UntrustedInputError,
    loads_json,
    quote,
    regular_file_size,
    series_id_problem,
)
from onnxcast.rollout.command import device_command
from onnxcast.rollout.device import (
    CURRENT,
    PREVIOUS,
    STAGING_PREFIX,
    VERSIONS,
    DeviceFolder,
    DeviceFolderError,
    open_device_folder,
)
from onnxcast.rollout.device_runtime import open_runtime
from onnxcast.rollout.device_target import (
    DEVICE_TARGETS,
    LEGACY_TARGET,
    ONNXRUNTIME,
    DeviceFacts,
    Preference,
    choose,
    preference,
    read_facts,
)
from onnxcast.rollout.store import MANIFEST, MAX_POINTER_BYTES, check_name, open_store, write_new
from onnxcast.rollout.trust import DeviceTrust

log = logging.getLogger(__name__)

PREDICT_METADATA = ("target", "features", "lookback", "horizon")
PULLED = "pulled.json"
# pulled.json's target of a pull of the channel's own artifact (pull(channel_artifact=True))
CHANNEL_ARTIFACT_RECORD = {"name": LEGACY_TARGET, "runtime": ONNXRUNTIME, "fallback": False,
                           "why": "the channel's own artifact (a server, the monitor or a model repository pulled it)"}
DEFAULT_TIME_COLUMN = "ds"  # the pipeline's default time column (PipelineConfig.time_column)
# An input table for one forecast is the newest `lookback` rows; 256 MiB is years of
# half-hourly rows. Streamed: memory holds `lookback` rows, not the file.
MAX_INPUT_BYTES = 256 * 1024 * 1024
MAX_INTERVAL_S = 86_400  # a watch polls at least once a day
MAX_LINE_BYTES = 1 << 20  # a row of a forecast table is a few hundred bytes
MAX_FIELDS = 10_000  # fields in a header or row
MAX_COLUMNS_SHOWN = 20
# A fleet input (--series-column): at most this many series, ids by the pipeline's rule
# (onnxcast.base.untrusted.series_id_problem, MAX_SERIES_ID characters at most); ONNX Runtime
# gets ORT_CHUNK series a call (cache-sized: onnxcast.base.batches).
MAX_SERIES = 100_000
MAX_SHORT_SHOWN = 5
MAX_PADDED_NAMED = 20  # padded series named one warning line each; the rest are counted in one
ORT_CHUNK = CHUNK_ROWS
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_COLUMN_NAME = re.compile(r"[A-Za-z0-9_ .-]{1,60}")


@dataclass(frozen=True)
class PullResult:
    """What a pull did: ``changed`` is False when DEST/current already was the channel's model."""

    model: str
    channel: str
    version: str
    changed: bool
    path: Path
    previous: str | None = None
    target: str | None = None  # the deployment target installed (onnxcast.rollout.device_target)
    why: str | None = None


@dataclass(frozen=True)
class ModelInfo:
    """What the edge checks in an ONNX file, and what promotion records in the manifest."""

    signature: dict
    opset: int
    metadata: dict[str, str]


def pull(store_uri: str, model: str, channel: str, dest: str | Path, *, trust: str | Path | None = None,
         s3_settings: S3Settings | None = None, target: str | None = None,
         channel_artifact: bool = False) -> PullResult:
    """Install the model ``channel`` points to under ``dest/current`` if it verifies
    against the device's trust root (``trust``, ``$ONNXCAST_TRUST`` or ``dest/trust``).

    Raises StoreError when the store cannot be read or has no such channel, RefusedError
    when the release metadata or a file is not what the release keys signed, and
    VerificationError when the model fails the device's checks; ``dest/current`` is
    unchanged then and the message says which version keeps serving. Nothing outside
    ``dest`` is written or removed (onnxcast.rollout.device).

    The artifact installed is the one of the device's target (onnxcast.rollout.device_target:
    ``target``, else ``$ONNXCAST_EDGE_TARGET``, else resolved from this machine's facts); a
    channel with no variant validated for this device is refused (RefusedError).
    ``channel_artifact``: the pointer's own artifact instead, whatever the device (what a server
    serves, the monitor judges and a model repository publishes), run with ONNX Runtime.
    """
    check_name("model", model)
    check_name("channel", channel)
    device = None
    if not channel_artifact:
        facts = read_facts()
        device = (preference(facts, target), facts)  # an unknown or foreign --target: refused before anything
    store = open_store(store_uri, s3_settings)
    with open_device_folder(dest, create=True) as folder, folder.locked():
        current = _installed(folder)
        try:
            return _pull_locked(store, model, channel, folder, trust, current, device)
        except VerificationError as exc:  # RefusedError included
            serving = f"still serving version {current['version']}" if current else "nothing installed"
            raise type(exc)(f"{exc} ({serving})") from None


def _pull_locked(store, model: str, channel: str, folder: DeviceFolder, trust_file,
                 current: dict | None, device: tuple[Preference, DeviceFacts] | None) -> PullResult:
    trust = DeviceTrust(folder, trust_file)
    key = store.channel_key(model, channel)
    where = store.url(key)
    data = store.read(key, MAX_POINTER_BYTES)
    if data is None:
        raise StoreError(f"{where}: no such channel for model {model!r}")
    if len(data) > MAX_POINTER_BYTES:
        raise RefusedError(f"{where}: longer than {MAX_POINTER_BYTES:,} bytes (stopped reading); refusing it")
    signed, want = check_pointer(store, trust, model, channel, data)
    if _unchanged(folder, current, want, device[0] if device else None):
        trust.record(model, channel, signed)
        target = current.get("target") if isinstance(current.get("target"), dict) else {}
        return PullResult(model, channel, want["version"], False, folder.path / CURRENT, target=target.get("name"),
                          why=target.get("why"))
    staging = f"{STAGING_PREFIX}{uuid.uuid4().hex}"
    os.mkdir(staging, 0o755, dir_fd=folder.fd)
    try:
        staging_fd = folder.open_folder(folder.fd, staging, create=False)
        try:
            pulled = _download(store, trust, model, channel, want, folder.path / staging, staging_fd, device)
        finally:
            os.close(staging_fd)
        installed = _install(folder, staging, want["version"])
    finally:
        folder.remove(folder.fd, staging)  # gone already when installed
    trust.record(model, channel, signed)
    previous = current.get("version") if current else None
    log.info("installed %s version %s (channel %s) at %s", model, want["version"], channel, installed)
    return PullResult(model, channel, want["version"], True, folder.path / CURRENT, previous,
                      pulled["target"]["name"], pulled["target"]["why"])


def _unchanged(folder: DeviceFolder, current: dict | None, want: dict, prefer: Preference | None) -> bool:
    """Whether ``current`` is the pointer's version, installed intact, for the same targets as
    this device's now (a device that gained a runtime, or a --target, pulls again); with no
    ``prefer`` (a pull of the channel's own artifact), whether that artifact is installed."""
    if not current or current.get("version") != want["version"]:
        return False
    target = current.get("target") if isinstance(current.get("target"), dict) else {}
    if prefer is None:
        same = current.get("sha256") == want["sha256"]
    else:
        same = (current.get("channel_sha256", current.get("sha256")) == want["sha256"]
                and target.get("preference") == list(prefer.targets) and target.get("override") == prefer.override)
    return same and _installed_sha(folder, current) == current.get("sha256")


def watch(store_uri: str, model: str, channel: str, dest: str | Path, *, interval: float = 60.0,
          max_polls: int | None = None, on_poll: Callable[[str], None] = log.info,
          sleep: Callable[[float], None] = time.sleep, trust: str | Path | None = None,
          s3_settings: S3Settings | None = None, target: str | None = None) -> int:
    """Poll the channel every ``interval`` seconds (``max_polls`` times, or forever) and pull
    what it names. A poll that fails keeps the current model. Returns the failed polls."""
    if not 0 <= interval <= MAX_INTERVAL_S:  # nan and inf included: time.sleep raises on them
        raise ConfigError(f"interval must be between 0 and {MAX_INTERVAL_S:,} seconds, got {interval!r}")
    failures = polls = 0
    while max_polls is None or polls < max_polls:
        if polls:
            sleep(interval)
        polls += 1
        try:
            result = pull(store_uri, model, channel, dest, trust=trust, s3_settings=s3_settings, target=target)
            on_poll(f"poll {polls}: {'installed' if result.changed else 'unchanged at'} version {result.version}")
        except RefusedError as exc:
            failures += 1
            on_poll(f"poll {polls}: refused, keeping the current model: {exc}")
        except OnnxcastError as exc:
            failures += 1
            on_poll(f"poll {polls}: failed, keeping the current model: {exc}")
        except Exception as exc:  # a follower must outlive a bug: report it on its line, poll again
            failures += 1
            log.debug("poll %d crashed", polls, exc_info=True)
            on_poll(f"poll {polls}: failed (internal error {type(exc).__name__}), keeping the current model")
    return failures


def predict(model_dir: str | Path, input_csv: str | Path, out: TextIO | None = None, threads: int = 1,
            time_column: str = DEFAULT_TIME_COLUMN, *, series_column: str | None = None, min_rows: int | None = None,
            chunk: int = ORT_CHUNK) -> Forecast:
    """Forecast every series of the CSV table ``input_csv`` with ``model_dir/current``, ``chunk``
    series an ONNX Runtime call, and write the forecast as CSV to ``out`` (stdout by default).

    Without ``series_column`` the table is one series: its newest ``lookback`` rows are the
    history (``min_rows`` defaults to the whole lookback) and the output is
    ``step,<time_column>,forecast[,q<level>...],version``. With it, the table is long (one row
    per series and time, any order) and each series gets ``horizon`` rows of
    ``<series_column>,step,...``; a series shorter than the lookback is edge-padded (a warning
    names it), one with fewer than ``min_rows`` real rows (default: the model's season, see
    ``fleet_min_rows``) is refused, since its forecast would be made of padding. A model with
    the ``quantiles`` output gets one column per level after ``forecast``, in the model's
    order (``q0.025``, ..., ``q0.975``). The times follow each series' last ``time_column``
    value at the model's ``onnxcast.freq``; they are left empty (with a warning) when that
    value is not an ISO 8601 time or the frequency is not one this client steps."""
    if not 1 <= chunk <= 1 << 20:
        raise ConfigError(f"chunk must be between 1 and {1 << 20:,} series, got {chunk!r}")
    model = _open_model(model_dir, threads)
    least = _least_rows(model, series_column, min_rows)
    if series_column is not None and model.meta.get("global") != "true":
        log.warning("%s: the model was trained on one series, not a fleet (no onnxcast.global); it forecasts each "
                    "series from that series' own history all the same", model_dir)
    table = read_input(input_csv, model.columns, model.lookback, series_column=series_column,
                       time_column=time_column, min_rows=least)
    parts = [model.run(table.histories[i:i + chunk]) for i in range(0, len(table.series), chunk)]
    forecast = np.concatenate([f for f, _ in parts])
    quantiles = np.concatenate([q for _, q in parts]) if model.levels else None
    result = Forecast(table.series, forecast, table.padded, quantiles)
    _write_forecast(out or sys.stdout, model, table, result, input_csv, series_column, time_column)
    return result


@dataclass(frozen=True)
class Forecast:
    """What ``predict`` forecast: ``forecast[i]`` is series ``series[i]``'s, in the order the
    series first appear in the input (one series without a series column: ``series == [""]``);
    ``padded`` names the series that were shorter than the lookback (edge-padded)."""

    series: list[str]
    forecast: np.ndarray  # float32 [n_series, horizon]
    padded: list[str]
    quantiles: np.ndarray | None = None  # float32 [n_series, horizon, Q]; None: the model has no quantiles output


def fleet_min_rows(meta: dict[str, str], lookback: int) -> int:
    """The fewest real rows a series of a long table needs by default: one season of the model
    (``onnxcast.season``, at least 2), at most its lookback; 2 when it names no season.
    Below a season, edge padding would fill the seasonal anchor the graph forecasts from."""
    try:
        season = int(meta.get("season", "2"))
    except ValueError:
        season = 2
    return min(max(season, 2), lookback)


def _least_rows(model: _Model, series_column: str | None, min_rows: int | None) -> int:
    """The fewest real rows a series needs: ``min_rows`` when given, else the whole lookback
    for one series and ``fleet_min_rows`` for a long table."""
    if min_rows is None:
        return model.lookback if series_column is None else fleet_min_rows(model.meta, model.lookback)
    if not 1 <= min_rows <= model.lookback:
        raise ConfigError(f"min_rows must be between 1 and the model's lookback of {model.lookback}, got {min_rows!r}")
    return min_rows


def _write_forecast(out: TextIO, model: _Model, table: SeriesInput, result: Forecast, input_csv,
                    series_column: str | None, time_column: str) -> None:
    """``horizon`` CSV rows per series, the series id first when the table has a series column;
    text cells through text_cell (no spreadsheet formulas), numbers as numbers."""
    freq, version = model.meta.get("freq", ""), text_cell(model.info.get("version"))
    writer = csv.writer(out, lineterminator="\n")
    id_header = [text_cell(series_column)] if series_column is not None else []
    writer.writerow([*id_header, "step", text_cell(time_column), "forecast", *model.quantile_columns, "version"])
    no_times = []
    for row, (series, last, values) in enumerate(zip(table.series, table.last_times, result.forecast, strict=True)):
        times = future_times(last, freq, len(values))
        if times is None:
            no_times.append(row)
            times = [""] * len(values)
        id_cell = [text_cell(series)] if series_column is not None else []
        for step, (moment, value) in enumerate(zip(times, values, strict=True), start=1):
            writer.writerow([*id_cell, step, text_cell(moment), _format_value(value),
                             *_quantile_cells(result.quantiles, row, step - 1), version])
    if no_times:
        _warn_no_times(input_csv, table, no_times, series_column, time_column, freq)


def _warn_no_times(input_csv, table: SeriesInput, rows: list[int], series_column: str | None, time_column: str,
                   freq: str) -> None:
    """One warning line for the series whose forecast times were left empty."""
    first = rows[0]
    if series_column is None:
        log.warning("%s: forecast times left empty (last %s value %s, model frequency %s); the steps count from "
                    "the input's last row", input_csv, time_column, quote(table.last_times[first]), quote(freq))
        return
    log.warning("%s: forecast times left empty for %d series (first %s, last %s value %s, model frequency %s); "
                "their steps count from each series' last row", input_csv, len(rows), quote(table.series[first]),
                time_column, quote(table.last_times[first]), quote(freq))


@dataclass(frozen=True)
class _Model:
    session: Any
    meta: dict[str, str]
    info: dict
    columns: list[str]
    lookback: int
    levels: tuple[float, ...] = ()  # the quantiles output's levels; empty: a model without it

    @property
    def quantile_columns(self) -> list[str]:
        return quantile_columns(self.levels)

    def run(self, histories: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(forecast [batch, horizon], quantiles [batch, horizon, Q] or None)``, in cache-sized
        chunks of a fleet (onnxcast.base.batches)."""
        if not self.levels:
            return run_in_chunks(self.session, [OUTPUT_NAME], histories)[0], None
        forecast, quantiles = run_in_chunks(self.session, [OUTPUT_NAME, QUANTILES_NAME], histories)
        if quantiles.shape[1:] != (forecast.shape[1], len(self.levels)):  # a graph whose Q axis is dynamic
            raise VerificationError(f"the model's {QUANTILES_NAME} output has shape {list(quantiles.shape)}, its "
                                    f"{METADATA_PREFIX}{QUANTILE_METADATA} lists {len(self.levels)} levels")
        return forecast, quantiles


def quantile_columns(levels) -> list[str]:
    """The CSV column of each level, in order: ``0.025`` -> ``q0.025``."""
    return [f"q{float(level)!r}" for level in levels]


def _open_model(model_dir: str | Path, threads: int) -> _Model:
    """The installed model's session in the runtime of the target it was pulled for (ONNX
    Runtime, OpenVINO, TVM), metadata (unprefixed), pulled.json, input columns and quantile
    levels; VerificationError (one line) when its metadata does not fit it."""
    model_path, info = installed(model_dir)
    name = info["target"].get("name") if isinstance(info.get("target"), dict) else None
    target = DEVICE_TARGETS.get(name or LEGACY_TARGET)
    if target is None:
        raise VerificationError(f"{model_path}: installed for target {name!r}, which this client does not know; "
                                f"pull again")
    if target.runtime == ONNXRUNTIME:
        session, meta, found = _ort_model(model_path, threads, target.provider)
    else:
        session, meta, found = open_runtime(target, model_path, info, threads)
    missing = [k for k in PREDICT_METADATA if k not in meta]
    if missing:
        raise VerificationError(f"{model_path}: ONNX metadata lacks onnxcast.{', onnxcast.'.join(missing)}")
    problems = quantile_problems(found, meta)
    if problems:
        raise VerificationError(f"{model_path}: " + "; ".join(problems))
    levels = parse_quantile_levels(meta[QUANTILE_METADATA]) if has_quantiles(found) else ()
    columns = [meta["target"], *[c for c in meta["features"].split(",") if c]]
    return _Model(session, meta, info, columns, int(meta["lookback"]), levels)


def _ort_model(model_path: Path, threads: int, provider: str | None) -> tuple[Any, dict[str, str], dict]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    providers = [provider, "CPUExecutionProvider"] if provider else ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(model_path), options, providers=providers)
    return session, _prefixed(session.get_modelmeta().custom_metadata_map), ort_signature(session)


def _format_value(value) -> str:
    return np.format_float_positional(np.float32(value), unique=True, trim="-")


def _quantile_cells(quantiles: np.ndarray | None, row: int, step: int) -> list[str]:
    return [] if quantiles is None else [_format_value(v) for v in quantiles[row, step]]


def installed_model(model_dir: str | Path) -> Path:
    """The ONNX file ``model_dir/current`` serves, after checking its sha256."""
    return installed(model_dir)[0]


def installed(model_dir: str | Path) -> tuple[Path, dict]:
    """(ONNX file, pulled.json) of the version ``model_dir/current`` serves, after checking
    the file's sha256. The path is the real one (``versions/<v>/<artifact>``), found without
    following any symlink but ``current``, which must point into ``versions/``."""
    nothing = ConfigError(f"{Path(model_dir).absolute() / CURRENT}: no model installed; run "
                          f"'{device_command('pull')}' first")
    if not os.path.lexists(model_dir):
        raise nothing
    with open_device_folder(model_dir, create=False) as folder:
        info = _installed(folder)
        if info is None:
            raise nothing
        artifact = check_name("artifact", str(info.get("artifact")))
        path = folder.path / VERSIONS / info["_folder"] / artifact
        if _installed_sha(folder, info) != info.get("sha256"):
            raise VerificationError(f"{path}: sha256 does not match the pulled manifest; pull again")
    return path, info


@dataclass(frozen=True)
class SeriesInput:
    """The histories of a table's series: ``histories[i]`` is series ``series[i]``'s newest
    ``lookback`` rows (edge-padded when it has fewer), ``last_times[i]`` its newest time value
    as written (None without a time column), ``rows[i]`` how many rows it has in the file. A
    table without a series column is one series, named ``""``."""

    series: list[str]
    histories: np.ndarray  # float32 [n_series, lookback, n_columns]
    last_times: list[str | None]
    rows: list[int]
    padded: list[str]


def read_input(path: str | Path, columns: list[str], lookback: int, *, series_column: str | None = None,
               time_column: str | None = None, min_rows: int | None = None) -> SeriesInput:
    """Each series' newest ``lookback`` rows of ``columns`` in the CSV table ``path``: a regular
    file of at most MAX_INPUT_BYTES, streamed under the line and field limits; memory holds
    ``lookback`` rows per series, at most MAX_SERIES series.

    Rows are grouped by ``series_column`` and ordered by ``time_column`` (ISO 8601 times or
    numbers; any row order). Without a series column the table is one series in file order,
    and ``time_column`` (optional) only gives the last time. Every row's values are checked:
    a bad series id, a time or value that is not one, a duplicate time among the rows kept
    is refused in one line naming the file, the series, the column, the line and the value;
    the file itself is never quoted. A series with fewer than ``min_rows`` rows (default:
    ``lookback``) is refused (up to MAX_SHORT_SHOWN named); one shorter than ``lookback`` is
    edge-padded with its first row, with a warning naming it."""
    if series_column is not None and time_column is None:
        raise ConfigError("a table with a series column needs a time column to order each series' rows")
    with _open_input(path) as lines:
        reader = csv.reader(lines)
        try:
            header = next(reader, None) or []
            _check_fields(path, header, None)
            table = _LongTable(path, header, columns, lookback, series_column, time_column)
            for row in reader:
                _check_fields(path, row, reader.line_num)
                if row:
                    table.add(row, reader.line_num)
        except UnicodeDecodeError:
            raise DataError(f"{path}: not UTF-8 text; expected a CSV table") from None
        except csv.Error as exc:
            raise DataError(f"{path}: not a CSV table (line {reader.line_num}: {exc})") from None
    return table.histories(lookback if min_rows is None else min_rows)


def _check_fields(path, row: list[str], line: int | None) -> None:
    """A header (``line`` None) or row of at most MAX_FIELDS fields."""
    if len(row) > MAX_FIELDS:
        count = f"{len(row):,} fields in its first line" if line is None else f"line {line} has {len(row):,} fields"
        raise DataError(f"{path}: {count}, more than {MAX_FIELDS:,}; expected a CSV table")


class _LongTable:
    """The rows kept while a table streams by: per series a min-heap of (time key, line,
    values) of its newest ``lookback`` rows, their {time key: line}, and its newest time as
    written (the forecast's times follow it). Compact on purpose: 10,000 series x 144 rows is
    1.4 million entries."""

    def __init__(self, path, header: list[str], columns: list[str], lookback: int, series_column: str | None,
                 time_column: str | None) -> None:
        index = {name: i for i, name in reversed(list(enumerate(header)))}
        keys = [series_column, time_column] if series_column is not None else []
        needed = [*keys, *[c for c in columns if c not in keys]]
        missing = [c for c in needed if c not in index]
        if missing:
            raise DataError(f"{path}: missing column(s) {', '.join(quote(c) for c in missing)}; "
                            f"{_describe_header(header)}")
        self.path, self.columns, self.lookback = path, columns, lookback
        self.series_column, self.time_column = series_column, time_column
        self.at_series = index[series_column] if series_column is not None else None
        self.at_time = index.get(time_column) if time_column is not None else None
        self.wanted = [index[c] for c in columns]
        self.kept: dict[str, list] = {}
        self.lines_of: dict[str, dict] = {}
        self.newest: dict[str, tuple[float, str | None]] = {}
        self.counts: dict[str, int] = {}
        self.kinds: dict[str, str] = {}
        if series_column is None:
            self._new_series("")  # one series, present even in a table without rows

    def add(self, row: list[str], line: int) -> None:
        """Check one data row and keep it when it is among its series' newest ``lookback``."""
        series = self._series_of(row, line)
        key, text = self._time_of(series, row, line)
        values = self._values_of(series, row, line)
        self.counts[series] += 1
        heap, seen = self.kept[series], self.lines_of[series]
        if key in seen:
            raise DataError(f"{self._where(series)}duplicate {self.time_column} {quote(text)} at lines "
                            f"{seen[key]} and {line}")
        entry = (key, line, values)
        if key > self.newest[series][0]:
            self.newest[series] = (key, text)
        if len(heap) < self.lookback:
            heapq.heappush(heap, entry)
        elif key > heap[0][0]:  # newer than the oldest row kept: replaces it
            del seen[heapq.heapreplace(heap, entry)[0]]
        else:
            return  # older than every row kept: outside the window
        seen[key] = line

    def histories(self, min_rows: int) -> SeriesInput:
        """The kept rows as float32 histories, oldest first, after refusing short series."""
        self._refuse_short(min_rows)
        histories = np.empty((len(self.kept), self.lookback, len(self.columns)), dtype=np.float32)
        padded = []
        for i, (series, heap) in enumerate(self.kept.items()):
            heap.sort()
            values = np.asarray([entry[2] for entry in heap], dtype=np.float32)
            gap = self.lookback - len(heap)
            if gap:
                padded.append(series)
                if len(padded) <= MAX_PADDED_NAMED:  # a 10,000-series fleet had 8,450 of them: the rest are counted
                    log.warning("%s: series %s has %d row(s), edge-padded to the model's lookback of %d with its "
                                "first row", self.path, quote(series), len(heap), self.lookback)
            histories[i, :gap] = values[0]
            histories[i, gap:] = values
        if len(padded) > MAX_PADDED_NAMED:
            log.warning("%s: %d more series shorter than the lookback of %d were edge-padded (%d in all)",
                        self.path, len(padded) - MAX_PADDED_NAMED, self.lookback, len(padded))
        last_times = [self.newest[series][1] for series in self.kept]
        return SeriesInput(list(self.kept), histories, last_times, list(self.counts.values()), padded)

    def _where(self, series: str) -> str:
        """The start of an error line about a row of ``series``."""
        return f"{self.path}: series {quote(series)}: " if self.series_column is not None else f"{self.path}: "

    def _new_series(self, series: str) -> None:
        self.kept[series], self.lines_of[series], self.counts[series] = [], {}, 0
        self.newest[series] = (-math.inf, None)

    def _series_of(self, row: list[str], line: int) -> str:
        if self.at_series is None:
            return ""
        series = _cell(row, self.at_series)
        if series not in self.counts:
            _check_series_id(self.path, series, line, self.series_column)
            if len(self.counts) >= MAX_SERIES:
                raise DataError(f"{self.path}: more than {MAX_SERIES:,} series in column "
                                f"{quote(self.series_column)} (line {line}); split the table")
            self._new_series(series)
        return series

    def _time_of(self, series: str, row: list[str], line: int) -> tuple[float, str | None]:
        """(sort key, time as written) of a row. One series (no series column) is in file order,
        the line is its key: a device appends its log as it measures, and a clock set back or a
        repeated local hour must not reorder or refuse it; its time column only dates the forecast."""
        if self.at_series is None:
            return float(line), _cell(row, self.at_time) if self.at_time is not None else None
        text = _cell(row, self.at_time)
        kind, key = _time_key(text)
        if kind is None:
            raise DataError(f"{self._where(series)}{self.time_column} value {quote(text)} at line {line} is not an "
                            "ISO 8601 time or a number")
        if self.kinds.setdefault(series, kind) != kind:
            raise DataError(f"{self._where(series)}{self.time_column} value {quote(text)} at line {line} is a "
                            f"{kind}, its earlier rows have a {self.kinds[series]}")
        return key, text

    def _values_of(self, series: str, row: list[str], line: int) -> tuple[float, ...]:
        values = []
        for column, i in zip(self.columns, self.wanted, strict=True):
            cell = _cell(row, i)
            try:
                value = float(cell)
            except ValueError:
                raise DataError(f"{self._where(series)}column {quote(column)} has non-numeric value {quote(cell)} "
                                f"at line {line}") from None
            if not abs(value) <= _FLOAT32_MAX:  # NaN and infinity too: the model takes float32
                raise DataError(f"{self._where(series)}column {quote(column)} value {quote(cell)} at line {line} "
                                "is not finite")
            values.append(value)
        return tuple(values)

    def _refuse_short(self, min_rows: int) -> None:
        if self.series_column is None:
            if self.counts[""] < min_rows:
                raise DataError(f"{self.path}: {self.counts['']} row(s), the model needs the last {min_rows}")
            return
        if not self.counts:
            raise DataError(f"{self.path}: no data rows; expected one row per series and {self.time_column}")
        short = [s for s, n in self.counts.items() if n < min_rows]
        if short:
            named = ", ".join(f"{quote(s)} ({self.counts[s]})" for s in short[:MAX_SHORT_SHOWN])
            more = f" and {len(short) - MAX_SHORT_SHOWN:,} more" if len(short) > MAX_SHORT_SHOWN else ""
            raise DataError(f"{self.path}: {len(short):,} series with fewer than the {min_rows} row(s) the model "
                            f"needs (rows in brackets): {named}{more}; drop them or pass a lower --min-rows")


def _cell(row: list[str], at: int) -> str:
    """Cell ``at`` of a CSV row, empty when the row is shorter."""
    return row[at] if at < len(row) else ""


def _check_series_id(path, series: str, line: int, series_column: str) -> None:
    """A series id by the pipeline's rule (onnxcast.base.untrusted.series_id_problem): it is
    written back in the output and in error lines."""
    why = series_id_problem(series)
    if why:
        raise DataError(f"{path}: {series_column} value {quote(series)} at line {line} is {why}; "
                        "expected a series id")


def _time_key(text: str) -> tuple[str | None, float]:
    """(kind, sort key) of a time cell: ("time", POSIX seconds) for ISO 8601 (a time without
    an offset read as UTC), ("number", the number) for a step number, (None, nan) otherwise."""
    value = text.strip()
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        try:
            number = float(value)
        except ValueError:
            return None, math.nan
        return ("number", number) if math.isfinite(number) else (None, math.nan)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return "time", moment.timestamp()


def future_times(last: str | None, freq: str, horizon: int) -> list[str] | None:
    """The ``horizon`` times after ``last`` (ISO 8601) at pandas frequency alias ``freq``
    (``30min``, ``h``, ``D``, ``W-SUN``, ``B``, ``MS``, ``ME``, ``QS``, ``QE-MAR``, ``YS`` ...),
    as pandas steps ``last + offset``: an anchored frequency's first step is the next anchor
    after ``last`` (``ME`` from 2026-01-15 is 2026-01-31, ``W-SUN`` the next Sunday). Written as
    ``last`` is (``Z`` stays ``Z``; a date stays a date unless the step is under a day). None
    when either is not understood, or the times pass year 9999. Stdlib only: a device has no
    pandas."""
    if not last:
        return None
    text = last.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    step = _parse_freq(freq)
    if step is None:
        return None
    kind, n = step
    sub_daily = isinstance(kind, timedelta) and (kind * n) % timedelta(days=1) != timedelta(0)
    out, current = [], moment
    try:
        for i in range(horizon):
            if isinstance(kind, timedelta):
                current = current + kind * n
            elif kind == "B":
                for _ in range(n):
                    current += timedelta(days=1)
                    while current.weekday() >= 5:
                        current += timedelta(days=1)
            elif kind[0] == "week":
                weekday = kind[1]
                if i == 0:  # the next anchor day after `last`, then whole weeks
                    current += timedelta(days=(weekday - current.weekday() - 1) % 7 + 1) + timedelta(weeks=n - 1)
                else:
                    current += timedelta(weeks=n)
            else:
                _, months, anchor, month = kind
                current = _next_anchor(current, months, anchor, month, n if i else n - 1, first=i == 0)
            out.append(_format_like(current, text, sub_daily))
    except (OverflowError, ValueError):  # past 9999-12-31: datetime's range
        return None
    return out


# --- reading: metadata, installed state, input -----------------------------------------

def _parse_metadata(data: bytes, where: str) -> Any:
    """JSON of bounded size and depth, or RefusedError (one line, never quoting it)."""
    try:
        return loads_json(data, what=where)
    except UntrustedInputError as exc:
        raise RefusedError(f"{exc}; refusing it") from None


def _installed(folder: DeviceFolder) -> dict | None:
    """pulled.json of the version ``current`` points to (plus ``_folder``, its folder name in
    versions/); None when nothing valid is installed."""
    name = folder.link_target(CURRENT)
    if name is None:
        return None
    with folder.folder(VERSIONS, create=False) as versions:
        if versions is None:
            return None
        version_fd = folder.open_folder(versions, name, create=False, where=f"{VERSIONS}/{name}")
        if version_fd is None:
            return None
        try:
            data = folder.read(version_fd, PULLED, f"{VERSIONS}/{name}/{PULLED}")
        finally:
            os.close(version_fd)
    if data is None:
        return None
    try:
        info = loads_json(data, what=PULLED)
    except UntrustedInputError:
        return None
    return {**info, "_folder": name} if isinstance(info, dict) else None


def _installed_sha(folder: DeviceFolder, info: dict) -> str | None:
    """The sha256 of the installed artifact, read without following a symlink."""
    try:
        artifact = check_name("artifact", str(info.get("artifact")))
    except ConfigError:
        return None
    with folder.folder(VERSIONS, create=False) as versions:
        if versions is None:
            return None
        version_fd = folder.open_folder(versions, info["_folder"], create=False,
                                        where=f"{VERSIONS}/{info['_folder']}")
        if version_fd is None:
            return None
        try:
            return folder.sha256(version_fd, artifact)
        finally:
            os.close(version_fd)


@contextmanager
def _open_input(path: str | Path) -> Iterator[Iterator[str]]:
    """The lines of a regular file of at most MAX_INPUT_BYTES: checked on the open descriptor
    (``/dev/zero`` and FIFOs refused before a byte is read), the bytes counted while
    streaming (``/proc/self/pagemap`` says 0 bytes and never ends), no line longer than
    MAX_LINE_BYTES held, and a read error (``/proc/self/mem``) one line."""
    try:
        size = regular_file_size(path, what="input", limit=MAX_INPUT_BYTES)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except UntrustedInputError as exc:
        raise DataError(str(exc)) from None
    except OSError as exc:
        raise DataError(f"input {str(path)!r}: cannot read ({exc.strerror or type(exc).__name__})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_INPUT_BYTES:  # swapped since the check
            raise DataError(f"input {str(path)!r} changed while opening it; refusing it")

        def lines() -> Iterator[str]:
            total, pending = 0, b""
            while True:
                try:
                    chunk = os.read(fd, 1 << 20)
                except OSError as exc:
                    raise DataError(f"input {str(path)!r}: cannot read ({exc.strerror or type(exc).__name__})"
                                    ) from None
                if not chunk:
                    break
                total += len(chunk)
                if total > MAX_INPUT_BYTES:
                    raise DataError(f"input {str(path)!r}: more than {MAX_INPUT_BYTES:,} bytes read (its size "
                                    f"said {size:,}); refusing it")
                *complete, pending = (pending + chunk).split(b"\n")
                for line in complete:
                    if len(line) >= MAX_LINE_BYTES:
                        raise _long_line(path)
                    yield (line + b"\n").decode("utf-8")
                if len(pending) >= MAX_LINE_BYTES:
                    raise _long_line(path)
            if pending:
                yield pending.decode("utf-8")

        yield lines()
    finally:
        os.close(fd)


def _long_line(path) -> DataError:
    return DataError(f"input {str(path)!r}: a line longer than {MAX_LINE_BYTES:,} bytes; expected a CSV table")


def _describe_header(header: list[str]) -> str:
    """The header's column names when it is one (short names of letters, digits and
    ``_ .-``), else only its field count: the first line of a file that is not a table
    (``/etc/shadow``) must not appear in an error."""
    if header and all(_COLUMN_NAME.fullmatch(name) for name in header):
        shown = [quote(name) for name in header[:MAX_COLUMNS_SHOWN]]
        more = f" and {len(header) - MAX_COLUMNS_SHOWN} more" if len(header) > MAX_COLUMNS_SHOWN else ""
        return f"found {', '.join(shown)}{more}"
    return f"its first line is not a header of column names ({len(header)} field(s); not shown)"


_WEEKDAYS = {"MON": 0, "TUE": 1, "WED": 2, "THU": 3, "FRI": 4, "SAT": 5, "SUN": 6}
_MONTHS = {name: i for i, name in enumerate(
    ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), start=1)}


def _parse_freq(freq: str):
    """(step, multiple) for a pandas frequency alias: a timedelta, "B", ("week", weekday) or
    ("months", period, "start"|"end", anchor month); None when not one of these."""
    match = re.fullmatch(r"(\d*)([A-Za-z]+)(?:-([A-Za-z]{3}))?", (freq or "").strip())
    if not match:
        return None
    n = int(match.group(1) or 1)
    unit, suffix = match.group(2), (match.group(3) or "").upper()
    if not 1 <= n <= 10_000:
        return None
    fixed = {"us": timedelta(microseconds=1), "U": timedelta(microseconds=1), "ms": timedelta(milliseconds=1),
             "L": timedelta(milliseconds=1), "s": timedelta(seconds=1), "S": timedelta(seconds=1),
             "min": timedelta(minutes=1), "T": timedelta(minutes=1), "h": timedelta(hours=1),
             "H": timedelta(hours=1), "D": timedelta(days=1)}
    months = {"MS": (1, "start"), "ME": (1, "end"), "M": (1, "end"), "QS": (3, "start"), "QE": (3, "end"),
              "Q": (3, "end"), "YS": (12, "start"), "AS": (12, "start"), "YE": (12, "end"), "Y": (12, "end"),
              "A": (12, "end")}
    if unit == "W":  # pandas: W is W-SUN
        weekday = _WEEKDAYS.get(suffix or "SUN")
        return (("week", weekday), n) if weekday is not None else None
    if unit in months:
        period, anchor = months[unit]
        if suffix and (period == 1 or suffix not in _MONTHS):
            return None
        # pandas' defaults: quarters and years end in December, start in January.
        month = _MONTHS[suffix] if suffix else (12 if anchor == "end" else 1)
        return ("months", period, anchor, month), n
    if suffix:
        return None
    if unit in fixed:
        return fixed[unit], n
    if unit == "B":
        return "B", n
    return None


def _next_anchor(moment: datetime, period: int, anchor: str, month: int, steps: int, *, first: bool) -> datetime:
    """The anchor (first or last day of a month whose number is ``month`` modulo ``period``)
    strictly after ``moment`` when ``first`` (then ``steps`` more periods), else ``moment``
    (an anchor) plus ``steps`` periods. The time of day is kept, as pandas keeps it."""
    index = moment.year * 12 + moment.month - 1
    if first:
        offset = (month - 1 - index) % period  # months to the next month of the cycle (0: this one)
        candidate = index + offset
        if offset == 0 and not (anchor == "end" and moment.day < _month_days(candidate)):
            candidate += period  # on or past this month's anchor: the next one
        if anchor == "start" and offset == 0:
            candidate = index + period  # the 1st of this month is never after a day of it
        index = candidate
    index += steps * period
    year, month0 = divmod(index, 12)
    day = 1 if anchor == "start" else calendar.monthrange(year, month0 + 1)[1]
    return moment.replace(year=year, month=month0 + 1, day=day)


def _month_days(index: int) -> int:
    year, month0 = divmod(index, 12)
    return calendar.monthrange(year, month0 + 1)[1]


def _format_like(moment: datetime, template: str, sub_daily: bool = False) -> str:
    if len(template) == 10 and not sub_daily:  # a date: YYYY-MM-DD, stepped by days or more
        return moment.date().isoformat()
    text = moment.isoformat(sep=" " if " " in template else "T")
    return text[:-6] + "Z" if template.endswith("Z") and text.endswith("+00:00") else text


def inspect_model(path: str | Path, expected_signature: dict | None = None) -> ModelInfo:
    """Check an ONNX file as a device would before serving it; VerificationError listing
    every problem: parse, external data, I/O contract, metadata, signature, ORT load.

    With the ``onnx`` package (the full install) the file is read with it; a light device
    install has no ``onnx``, so the same checks run on the protobuf wire format and on an
    ONNX Runtime session (:func:`_inspect_with_ort`)."""
    try:
        import onnx
    except ImportError:
        return _inspect_with_ort(Path(path), expected_signature)

    path = Path(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf decode errors have no common public type
        raise VerificationError(f"{path}: not a readable ONNX model ({type(exc).__name__})") from None
    problems = external_data_problems(proto, path.parent)
    found = signature(proto)
    problems += contract_problems(found)
    metadata = read_metadata(proto)
    problems += [f"metadata lacks onnxcast.{k}" for k in PREDICT_METADATA if k not in metadata]
    problems += quantile_problems(found, metadata)
    if expected_signature is not None and found != expected_signature:
        problems.append(f"I/O signature {found} differs from the manifest's {expected_signature}")
    if not problems:
        problems += _ort_load_problems(path)
    if problems:
        raise VerificationError(f"{path}: " + "; ".join(problems))
    return ModelInfo(found, opset_of(proto), metadata)


def external_data_problems(proto, folder: Path) -> list[str]:
    """Every tensor stored outside the file. Devices download one self-contained file, so
    each is a problem; those resolving outside ``folder`` are named as such."""
    import onnx

    problems = []
    root = folder.resolve()
    for tensor in _all_tensors(proto.graph, proto):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (root / location).resolve()
        where = "outside the model folder" if os.path.isabs(location) or not target.is_relative_to(root) \
            else "not in the manifest"
        problems.append(f"tensor {tensor.name!r} references external data {location!r} ({where})")
    return problems


# --- helpers ------------------------------------------------------------------------------

def _root_hint(envelope: object) -> int:
    """The root version an (as yet unverified) pointer names; 0 when it names none."""
    signed = envelope.get("signed") if isinstance(envelope, dict) else None
    hint = signed.get("root_version") if isinstance(signed, dict) else None
    return hint if isinstance(hint, int) and not isinstance(hint, bool) and hint > 0 else 0


def _pointer_fields(value: dict, where: str) -> dict:
    try:
        want = {k: value[k] for k in ("version", "artifact", "sha256", "length", "counter")}
        manifest = value["manifest"]
        want["manifest_sha256"], want["manifest_length"] = manifest["sha256"], manifest["length"]
        check_name("version", want["version"])
        check_name("artifact", want["artifact"])
        for name in ("length", "manifest_length"):
            if not isinstance(want[name], int) or isinstance(want[name], bool) or want[name] < 0:
                raise RefusedError(f"{name} is not a byte count")
    except (KeyError, TypeError, OnnxcastError) as exc:
        raise RefusedError(f"{where}: malformed channel pointer ({exc}); refusing it") from None
    return want


def _read_signed_length(store, key: str, length: int, sha256: str, what: str, version: str) -> bytes:
    """Download ``key``, never more than ``length`` + 1 bytes, and check it is exactly the
    signed length and digest."""
    where = store.url(key)
    data = store.read(key, length)
    if data is None:
        raise RefusedError(f"{where}: {what} missing; refusing version {version}")
    if len(data) > length:
        raise RefusedError(f"{where}: longer than its signed length of {length} bytes (stopped reading); "
                           f"refusing version {version}")
    if len(data) != length or sha256_bytes(data) != sha256:
        raise RefusedError(f"{where}: sha256 {sha256_bytes(data)[:12]} ({len(data)} bytes) does not match the signed "
                           f"{sha256[:12]} ({length} bytes); refusing version {version}")
    return data


def check_pointer(store, trust: DeviceTrust, model: str, channel: str, data: bytes) -> tuple[dict, dict]:
    """``(signed, wanted)``: the channel pointer ``data`` verified as a device does (the trust
    root it names first, then the pointer's signatures), and the fields it pins; RefusedError or
    VerificationError otherwise. The rollout page asks the same (onnxcast.airflow.plugin.data)."""
    where = store.url(store.channel_key(model, channel))
    envelope = _parse_metadata(data, where)
    # The root comes first: the pointer may be signed by keys of a newer root it names.
    trust.update_root(store, _root_hint(envelope))
    signed = trust.verify_pointer(envelope, model, channel, where)
    return signed, _pointer_fields(signed, where)


def check_manifest(store, trust: DeviceTrust, model: str, channel: str, want: dict) -> tuple[bytes, dict]:
    """``(bytes, manifest)``: the manifest a verified pointer pins, read within its signed length
    and digest, verified, and listing the pointer's artifact for ``channel`` with the same
    digest and size; RefusedError otherwise."""
    version, artifact = want["version"], want["artifact"]
    manifest_key = store.version_key(model, version)
    data = _read_signed_length(store, manifest_key, want["manifest_length"], want["manifest_sha256"],
                               "manifest", version)
    manifest = trust.verify_manifest(_parse_metadata(data, store.url(manifest_key)), model, version,
                                     store.url(manifest_key))
    entry = (manifest.get("artifacts") or {}).get(artifact) or {}
    choice = (manifest.get("channels") or {}).get(channel)
    if not isinstance(choice, dict) or choice.get("artifact") != artifact \
            or entry.get("sha256") != want["sha256"] or entry.get("size_bytes") != want["length"]:
        raise RefusedError(f"{store.url(manifest_key)}: does not list {artifact} with the pointer's sha256 and "
                           f"length for channel {channel!r}; refusing version {version}")
    return data, manifest


def _download(store, trust: DeviceTrust, model: str, channel: str, want: dict, staging: Path,
              staging_fd: int, device: tuple[Preference, DeviceFacts] | None) -> dict:
    """Fetch and check the manifest and the artifact of the device's target (None: the pointer's
    own) into ``staging`` (open as ``staging_fd``); returns what pulled.json records."""
    version = want["version"]
    data, manifest = check_manifest(store, trust, model, channel, want)
    manifest_url = store.url(store.version_key(model, version))
    if device is None:
        name, record = want["artifact"], CHANNEL_ARTIFACT_RECORD
    else:
        choice = choose(manifest, channel, device[0], manifest_url)
        name, record = choice.artifact, choice.record(*device)
    artifact, sha, length, entry = _signed_artifact(manifest, name, manifest_url, version)
    blob = _read_signed_length(store, store.version_key(model, version, artifact), length, sha, "artifact", version)
    write_new(staging_fd, MANIFEST, data)
    write_new(staging_fd, artifact, blob)
    if artifact.endswith(".onnx"):  # a compiled library (tvm-aarch64) is checked by its signed digest only
        inspect_model(staging / artifact, expected_signature=entry.get("signature"))
    pulled = {"model": model, "channel": channel, "store": store.uri, **want,
              "artifact": artifact, "sha256": sha, "length": length,
              "channel_artifact": want["artifact"], "channel_sha256": want["sha256"],
              "target": record,
              "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_new(staging_fd, PULLED, (json.dumps(pulled, indent=2) + "\n").encode())
    return pulled


def _signed_artifact(manifest: dict, name: str, where: str, version: str) -> tuple[str, str, int, dict]:
    """``(name, sha256, length, entry)`` of an artifact the verified manifest lists."""
    entry = (manifest.get("artifacts") or {}).get(name)
    sha = entry.get("sha256") if isinstance(entry, dict) else None
    length = entry.get("size_bytes") if isinstance(entry, dict) else None
    if not isinstance(sha, str) or not isinstance(length, int) or isinstance(length, bool) or length < 0:
        raise RefusedError(f"{where}: names artifact {name!r} for its target without a signed sha256 and size; "
                           f"refusing version {version}")
    return check_name("artifact", name), sha, length, entry


def _install(folder: DeviceFolder, staging: str, version: str) -> Path:
    """Move the ``staging`` folder to ``versions/<version>``, then swap the symlinks; keep the
    previous version and remove older ones. Every step goes by descriptor: a symlinked
    ``versions/`` is refused, and only entries of the real ``versions/`` are removed."""
    with folder.folder(VERSIONS, create=True) as versions:
        old = folder.link_target(CURRENT)
        target = version
        if _exists(versions, target):
            if target == old:  # the same version re-pulled over a corrupt copy: never swap out what serves
                target = f"{version}.{uuid.uuid4().hex[:8]}"
            else:
                folder.remove(versions, target)
        os.rename(staging, target, src_dir_fd=folder.fd, dst_dir_fd=versions)
        if old is not None and old != target:
            _swap_link(folder, PREVIOUS, f"{VERSIONS}/{old}")
        _swap_link(folder, CURRENT, f"{VERSIONS}/{target}")
        keep = {target, old, folder.link_target(PREVIOUS)}
        for entry in os.listdir(versions):
            if entry not in keep:
                try:
                    folder.remove(versions, entry)
                except OSError as exc:  # the new version already serves: a leftover is only disk space
                    log.warning("%s: cannot remove old version %s (%s)", folder.path / VERSIONS, entry, exc.strerror)
        os.fsync(versions)
    return folder.path / VERSIONS / target


def _exists(folder: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _swap_link(folder: DeviceFolder, name: str, target: str) -> None:
    tmp = f".{name}.{uuid.uuid4().hex}"
    os.symlink(target, tmp, dir_fd=folder.fd)
    try:
        os.replace(tmp, name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)  # atomic: old link or new one
    except OSError as exc:
        os.unlink(tmp, dir_fd=folder.fd)
        raise DeviceFolderError(f"{folder.path / name}: cannot replace it with a link ({exc.strerror}); "
                                "a device folder's current/previous are symlinks: remove it") from None


def _prefixed(metadata: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix(METADATA_PREFIX): v for k, v in metadata.items() if k.startswith(METADATA_PREFIX)}


_ORT_TYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
              "tensor(bfloat16)": "bfloat16", "tensor(int64)": "int64", "tensor(int32)": "int32",
              "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(bool)": "bool", "tensor(string)": "object"}


def _inspect_with_ort(path: Path, expected_signature: dict | None) -> ModelInfo:
    """inspect_model without the ``onnx`` package: external data and opset from the
    protobuf wire format (checked before ONNX Runtime opens the file), then the I/O
    signature and metadata from an ORT session."""
    import onnxruntime as ort

    try:
        scan = scan_model_bytes(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise VerificationError(f"{path}: not a readable ONNX model ({type(exc).__name__})") from None
    root = path.parent.resolve()
    problems = []
    for name, location in scan["external"]:
        target = (root / location).resolve()
        where = "outside the model folder" if os.path.isabs(location) or not target.is_relative_to(root) \
            else "not in the manifest"
        problems.append(f"tensor {name!r} references external data {location!r} ({where})")
    if problems:
        raise VerificationError(f"{path}: " + "; ".join(problems))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
        raise VerificationError(f"{path}: onnxruntime {ort.__version__} cannot load it: "
                                f"{str(exc).splitlines()[0]}") from None

    found = ort_signature(session)
    problems = contract_problems(found)
    metadata = _prefixed(session.get_modelmeta().custom_metadata_map)
    problems += [f"metadata lacks onnxcast.{k}" for k in PREDICT_METADATA if k not in metadata]
    problems += quantile_problems(found, metadata)
    if expected_signature is not None and found != expected_signature:
        problems.append(f"I/O signature {found} differs from the manifest's {expected_signature}")
    if problems:
        raise VerificationError(f"{path}: " + "; ".join(problems))
    return ModelInfo(found, scan["opset"], metadata)


def ort_signature(session) -> dict:
    """:func:`onnxcast.base.contract.signature` of an ORT session (no ``onnx`` package needed)."""

    def describe(values) -> list[dict]:
        return [{"name": v.name, "dtype": _ORT_TYPES.get(v.type, v.type),
                 "shape": [d if isinstance(d, int) or d is None else str(d) for d in v.shape]} for v in values]

    return {"inputs": describe(session.get_inputs()), "outputs": describe(session.get_outputs())}


def scan_model_bytes(data: bytes) -> dict:
    """``{"opset": default-domain opset, "external": [(tensor name, location)]}`` read from
    ONNX ModelProto bytes on the protobuf wire format: every tensor of the graph, its
    subgraphs, sparse initializers and model-local functions. ValueError if malformed."""
    scan = _WireScan()
    scan.model(data)
    return {"opset": scan.opset, "external": scan.external}


# Field numbers from onnx.proto: which fields of which message hold what.
_MODEL_GRAPH, _MODEL_OPSET, _MODEL_FUNCTIONS = 7, 8, 25
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_SPARSE = 1, 5, 15
_NODE_ATTRIBUTE, _FUNCTION_NODE = 5, 7
_ATTR_TENSORS, _ATTR_GRAPHS, _ATTR_SPARSES = (5, 10), (6, 11), (22, 23)  # one, and the repeated field
_TENSOR_NAME, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 8, 13, 14
_SPARSE_TENSORS = (1, 2)  # values, indices
_WIRE_VARINT, _WIRE_BYTES = 0, 2


class _WireScan:
    """One walk over a ModelProto's bytes, collecting its opset and external tensors."""

    def __init__(self) -> None:
        self.external: list[tuple[str, str]] = []
        self.opset = 0

    def model(self, buf: bytes) -> None:
        for field, wire, value in _fields(buf):
            if wire != _WIRE_BYTES:
                continue
            if field == _MODEL_GRAPH:
                self.graph(value)
            elif field == _MODEL_OPSET:
                entry = {f: v for f, _, v in _fields(value)}
                if entry.get(1, b"") in (b"", b"ai.onnx") and isinstance(entry.get(2), int):
                    self.opset = entry[2]
            elif field == _MODEL_FUNCTIONS:
                for f, w, v in _fields(value):
                    if f == _FUNCTION_NODE and w == _WIRE_BYTES:
                        self.node(v)

    def graph(self, buf: bytes) -> None:
        for field, wire, value in _fields(buf):
            if wire != _WIRE_BYTES:
                continue
            if field == _GRAPH_NODE:
                self.node(value)
            elif field == _GRAPH_INITIALIZER:
                self.tensor(value)
            elif field == _GRAPH_SPARSE:
                self.sparse(value)

    def node(self, buf: bytes) -> None:
        for field, wire, value in _fields(buf):
            if field == _NODE_ATTRIBUTE and wire == _WIRE_BYTES:
                self.attribute(value)

    def attribute(self, buf: bytes) -> None:
        for field, wire, value in _fields(buf):
            if wire != _WIRE_BYTES:
                continue
            if field in _ATTR_TENSORS:
                self.tensor(value)
            elif field in _ATTR_GRAPHS:
                self.graph(value)
            elif field in _ATTR_SPARSES:
                self.sparse(value)

    def sparse(self, buf: bytes) -> None:
        for field, wire, value in _fields(buf):
            if field in _SPARSE_TENSORS and wire == _WIRE_BYTES:
                self.tensor(value)

    def tensor(self, buf: bytes) -> None:
        name, location, is_external = "", "", False
        for field, wire, value in _fields(buf):
            if field == _TENSOR_NAME and wire == _WIRE_BYTES:
                name = value.decode(errors="replace")
            elif field == _TENSOR_DATA_LOCATION and wire == _WIRE_VARINT and value == 1:  # EXTERNAL
                is_external = True
            elif field == _TENSOR_EXTERNAL_DATA and wire == _WIRE_BYTES:
                entry = {f: v for f, w, v in _fields(value) if w == _WIRE_BYTES}
                if entry.get(1) == b"location":
                    location = entry.get(2, b"").decode(errors="replace")
        if is_external or location:
            self.external.append((name, location))


def _fields(buf: bytes):
    """(field number, wire type, value) of each field of one protobuf message: varints as
    int, length-delimited fields as bytes; fixed-width fields skipped. ValueError when the
    bytes are not a protobuf message."""
    i, end = 0, len(buf)

    def varint() -> int:
        nonlocal i
        result = shift = 0
        while True:
            if i >= end or shift > 63:
                raise ValueError("truncated varint")
            byte = buf[i]
            i += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    while i < end:
        key = varint()
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire == 0:
            yield field, wire, varint()
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            size = varint()
            if i + size > end:
                raise ValueError("truncated field")
            yield field, wire, buf[i:i + size]
            i += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if i > end:
            raise ValueError("truncated field")


def _ort_load_problems(path: Path) -> list[str]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
        return [f"onnxruntime {ort.__version__} cannot load it: {str(exc).splitlines()[0]}"]
    return []


def _all_tensors(graph, model=None):
    """Every TensorProto in ``graph``: initializers, sparse initializers, node attributes,
    and the same in subgraphs and (for the top graph) model-local functions."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    nodes = list(graph.node) + ([n for f in model.functions for n in f.node] if model is not None else [])
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)
