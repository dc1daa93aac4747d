"""Fetch an existing model into a run directory instead of training one.

Sources:

- ``models:/<name>@<alias>`` or ``models:/<name>/<version>``: a version registered by
  onnxcast.registry.tracking (its files hold ``model.pt`` and ``model.json``);
- ``s3://bucket/prefix/`` (or a local folder): ``model.pt`` (a state dict) and
  ``model.json`` (``{"spec": ModelSpec}``) under the prefix.

Weights are loaded with ``torch.load(..., weights_only=True)`` and checked against the
spec before anything is written; the result is ``models/<family>/model.pt`` and
``model.json`` in the run directory, exactly what train_family would have written.
"""

from __future__ import annotations

import io
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxcast.base.contract import format_quantile_levels, parse_quantile_levels
from onnxcast.base.errors import OnnxcastError, VerificationError
from onnxcast.base.files import replacing, sha256_file, write_json
from onnxcast.base.s3 import ReadWords, S3Settings, get_object_bytes, split_s3_uri
from onnxcast.base.untrusted import (
    MAX_METADATA_BYTES,
    MAX_REPORT_BYTES,
    UntrustedInputError,
    loads_json,
    quote,
    read_regular_file,
)
from onnxcast.pipeline.config import (
    MAX_MODEL_PARAMETERS,
    MODEL_FAMILIES,
    RANGES,
    PipelineConfig,
    estimate_model_size,
)
from onnxcast.pipeline.layout import RunLayout
from onnxcast.registry.plan import write_plan
from onnxcast.registry.tracking import TrackingError, download_version_files, resolve_version
from onnxcast.rollout.store import check_name

log = logging.getLogger(__name__)

MODEL_FILE = "model.pt"
SPEC_FILE = "model.json"
# model.pt of the largest model the settings allow (50 M float32 parameters) is 200 MB
MAX_WEIGHTS_BYTES = 1024**3
# The fields of a ModelSpec in model.json: (type, low, high). Sizes share the pipeline's
# ranges (onnxcast.pipeline.config.RANGES), so a fetched model is never larger than a trained one.
_SPEC_INTS = ("n_features", "horizon", "lookback", "hidden_size", "num_layers", "d_model", "n_heads", "season")
MAX_FEATURES = 1024
MAX_SEASONS = 8
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?$")


class FetchError(OnnxcastError):
    """The source names no model, or what it holds is not an onnxcast model."""


@dataclass(frozen=True)
class FetchedModel:
    family: str
    spec: dict
    source: dict  # {"uri", "resolved", ...}: what was asked for and what it resolved to


def parse_source(uri: str) -> dict:
    """``{"kind": "mlflow"|"s3"|"local", ...}`` for a fetch source; FetchError if unusable."""
    uri = (uri or "").strip()
    if uri.startswith("models:/"):
        match = _MODELS_URI.match(uri)
        if not match:
            raise FetchError(f"fetch source {uri!r}: expected models:/<name>@<alias> or models:/<name>/<version>")
        return {"kind": "mlflow", "uri": uri, **{k: v for k, v in match.groupdict().items() if v}}
    if uri.startswith("s3://"):
        return {"kind": "s3", "uri": uri}
    if uri and "://" not in uri:
        return {"kind": "local", "uri": uri}
    raise FetchError(f"fetch source {uri!r}: expected models:/..., s3://bucket/prefix/ or a folder")


def read_source_spec(uri: str, *, tracking_uri: str | None = None, s3_settings: S3Settings | None = None) -> dict:
    """The ModelSpec dict of the model at ``uri`` without loading its weights."""
    source = parse_source(uri)
    if source["kind"] == "mlflow":
        version = _resolve(source, tracking_uri)
        family = version.tags.get("onnxcast.family")
        with tempfile.TemporaryDirectory() as tmp:
            files = _download_mlflow(source["name"], str(version.version), Path(tmp), tracking_uri)
            spec = _read_spec(files[SPEC_FILE], f"{uri} (version {version.version})")
        if family and family != spec["family"]:
            log.warning("%s: tag onnxcast.family=%s but model.json says %s", uri, family, spec["family"])
        return spec
    return _read_spec(_read_bytes(source, SPEC_FILE, s3_settings), uri)


