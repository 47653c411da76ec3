"""Build: compose each (module kind x target) program, compile it with NVRTC in parallel worker processes through
the private cache, read each symbol's resources and admit or reject it. Produces a BuildManifest.

Composition: the module's sources are concatenated in catalog order, each behind a ``#line 1 "<path>"``
directive (relative path: nothing of this machine enters the program), then one instantiation line per symbol,
``MACRO(symbol, args...)``. Headers under the module's include folders travel in memory under their relative
names.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mamba_forge import __version__
from mamba_forge.build import nvrtc
from mamba_forge.build.jobs import (  # noqa: F401  (re-exported: the build's public names)
    BASE_OPTIONS,
    META_VERSION,
    BuildRequest,
    HeaderMemo,
    Job,
    collect_headers,
    collect_headers_at,
    compose,
    count_jobs,
    module_options,
    plan,
)
from mamba_forge.build.jobs import sha as _sha
from mamba_forge.build.manifest_text import _manifest_text, _plain_digest, _text_memo, manifest_bytes  # noqa: F401
from mamba_forge.build.outputs import OutputStage, hold_out
from mamba_forge.build.records import LOG_HEAD_LINES, _finish, artifact_path, judge  # noqa: F401
from mamba_forge.build.worker import ARTIFACT_PARTS, die_with_parent, entry_problem, run_job
from mamba_forge.core.cache import DIGEST_PREFIX, SIZE_PREFIX, Cache, CacheRefused, default_location
from mamba_forge.core.cache_stat import BuildRecord, fs_clock
from mamba_forge.core.schema import BuildManifest, ModuleBuild, Toolchain


@dataclass(frozen=True)
class PlanSummary:
    """What a build is about to do, reported (`progress("plan", summary)`) before any unit: the header's counts."""

    targets: list[str]
    programs: int
    symbols: int
    cached: int  # programs whose cache entry exists (one found corrupt when read is compiled after all)
    symbols_to_compile: int  # symbols of the programs not cached (the estimate's prior scales with them)
    workers: int  # processes the compiles will run in
    # every program as ("Kind target", its symbols) in the order the workers take them (longest first): the
    # progress estimate follows it
    order: tuple[tuple[str, int], ...] = ()


ProgressFn = Callable[[str, "ModuleBuild | PlanSummary | None"], None]


def _start_method() -> str:
    """fork where it is safe (Linux, no other threads: fast, and callers need no __main__ guard), else spawn."""
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


def _noting_warnings(parts: dict[str, bytes], req: BuildRequest) -> dict[str, bytes]:
    """A worker's cache warning joins the build's warnings once (a full disk warns once, not per module)."""
    warning = parts.pop("cache_warning", b"").decode(errors="replace")
    if warning and not any(w.split(":")[0] == warning.split(":")[0] for w in req.warnings):
        req.warnings.append(warning)
    return parts


def open_cache(req: BuildRequest) -> Cache | None:
    try:
        location = default_location() if req.cache_location == "default" else req.cache_location
        return Cache.open(location)  # type: ignore[arg-type]
    except CacheRefused as exc:
        req.warnings.append(f"build cache disabled: {exc}")
        return None


def build(req: BuildRequest, progress: ProgressFn | None = None) -> BuildManifest:
    """Build every (module x target) the catalog gates admit; never raises for a module that fails to compile.
    Holds `req.out` for the build (a second build into it is refused) and writes it all or nothing."""
    with hold_out(req.out) as lock_fd:
        stage = OutputStage(req.out)
        try:
            cache = open_cache(req)
            record = None
            if cache is not None:  # what the folder's files and the cache entries held when last read
                record = BuildRecord(cache, req.out, lambda: fs_clock(lock_fd), cache.clock)
                stage.record, cache.record = record.outputs, record.entries
            manifest = _build(req, cache, stage, progress)
            remember = None
            if req.write_manifest:
                text, remember = _manifest_text(manifest, req.out / "manifest.toml")
                stage.add("manifest.toml", text)
            stage.commit()
            if remember is not None:  # only bytes that were written (or kept) become a memo
                _text_memo(*remember)
            if record is not None:  # after the commit: it names only files that hold what it says
                stage.record_written()
                record.save()
        except BaseException:
            stage.abort()
            raise
    return manifest


