"""The deployment targets: where a model runs, with which runtime, how onnxcast validates it there,
and what a device installs (pinned). Declarations only: standard library, no runtime imported.

A target is validated *here* when this machine can run it (natively or under qemu-user); ``cuda``
and ``tensorrt`` are declared with their exact recipe and stay unvalidated: this machine has no GPU,
and the GPU machine some sessions get has no ONNX Runtime GPU build (PITFALLS.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# how a runner runs a model
IN_PROCESS = "in-process"          # this Python process (the pipeline's own ONNX Runtime)
CHILD_PROCESS = "child process"    # a child Python on this CPU: a runtime crash is "unavailable"
QEMU_USER = "qemu-user"            # Debian's arm64 python3.11 under qemu-aarch64-static
CROSS_COMPILED = "cross-compiled, run under qemu-user"
GPU = "gpu"                        # needs an NVIDIA GPU: declared, not run here

# a target run's status
OK = "ok"
UNAVAILABLE = "unavailable"  # this host lacks what the target needs (qemu, the sysroot, a GPU), or it crashed
UNSUPPORTED = "unsupported"  # the runtime cannot take this model (e.g. TVM and the LSTM)

EMULATED_LATENCY_NOTE = "emulated, not a timing"


@dataclass(frozen=True)
class Target:
    """One deployment target."""

    name: str
    runtime: str                    # the runtime that executes the ONNX graph (or what it compiles to)
    architecture: str               # the device's processor: x86_64, aarch64
    execution: str                  # how onnxcast runs it when validating (IN_PROCESS, ...)
    validated_here: bool            # whether this machine can run it (else: recorded as unvalidated)
    emulated: bool                  # latency under emulation is not a timing
    device_install: tuple[str, ...]  # pip requirements a device installs, pinned
    apt_packages: tuple[str, ...] = ()  # host packages the validation needs (make arm-tools)
    variant: str = "fp32"           # the variant this target runs
    recipe: tuple[str, ...] = ()    # the exact build steps where the artifact is not the ONNX file itself
    notes: str = ""
    families: tuple[str, ...] = field(default=("lstm", "transformer", "nhits", "dlinear"))

    def as_dict(self) -> dict:
        return {"name": self.name, "runtime": self.runtime, "architecture": self.architecture,
                "execution": self.execution, "validated_here": self.validated_here, "emulated": self.emulated,
                "device_install": list(self.device_install), "apt_packages": list(self.apt_packages),
                "variant": self.variant, "recipe": list(self.recipe), "notes": self.notes,
                "families": list(self.families)}


class UnknownTargetError(ValueError):
    """A target name that is not declared; the message lists the declared ones."""


# the device's runtime, as requirements/constraints.txt pins it
ONNXRUNTIME = "onnxruntime==1.32.0"
NUMPY = "numpy==2.4.6"
OPENVINO = "openvino==2026.4.1"
TVM = "apache-tvm==0.27.0.post1"
# the newest GPU build on PyPI (2026-12-05); there is no 1.32 GPU wheel yet
ONNXRUNTIME_GPU = "onnxruntime-gpu==1.31.1"
TENSORRT = "tensorrt-cu12==10.16.1.11"
QEMU_CPU = "cortex-a72"

TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("x86_64", runtime="onnxruntime (CPUExecutionProvider)", architecture="x86_64", execution=IN_PROCESS,
           validated_here=True, emulated=False, device_install=(ONNXRUNTIME, NUMPY),
           notes="the reference: every other target is compared with it"),
    Target("aarch64", runtime="onnxruntime (CPUExecutionProvider, aarch64 wheel)", architecture="aarch64",
           execution=QEMU_USER, validated_here=True, emulated=True, device_install=(ONNXRUNTIME, NUMPY),
           apt_packages=("qemu-user-static",),
           notes=f"Debian 12 arm64 python3.11 under qemu-aarch64-static -cpu {QEMU_CPU} "
                 "(scripts/arm_sysroot.py builds the sysroot); an Arm /proc/cpuinfo is bind-mounted "
                 "in a private mount namespace or ONNX Runtime crashes at import"),
    Target("openvino", runtime="openvino (CPU device, INFERENCE_PRECISION_HINT f32)", architecture="x86_64",
           execution=CHILD_PROCESS, validated_here=True, emulated=False, device_install=(OPENVINO, NUMPY),
           notes="reads the ONNX file itself; f32 hint because PERFORMANCE mode computes in bf16 where the CPU "
                 "has avx512_bf16; compiled in a child process (reported SIGFPE in compile_model on some EPYCs); "
                 "one history row per inference where the model reads features: 2026.4.1 miscomputes batches > 1 "
                 "of these graphs (ReduceMean then the Add of a [1, C, 1] constant, C > 1), so a device must do "
                 "the same"),
    Target("tvm-aarch64", runtime="apache-tvm Relax VM (llvm, aarch64-linux-gnu)", architecture="aarch64",
           execution=CROSS_COMPILED, validated_here=True, emulated=True, device_install=(TVM, NUMPY),
           apt_packages=("qemu-user-static", "gcc-aarch64-linux-gnu"),
           recipe=("onnxslim.slim(model, input_shapes=['history:BATCH,LOOKBACK,N_FEATURES']) (folds the shape "
                   "arithmetic the Relax frontend cannot lower)",
                   "tvm.relax.frontend.onnx.from_onnx(model, shape_dict={'history': [BATCH, LOOKBACK, N_FEATURES]})",
                   "tvm.compile(mod, target=tvm.target.Target({'kind': 'llvm', 'mtriple': 'aarch64-linux-gnu', "
                   f"'mcpu': '{QEMU_CPU}'}}))",
                   "executable.export_library(path, cc='aarch64-linux-gnu-gcc')"),
           families=("transformer", "nhits", "dlinear"),
           notes="static input shape (batch, lookback): a device passes exactly the lookback's newest steps; "
                 "TVM's Relax ONNX frontend has no LSTM import"),
    Target("cuda", runtime="onnxruntime-gpu (CUDAExecutionProvider)", architecture="x86_64", execution=GPU,
           validated_here=False, emulated=False, device_install=(ONNXRUNTIME_GPU, NUMPY),
           recipe=(f"pip install {ONNXRUNTIME_GPU} {NUMPY} (CUDA 12.x and cuDNN 9 on the host)",
                   "InferenceSession(fp32.onnx, providers=['CUDAExecutionProvider', 'CPUExecutionProvider'])"),
           notes="unvalidated: no GPU here; never chosen by a device until validated"),
    Target("tensorrt", runtime="onnxruntime-gpu (TensorrtExecutionProvider)", architecture="x86_64", execution=GPU,
           validated_here=False, emulated=False, device_install=(ONNXRUNTIME_GPU, TENSORRT, NUMPY),
           recipe=(f"pip install {ONNXRUNTIME_GPU} {TENSORRT} {NUMPY} (CUDA 12.x)",
                   "InferenceSession(fp32.onnx, providers=[('TensorrtExecutionProvider', "
                   "{'trt_fp16_enable': False, 'trt_engine_cache_enable': True}), 'CUDAExecutionProvider'])",
                   "engine built on the device at first run (an engine is tied to the GPU and TensorRT version)"),
           notes="unvalidated: no GPU here; TensorRT 10.16's pairing with onnxruntime-gpu 1.31.1 is to be "
                 "confirmed on a GPU; never chosen by a device until validated"),
)}

DEFAULT_TARGETS = ("x86_64",)


def target(name: str) -> Target:
    """The declared target called ``name``."""
    try:
        return TARGETS[name]
    except KeyError:
        raise UnknownTargetError(f"unknown target {name!r}: declared are {', '.join(TARGETS)}") from None


def parse_targets(text: str) -> tuple[Target, ...]:
    """``"x86_64,openvino"`` -> the declared targets, in order, without duplicates; empty -> the default."""
    names = [n.strip() for n in text.split(",") if n.strip()] or list(DEFAULT_TARGETS)
    return tuple(target(n) for n in dict.fromkeys(names))
