"""The qualification worker: a subprocess that qualifies groups of symbols on one device and streams one event
(events.py) per line on stdout. The parent (supervise.py) isolates it: a fault kills the context, so the worker reports
the CUresult and exits; a hang is reported by the worker's own deadline (or the parent's) and the process dies.

    python -m mamba_forge.qualify.worker --job JOB.json

The checks of one symbol are symbol_run.py's SymbolRun (re-exported here); this module loads each group's module
and runs the process. Events (events.py): hello or fatal, module or module_error, per symbol start, check..., result (or fault,
timeout), done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from mamba_forge.catalog.model import load_catalog
from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import checks as C
from mamba_forge.qualify import placement as P  # noqa: F401  (worker.P: what SymbolRun places with, for tests)
from mamba_forge.qualify.events import (
    Done,
    Fatal,
    Fault,
    Hello,
    ModuleError,
    ModuleLoaded,
    Start,
    SymbolResult,
    Timeout,
    WorkerDevice,
)
from mamba_forge.qualify.symbol_run import (  # one symbol's checks, re-exported: symbol_run.py
    REPEATS,
    SANITIZE_BATCH,
    SymbolRun,
    emit,
    symbol_seed,
)

EXIT_FAULT, EXIT_TIMEOUT = 3, 4


def load_group(ctx: C.Context, build_dir: Path, group: dict) -> tuple[cu.Module | None, str]:
    """Load a group's cubin; PTX only when the driver supports its ISA version. Returns (module, note)."""
    drv = ctx.info.driver_version
    cubin = group.get("cubin")
    if cubin:
        data = (build_dir / cubin).read_bytes()
        return cu.Module(data), "cubin"
    ptx = group.get("ptx")
    if ptx:
        text = (build_dir / ptx).read_bytes()
        isa = _ptx_isa(text)
        # the driver accepts PTX of ISA <= its own CUDA version (CUDA 13.0 -> PTX 9.0)
        max_isa = (drv // 1000 - 4, (drv % 1000) // 10)
        if isa is not None and isa > max_isa:
            return None, (f"PTX ISA {isa[0]}.{isa[1]} is newer than the driver ({drv}) supports "
                          f"({max_isa[0]}.{max_isa[1]}): not loaded")
        return cu.Module(text, ptx=True), "ptx"
    return None, "no cubin or PTX artifact"


def _ptx_isa(text: bytes) -> tuple[int, int] | None:
    for line in text.splitlines()[:50]:
        if line.startswith(b".version"):
            try:
                a, b = line.split()[1].decode().split(".")
                return int(a), int(b)
            except (ValueError, IndexError):
                return None
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mamba_forge.qualify.worker")
    ap.add_argument("--job", required=True)
    args = ap.parse_args(argv)
    job = json.loads(Path(args.job).read_text())
    catalog = load_catalog(job["catalog"])
    # a user catalog may ship its references beside itself ("refs:function" then imports refs.py from there)
    sys.path.append(str(Path(job["catalog"]).resolve().parent))
    build_dir = Path(job["build_dir"])
    try:
        dev = cu.Device(int(job["device"]))
        fixed = job.get("timeout_s", 20.0)  # None: each symbol's budget scales with its first launch
        ctx = C.Context(dev, dev.info(), timeout_s=None if fixed is None else float(fixed))
        ctx.open()
    except cu.CudaError as exc:
        emit(Fatal(reason=str(exc), result=exc.result))
        return 2
    i = ctx.info
    emit(Hello(WorkerDevice(name=i.name, cc=i.cc_text, sm_count=i.sm_count, driver_version=i.driver_version,
                            optin_smem=i.optin_smem, uuid=i.uuid, ordinal=i.ordinal), pid=os.getpid()))
    for group in job["groups"]:
        try:
            module, note = load_group(ctx, build_dir, group)
        except cu.CudaError as exc:
            emit(ModuleError(group["module"], group["target"],
                             f"{group['module']} ({group['target']}): module load failed with {exc.result}", exc.result))
            if exc.result in cu.STICKY_RESULTS:
                return EXIT_FAULT
            continue
        if module is None:
            emit(ModuleError(group["module"], group["target"], note))
            continue
        emit(ModuleLoaded(group["module"], group["target"], note))
        for entry in group["symbols"]:
            name = entry["name"]
            emit(Start(name, group["module"], group["target"]))
            t0 = time.perf_counter()
            try:
                rec = SymbolRun(ctx, catalog, module, job, entry, group).run()
            except C.Hang as exc:
                emit(Timeout(name, f"{name}: {exc}", exc.seconds))
                sys.stdout.flush()
                os._exit(EXIT_TIMEOUT)  # the hung kernel holds the context: only process exit frees it
            except cu.CudaError as exc:
                emit(Fault(name, f"{name}: {exc}", exc.result))
                sys.stdout.flush()
                if exc.result in cu.STICKY_RESULTS:
                    os._exit(EXIT_FAULT)  # the context is dead: only process exit frees it
                # the supervisor gives a worker that reported a fault a few seconds to exit (supervise.EXIT_GRACE_S):
                # it restarts a fresh worker for the next symbol rather than let this one's time run against it
                return EXIT_FAULT
            except Exception as exc:  # noqa: BLE001 - any other failure is this symbol's verdict
                tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
                emit(SymbolResult.rejected(name, group["module"], group["target"], "harness",
                                           f"{name}: the qualifier failed: {type(exc).__name__}: {exc} [{tb}]"))
                continue
            rec.seconds = round(time.perf_counter() - t0, 3)
            emit(rec)
    emit(Done())
    return 0


__all__ = ["EXIT_FAULT", "EXIT_TIMEOUT", "REPEATS", "SANITIZE_BATCH", "SymbolRun", "emit", "load_group", "main",
           "symbol_seed"]


if __name__ == "__main__":
    sys.exit(main())