def fetch_model(uri: str, family_dir: str | Path, *, tracking_uri: str | None = None,
                s3_settings: S3Settings | None = None, expect: dict | None = None) -> FetchedModel:
    """Fetch the model at ``uri`` into ``family_dir`` (model.pt + model.json).

    ``expect`` maps ModelSpec fields to required values (e.g. ``{"horizon": 24}``): a model
    that forecasts another horizon or reads other features cannot be evaluated on this run.
    """
    import torch

    from onnxcast.pipeline.models import ModelSpec, build_model

    source = parse_source(uri)
    resolved: dict[str, Any] = {"uri": uri}
    if source["kind"] == "mlflow":
        version = _resolve(source, tracking_uri)
        resolved.update(model=source["name"], version=str(version.version), run_id=version.run_id)
        with tempfile.TemporaryDirectory() as staging:
            files = _download_mlflow(source["name"], str(version.version), Path(staging), tracking_uri)
            weights = _read_file(files[MODEL_FILE], MAX_WEIGHTS_BYTES)
            spec_bytes = _read_file(files[SPEC_FILE], MAX_METADATA_BYTES)
    else:
        weights = _read_bytes(source, MODEL_FILE, s3_settings)
        spec_bytes = _read_bytes(source, SPEC_FILE, s3_settings)
    where = f"{uri} ({MODEL_FILE})"
    original = _load_spec_json(spec_bytes, uri)
    spec = ModelSpec(**_check_spec(original, uri))
    mismatched = {k: (getattr(spec, k), v) for k, v in (expect or {}).items() if getattr(spec, k) != v}
    if mismatched:
        detail = ", ".join(f"{k} is {got}, this run needs {want}" for k, (got, want) in mismatched.items())
        raise FetchError(f"{uri}: the model does not fit this run: {detail}")
    try:
        state = torch.load(io.BytesIO(weights), weights_only=True, map_location="cpu")
    except Exception as exc:  # pickle/zip errors and the weights-only unpickler's refusal
        raise FetchError(f"{where}: not a state dict loadable with weights_only=True ({str(exc).splitlines()[0]})") from None
    model = build_model(spec)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise FetchError(f"{where}: weights do not match the spec in {SPEC_FILE} ({str(exc).splitlines()[0][:300]})") from None

    family_dir = Path(family_dir)
    family_dir.mkdir(parents=True, exist_ok=True)
    with replacing(family_dir / MODEL_FILE) as tmp:
        torch.save(model.state_dict(), tmp)

    fetched_from = original.get("source", "unknown")
    record = {"spec": spec.to_dict(), "source": {"kind": source["kind"], **resolved},
              "fetched_from": fetched_from if isinstance(fetched_from, str | dict) else "unknown"}
    for key in ("training", "ensemble"):  # how it was made; an ensemble's members and weights
        if isinstance(original.get(key), dict):
            record[key] = original[key]
    write_json(family_dir / SPEC_FILE, record)
    log.info("fetched %s model from %s into %s", spec.family, uri, family_dir)
    return FetchedModel(spec.family, spec.to_dict(), record["source"])


# --- helpers ------------------------------------------------------------------------------

def _resolve(source: dict, tracking_uri: str | None):
    try:
        return resolve_version(source["name"], source.get("version") or source["alias"], tracking_uri)
    except TrackingError as exc:
        raise FetchError(f"fetch source {source['uri']}: {exc}") from None


def _download_mlflow(name: str, version: str, dest: Path, tracking_uri: str | None) -> dict[str, Path]:
    from mlflow.exceptions import MlflowException

    try:
        folder = download_version_files(name, version, dest, tracking_uri)
    except MlflowException as exc:
        raise FetchError(f"models:/{name}/{version}: cannot download its files ({exc.error_code})") from None
    found = {}
    for wanted in (MODEL_FILE, SPEC_FILE):
        matches = sorted(folder.rglob(wanted))
        if not matches:
            raise FetchError(f"models:/{name}/{version}: holds no {wanted}; was it registered by onnxcast?")
        found[wanted] = matches[0]
    return found


def _read_bytes(source: dict, name: str, s3_settings: S3Settings | None) -> bytes:
    uri = source["uri"]
    limit = MAX_WEIGHTS_BYTES if name == MODEL_FILE else MAX_METADATA_BYTES
    if source["kind"] == "local":
        path = Path(uri) / name
        if not path.exists():
            raise FetchError(f"{path}: not found (a fetch folder holds {MODEL_FILE} and {SPEC_FILE})")
        return _read_file(path, limit)
    bucket, prefix = split_s3_uri(uri if uri.endswith("/") else uri + "/")
    words = ReadWords(too_large=f"{{uri}}: {{size:,}} bytes, over the limit of {{limit:,}} for {name}",
                      over=f"{{uri}}: over the limit of {{limit:,}} bytes for {name}",
                      failed="{uri}: cannot read ({code})",
                      missing=f"{{uri}}: not found ({{code}}); a fetch prefix holds {MODEL_FILE} and {SPEC_FILE}")
    return get_object_bytes(f"s3://{bucket}/{prefix}{name}", limit, s3_settings, error=FetchError, words=words)


