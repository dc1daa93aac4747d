"""Which deployment target a device runs, and which of a version's artifacts that means.

A signed manifest (onnxcast.rollout.promote) lists per channel the targets its model was
validated on (``channels[channel]["targets"][TARGET] = {"artifact", "family", "variant"}``) and
per artifact the evidence (``artifacts[name]["targets"][TARGET] = {"status", "evidence"}``). A
manifest written before targets has neither: its channel artifact counts as validated for
``x86_64`` only (the machine that trained and validated it).

The device resolves its own target from facts it reads itself (:func:`read_facts`: the
machine, the CPU flags of /proc/cpuinfo, the runtimes importable, ONNX Runtime's providers)
by one rule (:func:`preference`, docs/targets.md "The device's target"):

1. ``--target NAME`` or ``ONNXCAST_EDGE_TARGET``: that target only (declared, and for this
   machine's architecture), or a refusal;
2. else, in order: ``tensorrt`` / ``cuda`` where ONNX Runtime has that provider; ``openvino``
   on x86-64 where ``openvino`` is importable and the CPU has SSE4.2 (its CPU plugin's floor);
   ``tvm-aarch64`` on aarch64 where ``tvm`` is importable; last the machine's ONNX Runtime
   class, ``x86_64`` or ``aarch64``.

:func:`choose` takes the first of these the channel lists as validated; else the family's
portable ``fp32`` variant where the manifest records it validated for the class; else it
refuses (RefusedError, one line: nothing is installed, the old model keeps serving).

Standard library only, and no ``onnxcast.targets`` (a device does not install it):
:data:`DEVICE_TARGETS` repeats what a device needs of ``onnxcast.targets.declarations``, and
tests/onnxcast/rollout/test_device_target.py checks the two agree.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from dataclasses import dataclass

from onnxcast.base import environment
from onnxcast.base.errors import ConfigError, RefusedError

ONNXRUNTIME, OPENVINO, TVM = "onnxruntime", "openvino", "tvm"
VALIDATED = "validated"
PORTABLE_VARIANT = "fp32"
# the CPU flags the rule or the record reads (x86 "flags", Arm "Features")
FLAGS_OF_INTEREST = ("sse4_2", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "asimd", "fphp",
                     "asimddp", "sve")
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


@dataclass(frozen=True)
class DeviceTarget:
    """What a device needs to know of a declared target (onnxcast.targets.declarations)."""

    name: str
    runtime: str                  # the Python module that runs it: onnxruntime, openvino, tvm
    architecture: str             # x86_64, aarch64
    requirements: tuple[str, ...]  # pinned, as the declaration's device_install
    provider: str | None = None   # ONNX Runtime's execution provider (None: CPU)
    extra: str | None = None      # the onnxcast-edge extra that installs the runtime (none for the GPU
                                  # targets: onnxruntime-gpu replaces the onnxruntime dependency)


_NUMPY, _ORT, _ORT_GPU = "numpy==2.4.6", "onnxruntime==1.32.0", "onnxruntime-gpu==1.31.1"
DEVICE_TARGETS: dict[str, DeviceTarget] = {t.name: t for t in (
    DeviceTarget("x86_64", ONNXRUNTIME, "x86_64", (_ORT, _NUMPY)),
    DeviceTarget("aarch64", ONNXRUNTIME, "aarch64", (_ORT, _NUMPY)),
    DeviceTarget("openvino", OPENVINO, "x86_64", ("openvino==2026.4.1", _NUMPY), extra="openvino"),
    DeviceTarget("tvm-aarch64", TVM, "aarch64", ("apache-tvm==0.27.0.post1", _NUMPY), extra="tvm"),
    DeviceTarget("cuda", ONNXRUNTIME, "x86_64", (_ORT_GPU, _NUMPY), provider="CUDAExecutionProvider"),
    DeviceTarget("tensorrt", ONNXRUNTIME, "x86_64", (_ORT_GPU, "tensorrt-cu12==10.16.1.11", _NUMPY),
                 provider="TensorrtExecutionProvider"),
)}
# the ONNX Runtime CPU target of each architecture: the class a device falls back to
ORT_CLASS = {"x86_64": "x86_64", "aarch64": "aarch64"}
# a manifest without targets: its channel artifact was validated on the x86-64 machine that made it
LEGACY_TARGET = "x86_64"


@dataclass(frozen=True)
class DeviceFacts:
    """What the device read about itself."""

    machine: str                   # platform.machine(), normalised (amd64 -> x86_64, arm64 -> aarch64)
    cpu_flags: tuple[str, ...]     # those of FLAGS_OF_INTEREST the CPU has
    runtimes: dict[str, str]       # importable runtime -> its version ("" when unknown)
    providers: tuple[str, ...]     # ONNX Runtime's available execution providers

    def as_dict(self) -> dict:
        return {"machine": self.machine, "cpu_flags": list(self.cpu_flags), "runtimes": dict(self.runtimes),
                "providers": list(self.providers)}


def read_facts() -> DeviceFacts:
    """The machine, CPU flags, importable runtimes and ONNX Runtime providers of this process."""
    machine = platform.machine().lower()
    runtimes = {}
    for module, dist in ((ONNXRUNTIME, "onnxruntime"), (OPENVINO, "openvino"), (TVM, "apache-tvm")):
        if importlib.util.find_spec(module) is not None:
            runtimes[module] = _version(dist, "onnxruntime-gpu" if module == ONNXRUNTIME else None)
    providers: tuple[str, ...] = ()
    if ONNXRUNTIME in runtimes:
        import onnxruntime

        providers = tuple(onnxruntime.get_available_providers())
    return DeviceFacts(_MACHINES.get(machine, machine), cpu_flags(), runtimes, providers)


def cpu_flags(path: str = "/proc/cpuinfo") -> tuple[str, ...]:
    """The flags of FLAGS_OF_INTEREST in the first ``flags`` (x86) or ``Features`` (Arm) line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    have = set(value.split())
                    return tuple(flag for flag in FLAGS_OF_INTEREST if flag in have)
    except OSError:
        pass
    return ()


