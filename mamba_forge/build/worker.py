"""The work one build worker process does: compile a composed program, read its resources, fill the cache.

Kept apart from build.py so that a spawned worker imports only the standard library, cuda-bindings and
pyelftools (no pydantic, rich or typer): worker start-up stays short.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict
from pathlib import Path

from mamba_forge.build import nvrtc
from mamba_forge.core.cache import DIGEST_PREFIX, Cache


def compile_parts(source: str, name: str, options: list[str], headers: dict[str, bytes]) -> dict[str, bytes]:
    """Compile and return the cache entry parts: cubin, ptx, log and meta (resources as JSON)."""
    from mamba_forge.build import cubin  # here: a no-change rebuild reads no cubin (nor the regexes it compiles)

    t0 = time.perf_counter()
    res = nvrtc.compile_program(source, name, options, headers)
    meta: dict = {"ok": res.ok, "seconds": round(time.perf_counter() - t0, 3)}
    if res.ok:
        ptx_text = res.ptx.decode(errors="replace")
        meta["kernels"] = {k: asdict(v) for k, v in cubin.read_cubin(res.cubin).items()}
        meta["ptxas"] = {k: asdict(v) for k, v in cubin.parse_ptxas_log(res.log).items()}
        meta["float_atomics"] = cubin.float_atomics_by_entry(ptx_text)
        meta["float_atomics_funcs"] = cubin.float_atomics_outside_entries(ptx_text)
        meta["order_tokens"] = cubin.order_tokens_by_entry(ptx_text)
        meta["order_tokens_funcs"] = cubin.order_tokens_outside_entries(ptx_text)
        meta["special_registers"] = cubin.special_registers_by_entry(ptx_text)
        meta["pdl_waits"] = cubin.pdl_wait_entries(ptx_text)
    return {
        "cubin": res.cubin,
        "ptx": res.ptx,
        "log": res.log.encode(),
        "meta": json.dumps(meta, sort_keys=True).encode(),
    }


ENTRY_PARTS = ("cubin", "ptx", "log", "meta")
ARTIFACT_PARTS = ("cubin", "ptx")  # the parts that become build/ files: a build may leave them unread (lazy)
_META_SHAPE = {"ok": bool, "kernels": dict, "ptxas": dict, "float_atomics": dict, "float_atomics_funcs": list,
               "order_tokens": dict, "order_tokens_funcs": list, "pdl_waits": list}


def entry_problem(parts: dict[str, bytes], cc: int, parsed: dict | None = None) -> str | None:
    """Why a cache entry (whose bytes matched their hashes) is still not a compile result to serve: a part
    missing, metadata of another shape, or a cubin that is not an ELF file for this target. None: serve it.
    `parsed`: also receives the metadata it decoded (as "meta"), so a hit is not decoded twice.

    A cubin left unread (`Cache.get(lazy=...)`: only its digest is here) is one whose entry's stat record says
    these exact bytes were read, hashed and accepted before, under this key (so for this target)."""
    missing = [n for n in ENTRY_PARTS if n not in parts and not (n in ARTIFACT_PARTS and DIGEST_PREFIX + n in parts)]
    if missing:
        return f"no {missing[0]} part"
    try:
        meta = json.loads(parts["meta"])
    except ValueError:
        return "its metadata is not JSON"
    if not isinstance(meta, dict) or any(not isinstance(meta.get(k), t) for k, t in _META_SHAPE.items()):
        return "its metadata is not a compile result's"
    if meta["ok"] is not True:
        return "a failed compile is never cached"
    if parsed is not None:
        parsed["meta"] = meta
    if "cubin" not in parts:
        return None
    from mamba_forge.build import cubin

    return cubin.elf_problem(parts["cubin"], cc)


def run_job(job: dict) -> dict[str, bytes]:
    """Entry point for a worker: compile under the entry's lock, or take what a concurrent builder just made.
    A cache that cannot be locked or written adds a ``cache_warning`` part; the compile result stands."""
    cache = Cache(Path(job["cache_root"])) if job.get("cache_root") else None
    key = job["key"]
    if cache is None:
        return compile_parts(job["source"], job["name"], job["options"], job["headers"])
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(cache.lock(key))
        except OSError as exc:  # a cache folder that cannot even hold a lock file: build without it
            parts = compile_parts(job["source"], job["name"], job["options"], job["headers"])
            return dict(parts, cache_warning=f"build cache not usable ({exc.strerror or exc}); built without it".encode())
        parts = cache.get(key, accept=lambda p: entry_problem(p, job["cc"]))
        if parts is not None:
            return dict(parts, cached=b"1")
        parts = compile_parts(job["source"], job["name"], job["options"], job["headers"])
        warning = cache.warnings[0] if cache.warnings else None  # a refused entry, an unusable cache folder
        if json.loads(parts["meta"])["ok"]:  # failures are not cached: a fixed header must not need a cache wipe
            warning = cache.put(key, parts) or warning
        if warning:
            parts = dict(parts, cache_warning=warning.encode())
        return parts


def die_with_parent() -> None:
    """Pool initializer: the kernel kills this worker when the build's parent dies (Linux PR_SET_PDEATHSIG), so
    a killed `mamba-forge build` leaves no compiler processes running for minutes."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