def _read_file(path: Path, limit: int) -> bytes:
    """A regular file of at most ``limit`` bytes (never a FIFO or a device); FetchError if not."""
    try:
        return read_regular_file(path, what="fetched file", limit=limit)
    except UntrustedInputError as error:
        raise FetchError(str(error)) from None


def _read_spec(data: bytes | Path, where: str) -> dict:
    """The checked ModelSpec fields of a model.json (its bytes or its path)."""
    if isinstance(data, Path):
        data = _read_file(data, MAX_METADATA_BYTES)
    return _check_spec(_load_spec_json(data, where), where)


def _load_spec_json(data: bytes, where: str) -> dict:
    """model.json parsed with bounded size and depth: a dict with a 'spec' object."""
    try:
        document = loads_json(data, what=f"{where}: {SPEC_FILE}")
    except UntrustedInputError as error:
        raise FetchError(str(error)) from None
    if not isinstance(document, dict) or not isinstance(document.get("spec"), dict):
        raise FetchError(f"{where}: {SPEC_FILE} is not a JSON object with a 'spec' object")
    return document


def _check_spec(document: dict, where: str) -> dict:
    """The 'spec' of model.json checked field by field: FetchError naming the first bad field.

    A fetched model.json is input: an unknown family raised ValueError, a string lookback
    TypeError, a negative one a torch error, a huge hidden_size an allocation failure."""
    from onnxcast.pipeline.models import ModelSpec

    spec = document["spec"]
    prefix = f"{where}: {SPEC_FILE} spec"
    known = {f for f in ModelSpec.__dataclass_fields__}
    _check_spec_names(spec, prefix, known)
    _check_spec_values(spec, prefix)
    checked = {**{f: ModelSpec.__dataclass_fields__[f].default for f in known if f != "family"
                  and f not in ("n_features", "horizon", "lookback")}, **spec}
    _check_spec_architecture(checked, prefix)
    members = _check_ensemble(spec, prefix, where)
    return {**spec, "seasons": list(checked["seasons"]), **({"members": members} if members else {})}


def _check_ensemble(spec: dict, prefix: str, where: str) -> list[dict]:
    """An ensemble's members (each a spec checked as any, of another family, with the ensemble's
    features, horizon and lookback) and weights (none: the median; else one a member, >= 0, sum 1);
    no members nor weights for another family. Returns the checked members."""
    members, weights = spec.get("members", []), spec.get("weights", [])
    if not isinstance(members, list | tuple) or not isinstance(weights, list | tuple):
        raise FetchError(f"{prefix} fields 'members' and 'weights' must be lists")
    if spec["family"] != "ensemble":
        if members or weights:
            raise FetchError(f"{prefix} has 'members' or 'weights', which only an ensemble has")
        return []
    if not (2 if not weights else 1) <= len(members) <= len(MODEL_FAMILIES):
        raise FetchError(f"{prefix} field 'members' must hold 2 to {len(MODEL_FAMILIES)} specs (1 with weights), "
                         f"got {len(members)}")
    checked = []
    for i, member in enumerate(members):
        if not isinstance(member, dict):
            raise FetchError(f"{prefix} field 'members' item {i} is not an object")
        member = _check_spec({"spec": member}, f"{where} member {i}")
        if member["family"] == "ensemble" or any(member[k] != spec[k] for k in ("n_features", "horizon", "lookback")):
            raise FetchError(f"{prefix} member {i} ({member['family']}) must be another family with the ensemble's "
                             "n_features, horizon and lookback")
        checked.append(member)
    if weights and (len(weights) != len(members) or not all(
            isinstance(w, int | float) and not isinstance(w, bool) and 0 <= w <= 1 for w in weights)
            or abs(sum(weights) - 1.0) > 1e-3):
        raise FetchError(f"{prefix} field 'weights' must be one number in [0, 1] a member, summing to 1, got "
                         f"{quote(weights)}")
    return checked