def _version(dist: str, alternative: str | None) -> str:
    for name in (dist, alternative):
        if name:
            try:
                return importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
    return ""


def device_target(name: str) -> DeviceTarget:
    """The declared target ``name``; ConfigError listing the declared ones otherwise."""
    try:
        return DEVICE_TARGETS[name]
    except KeyError:
        raise ConfigError(f"unknown target {name!r}: declared are {', '.join(DEVICE_TARGETS)}") from None


@dataclass(frozen=True)
class Preference:
    """The device's targets, best first, and why each is on the list."""

    targets: tuple[str, ...]
    reasons: dict[str, str]
    device_class: str | None       # x86_64 / aarch64: the portable fallback's class; None: no ORT class
    override: str | None = None    # the target --target or ONNXCAST_EDGE_TARGET named


def preference(facts: DeviceFacts, override: str | None = None) -> Preference:
    """The ordered targets of this device (the module's rule); ``override`` (``--target``, else
    ``ONNXCAST_EDGE_TARGET``) names the only one, which must be declared and for this machine."""
    override = override or environment.value("ONNXCAST_EDGE_TARGET")
    device_class = ORT_CLASS.get(facts.machine)
    if override:
        chosen = device_target(override)
        if chosen.architecture != facts.machine:
            raise ConfigError(f"target {override!r} runs on {chosen.architecture}, this device is "
                              f"{facts.machine or 'of an unknown machine'}")
        missing = _missing_runtime(chosen, facts)
        if missing:
            raise ConfigError(f"target {override!r} needs {missing} on this device"
                              + (f": pip install 'onnxcast-edge[{chosen.extra}]'" if chosen.extra else ""))
        return Preference((override,), {override: "named by --target or ONNXCAST_EDGE_TARGET"}, device_class,
                          override)
    reasons: dict[str, str] = {}
    for name in ("tensorrt", "cuda"):
        provider = DEVICE_TARGETS[name].provider
        if facts.machine == DEVICE_TARGETS[name].architecture and provider in facts.providers:
            reasons[name] = f"ONNX Runtime has {provider}"
    if facts.machine == "x86_64" and OPENVINO in facts.runtimes and "sse4_2" in facts.cpu_flags:
        reasons["openvino"] = f"openvino {facts.runtimes[OPENVINO]} installed, x86-64 CPU with SSE4.2"
    if facts.machine == "aarch64" and TVM in facts.runtimes:
        reasons["tvm-aarch64"] = f"tvm {facts.runtimes[TVM]} installed on aarch64"
    if device_class is not None:
        reasons[device_class] = f"ONNX Runtime's CPU target for {facts.machine}"
    return Preference(tuple(reasons), reasons, device_class)