def _cache_hit(cache: Cache, job: Job, stage: OutputStage) -> tuple[dict[str, bytes] | None, dict | None]:
    """A program's cache entry (and its decoded metadata), its cubin and ptx left unread where the stat records
    say the entry and the output files hold what they held when last read and checked: a no-change rebuild reads
    neither the 171 MB of entries nor build/'s copies of them. Anything else is read and hashed in full."""
    decoded: dict = {}

    def accept(parts: dict[str, bytes]) -> str | None:
        return entry_problem(parts, job.target.cc, decoded)

    parts = cache.get(job.key, accept=accept, lazy=ARTIFACT_PARTS)
    if parts is not None and not all(
        code in parts or parts[SIZE_PREFIX + code] == b"0"
        or stage.current(artifact_path(job, code), parts[DIGEST_PREFIX + code].decode())
        for code in ARTIFACT_PARTS
    ):  # an output to write, or to read and compare: the entry's bytes are needed after all
        parts = cache.get(job.key, accept=accept)
    return parts, decoded.get("meta")


def _longest_first(job) -> int:
    """The workers' order: longest programs first keeps the pool busy to the end."""
    return -len(job.source)


def _build(req: BuildRequest, cache: Cache | None, stage: OutputStage, progress: ProgressFn | None) -> BuildManifest:
    memo: HeaderMemo = {}
    jobs = plan(req, memo)
    if progress:
        missing = [j for j in jobs if not (cache and cache.has(j.key))]
        progress("plan", PlanSummary(targets=[t.name for t in req.targets], programs=len(jobs),
                                     symbols=sum(len(j.module.symbols) for j in jobs), cached=len(jobs) - len(missing),
                                     symbols_to_compile=sum(len(j.module.symbols) for j in missing),
                                     workers=_workers(req, len(missing)),
                                     order=tuple((f"{j.module.kind} {j.target.name}", len(j.module.symbols))
                                                 for j in sorted(jobs, key=_longest_first))))
    results: dict[int, ModuleBuild] = {}
    pending: list[int] = []
    for i, job in enumerate(jobs):
        parts, meta = _cache_hit(cache, job, stage) if cache else (None, None)
        if parts is not None:
            results[i] = _finish(job, dict(parts, cached=b"1"), stage, meta)
            if progress:
                progress("done", results[i])
        else:
            pending.append(i)
    for w in cache.warnings if cache else ():
        _noting_warnings({"cache_warning": w.encode()}, req)
    if pending:
        workers = _workers(req, len(pending))
        payloads = {
            i: {
                "source": jobs[i].source,
                "name": jobs[i].program_name,
                "options": jobs[i].options,
                "headers": jobs[i].headers,
                "key": jobs[i].key,
                "cache_root": str(cache.root) if cache else None,
                "cc": jobs[i].target.cc,
            }
            for i in pending
        }
        pending.sort(key=lambda i: _longest_first(jobs[i]))
        if workers == 1:
            for i in pending:
                if progress:
                    progress("start", None)
                results[i] = _finish(jobs[i], _noting_warnings(run_job(payloads[i]), req), stage)
                if progress:
                    progress("done", results[i])
        else:
            import multiprocessing  # only when something compiles: a no-change rebuild starts no pool
            from concurrent.futures import ProcessPoolExecutor, as_completed

            ctx = multiprocessing.get_context(_start_method())
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=die_with_parent) as pool:
                futures = {pool.submit(run_job, payloads[i]): i for i in pending}
                try:
                    for fut in as_completed(futures):
                        i = futures[fut]
                        results[i] = _finish(jobs[i], _noting_warnings(fut.result(), req), stage)
                        if progress:
                            progress("done", results[i])
                except BaseException:  # an output that cannot be written: no compile still queued runs
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
        if cache is not None:  # what the workers stored, read back once: the next rebuild need not read it
            cache.record_written({jobs[i].key: lambda p, cc=jobs[i].target.cc: entry_problem(p, cc)
                                  for i in pending if results[i].status == "compiled"})
    lib = nvrtc.library_identity()
    headers = {}
    digests: dict[int, str] = {}  # by id of the memo's bytes: each header hashed once however many modules share it
    for m in req.catalog.modules:
        for rel in m.module.include:
            for name, data in collect_headers_at(m.root / rel, memo).items():
                headers[f"{rel}/{name}"] = digests.get(id(data)) or digests.setdefault(id(data), _sha(data))
    return BuildManifest(
        tool_version=__version__,
        catalog=req.catalog.name,
        catalog_sha256=req.catalog.digest(),
        state_capacity=req.state_capacity,
        targets=[t.name for t in req.targets],
        toolchain=Toolchain(
            nvrtc_version=lib["nvrtc_version"],
            library={k: v for k, v in lib.items()},
            header_sha256=dict(sorted(headers.items())),
            base_options=BASE_OPTIONS,
        ),
        modules=[results[i] for i in range(len(jobs))],
    )


def _workers(req: BuildRequest, compiles: int) -> int:
    return max(1, min(compiles, req.jobs or os.cpu_count() or 1))


def timed_build(req: BuildRequest, progress: ProgressFn | None = None) -> tuple[BuildManifest, float]:
    t0 = time.perf_counter()
    manifest = build(req, progress)
    return manifest, time.perf_counter() - t0
