"""Deployment targets: where a model runs (declarations), running it there (runners: x86_64 and
OpenVINO natively, aarch64 and tvm-aarch64 under qemu-user, sysroot: the Arm sysroot they need) and
judging its outputs (parity). docs/targets.md; the pipeline, the manifest and the device call it."""