def _missing_runtime(chosen: DeviceTarget, facts: DeviceFacts) -> str | None:
    """What ``chosen`` needs that this device lacks: its runtime, or ONNX Runtime's provider."""
    if chosen.runtime not in facts.runtimes:
        return f"the {chosen.runtime} runtime"
    if chosen.provider and chosen.provider not in facts.providers:
        return f"ONNX Runtime's {chosen.provider}"
    return None


@dataclass(frozen=True)
class Choice:
    """The target a device runs a channel's model on, the artifact that means, and why."""

    target: str
    artifact: str
    family: str | None
    variant: str | None
    why: str
    fallback: bool = False

    def record(self, prefer: Preference, facts: DeviceFacts) -> dict:
        """What pulled.json keeps (and ``onnxcast-edge status`` shows)."""
        return {"name": self.target, "runtime": DEVICE_TARGETS[self.target].runtime, "why": self.why,
                "fallback": self.fallback, "family": self.family, "variant": self.variant,
                "preference": list(prefer.targets), "override": prefer.override, "facts": facts.as_dict()}


def validated_targets(manifest: dict, channel: str) -> dict[str, dict]:
    """The channel's validated targets -> ``{"artifact", "family", "variant"}``: the manifest's
    ``channels[channel]["targets"]`` whose artifact's evidence (where recorded) says validated; a
    manifest without targets: its channel artifact, for ``x86_64`` only."""
    choice = (manifest.get("channels") or {}).get(channel) or {}
    listed = choice.get("targets")
    if not isinstance(listed, dict):
        return {LEGACY_TARGET: {"artifact": choice.get("artifact"), "family": choice.get("family"),
                                "variant": choice.get("variant")}}
    out = {}
    for name, entry in listed.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("artifact"), str):
            continue
        evidence = _artifact_targets(manifest, entry["artifact"])
        if evidence is None or (evidence.get(name) or {}).get("status") == VALIDATED:
            out[name] = entry
    return out


def choose(manifest: dict, channel: str, prefer: Preference, where: str) -> Choice:
    """The first of ``prefer``'s targets the channel lists as validated; else the family's
    portable fp32 variant validated for the device's class; else RefusedError naming why."""
    validated = validated_targets(manifest, channel)
    for name in prefer.targets:
        if name in validated:
            entry = validated[name]
            return Choice(name, entry["artifact"], entry.get("family"), entry.get("variant"), prefer.reasons[name])
    version = manifest.get("version")
    shown = ", ".join(sorted(validated)) or "none"
    if prefer.override:
        raise RefusedError(f"{where}: target {prefer.override!r} (named by --target or ONNXCAST_EDGE_TARGET) is "
                           f"not validated for channel {channel!r} (validated: {shown}); refusing version {version}")
    fallback = _portable(manifest, channel, prefer.device_class)
    if fallback is not None:
        return fallback
    wanted = ", ".join(prefer.targets) or "none: no ONNX Runtime target for this machine"
    raise RefusedError(f"{where}: channel {channel!r} has no variant validated for this device (its targets: "
                       f"{wanted}; the channel's: {shown}); refusing version {version}")


def _portable(manifest: dict, channel: str, device_class: str | None) -> Choice | None:
    """The channel family's fp32 artifact where its evidence says validated on ``device_class``."""
    if device_class is None:
        return None
    family = ((manifest.get("channels") or {}).get(channel) or {}).get("family")
    for name, entry in sorted((manifest.get("artifacts") or {}).items()):
        if not isinstance(entry, dict) or entry.get("family") != family or entry.get("variant") != PORTABLE_VARIANT:
            continue
        if ((_artifact_targets(manifest, name) or {}).get(device_class) or {}).get("status") == VALIDATED:
            return Choice(device_class, name, family, PORTABLE_VARIANT,
                          f"fallback: the channel lists none of this device's targets; the portable "
                          f"{PORTABLE_VARIANT} variant is validated for {device_class}", fallback=True)
    return None


def _artifact_targets(manifest: dict, artifact: str) -> dict | None:
    entry = (manifest.get("artifacts") or {}).get(artifact)
    targets = entry.get("targets") if isinstance(entry, dict) else None
    return targets if isinstance(targets, dict) else None
