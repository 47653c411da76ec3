"""What GPUs and driver this machine has, asked without ever failing: `env` and `--arch native` use it on
machines with no GPU and no libcuda too."""

from __future__ import annotations

from dataclasses import dataclass, field

from mamba_forge.gpu.core import CudaError


@dataclass
class Probe:
    driver_version: str | None = None  # "13.0"
    gpus: list[dict] = field(default_factory=list)  # ordinal, name, cc, sm_count, total_memory
    reason: str | None = None  # why there is no driver or no GPU


def probe() -> Probe:
    from mamba_forge.gpu import core
    from mamba_forge.gpu.driver import Device

    out = Probe()
    try:
        v = core.driver_version()
        out.driver_version = f"{v // 1000}.{v % 1000 // 10}"
        for i in range(core.device_count()):
            info = Device(i).info()
            out.gpus.append({"ordinal": i, "name": info.name, "cc": info.cc_text, "sm_count": info.sm_count,
                             "total_memory": info.total_memory})
    except (CudaError, ImportError, OSError) as exc:
        out.reason = str(exc)
    if not out.gpus and out.reason is None:
        out.reason = "the driver sees no GPU"
    return out


def attached_ccs() -> list[tuple[int, int]]:
    """(major, minor) of every visible GPU; empty without a GPU or a driver."""
    return [tuple(int(x) for x in g["cc"].split(".")) for g in probe().gpus]  # type: ignore[misc]
