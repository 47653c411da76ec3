"""The qualifier's own kernels (the guard check, the noisy neighbour, the placement blocker, the PDL late writer):
each compiled by NVRTC for the device it runs on and loaded once per worker, through :func:`compile_helper`."""

from __future__ import annotations

from mamba_forge.gpu import driver as cu


def compile_helper(cc, source: str, program: str, entry: str, what: str) -> tuple[cu.Module, cu.Function]:
    """(module, function): `source` compiled for compute capability `cc` (a (major, minor) pair) as `program` and
    loaded, its `entry` resolved. RuntimeError naming `what` with the log's head when it does not compile; a load
    failure is the driver's CudaError."""
    from mamba_forge.build import nvrtc

    major, minor = cc
    res = nvrtc.compile_program(source, program, ["-std=c++17", f"-arch=sm_{major}{minor}"], {}, want_ptx=False)
    if not res.ok:
        raise RuntimeError(f"the {what} failed to compile: {res.log[:300]}")
    module = cu.Module(res.cubin)
    return module, module.function(entry)


__all__ = ["compile_helper"]