def _check_spec_names(spec: dict, prefix: str, known: set[str]) -> None:
    """Only ModelSpec's fields, the required ones present, a family onnxcast trains."""
    unknown = sorted(str(k) for k in spec if k not in known)
    if unknown:
        raise FetchError(f"{prefix} has unknown field(s) {', '.join(quote(k) for k in unknown[:5])}")
    for name in ("family", "n_features", "horizon", "lookback"):
        if name not in spec:
            raise FetchError(f"{prefix} has no {name!r}")
    family = spec["family"]
    if not isinstance(family, str) or family not in MODEL_FAMILIES:
        raise FetchError(f"{prefix} field 'family' is {quote(family)}, expected one of {list(MODEL_FAMILIES)}")


def _check_spec_values(spec: dict, prefix: str) -> None:
    """Each field given on its own: integers in their ranges, a boolean, a count, quantile levels."""
    for name in _SPEC_INTS:
        if name not in spec:
            continue  # a default of ModelSpec
        value = spec[name]
        low, high = (1, MAX_FEATURES) if name == "n_features" else RANGES[name][1:3]
        if isinstance(value, bool) or not isinstance(value, int):
            raise FetchError(f"{prefix} field {name!r} must be an integer, got {quote(value)}")
        if not low <= value <= high:
            raise FetchError(f"{prefix} field {name!r} must be in [{low}, {high}], got {value}")
    for name in ("global_model", "nonnegative"):
        if name in spec and not isinstance(spec[name], bool):
            raise FetchError(f"{prefix} field {name!r} must be true or false, got {quote(spec[name])}")
    from onnxcast.pipeline.models import NORMALISATIONS

    if "normalisation" in spec and spec["normalisation"] not in NORMALISATIONS:
        raise FetchError(f"{prefix} field 'normalisation' must be one of {list(NORMALISATIONS)}, "
                         f"got {quote(spec['normalisation'])}")
    n_series = spec.get("n_series", 0)
    if isinstance(n_series, bool) or not isinstance(n_series, int) or n_series < 0:
        raise FetchError(f"{prefix} field 'n_series' must be a non-negative integer, got {quote(n_series)}")
    levels = spec.get("quantile_levels", [])
    if not isinstance(levels, list | tuple) or not all(isinstance(q, int | float) and not isinstance(q, bool)
                                                      for q in levels):
        raise FetchError(f"{prefix} field 'quantile_levels' must be a list of numbers, got {quote(levels)}")
    if levels:
        try:
            parse_quantile_levels(format_quantile_levels(levels), f"{prefix} field 'quantile_levels'")
        except ValueError as exc:
            raise FetchError(str(exc)) from None


def _check_spec_architecture(checked: dict, prefix: str) -> None:
    """The fields together (``checked``: the spec over ModelSpec's defaults): seasons, patch and
    heads that fit the lookback and width, and a model under MAX_MODEL_PARAMETERS."""
    family, seasons = checked["family"], checked["seasons"]
    low, high = RANGES["season"][1:3]
    if not isinstance(seasons, list | tuple) or len(seasons) > MAX_SEASONS or not all(
            isinstance(s, int) and not isinstance(s, bool) and low <= s <= high for s in seasons):
        raise FetchError(f"{prefix} field 'seasons' must be a list of at most {MAX_SEASONS} integers in "
                         f"[{low}, {high}], got {quote(seasons)}")
    patch = checked["patch"]
    if isinstance(patch, bool) or not isinstance(patch, int) or not 1 <= patch <= checked["lookback"]:
        raise FetchError(f"{prefix} field 'patch' must be an integer in [1, {checked['lookback']}] (the lookback), "
                         f"got {quote(patch)}")
    if checked["d_model"] % checked["n_heads"]:
        raise FetchError(f"{prefix} field 'd_model' ({checked['d_model']}) is not divisible by "
                         f"'n_heads' ({checked['n_heads']})")
    too_long = [s for s in (checked["season"], *seasons) if s > checked["lookback"]]
    if family in ("nhits", "dlinear", "base") and too_long:
        raise FetchError(f"{prefix} field 'seasons' holds {too_long[0]}, longer than 'lookback' {checked['lookback']}")
    parameters, _ = estimate_model_size(family, _SpecSizes(checked))
    if parameters > MAX_MODEL_PARAMETERS:
        raise FetchError(f"{prefix} describes a {family} model of about {parameters:,} parameters, over the "
                         f"limit of {MAX_MODEL_PARAMETERS:,}")


class _SpecSizes:
    """A spec's sizes as onnxcast.pipeline.config.estimate_model_size reads them from a config."""

    def __init__(self, spec: dict):
        self.n_features = spec["n_features"]
        for name in ("hidden_size", "num_layers", "d_model", "n_heads", "horizon", "lookback"):
            setattr(self, name, spec[name])
        self.patch_length = spec["patch"]  # the spec's steps a token (1 for models from before patches)
        self.batch_size = 1


# --- a registered version as a run directory (promotion with re-checked gates) -------------

def stage_version(model_name: str, ref: str, run_dir: str | Path, *, tracking_uri: str | None = None,
                  s3_settings: S3Settings | None = None) -> dict:
    """Lay out registered version ``ref`` (number or alias) of ``model_name`` in ``run_dir`` as
    the run that produced it: its data window again (the report's settings, trained_until
    included; read from S3 with ``s3_settings``), model.pt/model.json, every ONNX variant
    checked against the report's sha256. Validation then re-checks the gates on this run
    directory before promotion."""
    from onnxcast.pipeline.run import prepare_data

    source = parse_source(f"models:/{model_name}/{ref}" if str(ref).isdigit() else f"models:/{model_name}@{ref}")
    version = _resolve(source, tracking_uri)
    number = str(version.version)
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    with tempfile.TemporaryDirectory() as tmp:
        folder = download_version_files(model_name, number, Path(tmp), tracking_uri)
        reports = sorted(folder.rglob("report.json"))
        if not reports:
            raise FetchError(f"models:/{model_name}/{number}: holds no report.json; was it registered by onnxcast?")
        try:
            report = loads_json(read_regular_file(reports[0], what="report.json", limit=MAX_REPORT_BYTES),
                                what=f"models:/{model_name}/{number} report.json", limit=MAX_REPORT_BYTES)
        except UntrustedInputError as error:
            raise FetchError(str(error)) from None
        family = report["selected"]["edge"]["family"]
        entry = next(m for m in report["models"] if m["family"] == family)
        # Every path the report names is checked before anything is written: a registered
        # report is input, and an absolute or ../ onnx_path would write wherever we can.
        family_dir = confined_path(run_dir, str(layout.family(check_name("family", str(family))).relative_to(run_dir)),
                                   f"models:/{model_name}/{number}")
        targets = [confined_path(run_dir, str(v.get("onnx_path", "")), f"models:/{model_name}/{number}")
                   for v in entry["variants"]]
        cfg = PipelineConfig.from_dict({**report["config"], "out_dir": str(run_dir)})
        run_dir.mkdir(parents=True, exist_ok=True)
        summary = prepare_data(cfg, s3_settings=s3_settings)
        if summary["dataset"]["sha256"] != report["dataset"]["sha256"]:
            raise VerificationError(f"{cfg.data_uri}: data up to {cfg.trained_until} now has sha256 "
                                    f"{summary['dataset']['sha256'][:12]}, version {number} was validated on "
                                    f"{report['dataset']['sha256'][:12]}: the data changed")
        (family_dir / "onnx").mkdir(parents=True, exist_ok=True)
        for name in (MODEL_FILE, SPEC_FILE):
            (family_dir / name).write_bytes(_one(folder, name, model_name, number).read_bytes())
        variants = []
        for variant, target in zip(entry["variants"], targets, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(_one(folder, Path(variant["onnx_path"]).name, model_name, number).read_bytes())
            if sha256_file(target) != variant["sha256"]:
                raise VerificationError(f"models:/{model_name}/{number}: {target.name} differs from the sha256 "
                                        "its report records")
            variants.append({"name": variant["name"], "path": target.name, "note": variant.get("note", "")})
    write_json(layout.variants(family), variants)
    write_plan(run_dir, [{"family": family, "source": f"models:/{model_name}/{number}", "role": "challenger",
                          "version": number}])
    staged = {"version": number, "family": family, "source": source["uri"],
              "mlflow": {**(report.get("mlflow") or {}), "model": model_name, "version": number,
                         "run_id": version.run_id}}
    write_json(layout.staged, staged)
    return staged


def confined_path(run_dir: Path, relative: str, where: str) -> Path:
    """``run_dir / relative`` resolved (symlinks included), if it stays inside ``run_dir``;
    FetchError naming the path otherwise (absolute, ``..``, empty, or through a symlink)."""
    root = Path(run_dir).resolve()
    if not relative or Path(relative).is_absolute() or "\x00" in relative:
        raise FetchError(f"{where}: report path {relative!r} is not a relative path inside the run directory")
    target = (root / relative).resolve()
    if target == root or not target.is_relative_to(root):
        raise FetchError(f"{where}: report path {relative!r} points outside the run directory {root}")
    return target


def _one(folder: Path, name: str, model_name: str, version: str) -> Path:
    matches = sorted(folder.rglob(name))
    if not matches:
        raise FetchError(f"models:/{model_name}/{version}: holds no {name}")
    return matches[0]
