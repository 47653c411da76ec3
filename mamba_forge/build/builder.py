"""Build: compose each (module kind x target) program, compile it with NVRTC in parallel worker processes through
the private cache, read each symbol's resources and admit or reject it. Produces a BuildManifest.

Composition: the module's sources are concatenated in catalog order, each behind a ``#line 1 "<path>"``
directive (relative path: nothing of this machine enters the program), then one instantiation line per symbol,
``MACRO(symbol, args...)``. Headers under the module's include folders travel in memory under their relative
names.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mamba_forge import __version__
from mamba_forge.build import admit, nvrtc
from mamba_forge.build.outputs import OutputStage, hold_out
from mamba_forge.build.worker import die_with_parent, entry_problem, run_job
from mamba_forge.catalog.compile_rules import redact_log
from mamba_forge.catalog.model import Catalog, ModuleSpec, Symbol
from mamba_forge.catalog.sources import check_resolved, read_headers, read_source
from mamba_forge.catalog.targets import SMEM_RESERVED_BYTES, Target
from mamba_forge.core.cache import (
    DIGEST_PREFIX,
    Cache,
    CacheRefused,
    cache_key,
    default_location,
    memo_cache,
    memo_writes,
)
from mamba_forge.core.errors import CatalogError
from mamba_forge.core.schema import (
    Artifact,
    BuildManifest,
    ModuleBuild,
    Resources,
    SymbolBuild,
    Toolchain,
    Verdict,
)

META_VERSION = 3  # the worker's metadata layout (build/worker.py): part of every cache key
BASE_OPTIONS = ["-std=c++17", "--fmad=true", "-DNDEBUG", "--frandom-seed=mamba-forge"]
LOG_HEAD_LINES = 12


@dataclass(frozen=True)
class PlanSummary:
    """What a build is about to do, reported (`progress("plan", summary)`) before any unit: the header's counts."""

    targets: list[str]
    programs: int
    symbols: int
    cached: int  # programs whose cache entry exists (one found corrupt when read is compiled after all)
    symbols_to_compile: int  # symbols of the programs not cached (the estimate's prior scales with them)
    workers: int  # processes the compiles will run in


ProgressFn = Callable[[str, "ModuleBuild | PlanSummary | None"], None]


@dataclass
class BuildRequest:
    catalog: Catalog
    targets: list[Target]
    out: Path
    jobs: int = 0  # 0: one per CPU
    state_capacity: int = 64
    cache_location: Path | None | str = "default"  # "default": from the environment; None: no cache
    warnings: list[str] = field(default_factory=list)
    kernels: tuple[str, ...] = ()  # symbol-name globs (`build --kernels`); empty: every symbol
    modules: tuple[str, ...] = ()  # module kinds (`build --module`); empty: every module
    write_manifest: bool = False  # also write <out>/manifest.toml, renamed in with the artifacts (the CLI's way)

    def __post_init__(self) -> None:
        if self.modules:
            known = [m.kind for m in self.catalog.modules]
            unknown = [k for k in self.modules if k not in known]
            if unknown:
                raise CatalogError(f"--module {unknown[0]!r}: no such module kind in {self.catalog.path}",
                                   hint=f"known: {', '.join(known)}")
            self.catalog = self.catalog.narrowed(tuple(m for m in self.catalog.modules if m.kind in self.modules))
        if self.kernels:
            from mamba_forge.catalog.select import select_symbols

            self.catalog = select_symbols(self.catalog, self.kernels)


@dataclass
class Job:
    module: ModuleSpec
    target: Target
    role: str
    source: str
    headers: dict[str, bytes]
    options: list[str]
    key: str

    @property
    def program_name(self) -> str:
        return f"mamba_forge_{self.module.kind}.cu"

    @property
    def known_files(self) -> set[str]:
        """The file names the compiler log may name for this program: its sources, headers and the program."""
        return {*self.module.module.sources, *self.headers, "<instantiations>", self.program_name}


HeaderMemo = dict[Path, dict[str, bytes]]  # one build's reads of its include folders (the modules share them)


def collect_headers(module: ModuleSpec, memo: HeaderMemo | None = None) -> dict[str, bytes]:
    """Every header file under the module's include folders, keyed by its include name."""
    headers: dict[str, bytes] = {}
    for rel in module.module.include:
        headers.update(collect_headers_at(module.root / rel, memo))
    return headers


def compose(module: ModuleSpec) -> str:
    """The module's one program: its sources in order, then the catalog's instantiation lines."""
    parts = [f"// mamba-forge module {module.kind}: composed from the catalog; do not edit\n"]
    for rel in module.module.sources:
        text = read_source(module.root / rel, f"module {module.kind}: source")
        parts.append(f'#line 1 "{rel}"\n{text}\n')
    lines = []
    for sym in module.symbols:
        fam = module.family(sym.family)
        if fam.instantiate:
            lines.append(f"{fam.instantiate}({', '.join([sym.name, *sym.macro_args])})")
    if lines:
        parts.append('#line 1 "<instantiations>"\n' + "\n".join(lines) + "\n")
    return "".join(parts)


def module_options(module: ModuleSpec, target: Target, state_cap: int) -> list[str]:
    opts = list(BASE_OPTIONS) + list(module.options) + [f"-arch={target.name}", "--ptxas-options=-v"]
    if module.module.state_capacity:
        opts.append(f"-DMF_STATE_CAP={state_cap}")
    opts.append(nvrtc.CUDA_INCLUDE_TOKEN)
    return opts


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _header_sha(data: bytes, memo_sha: dict[int, tuple[bytes, str]]) -> str:
    """sha256 of a header's bytes, once per build however many modules share them (the memo holds the bytes, so
    an id is never reused for other bytes while it lives)."""
    hit = memo_sha.get(id(data))
    if hit is None or hit[0] is not data:
        hit = memo_sha[id(data)] = (data, _sha(data))
    return hit[1]


def _library_key() -> dict[str, str]:
    ident = dict(nvrtc.library_identity())
    ident.pop("cuda-bindings", None)  # the Python binding does not change the bytes
    return ident


def plan(req: BuildRequest, memo: HeaderMemo | None = None) -> list[Job]:
    jobs = []
    lib = _library_key()
    memo = {} if memo is None else memo
    memo_sha: dict[int, tuple[bytes, str]] = {}  # id of a header's bytes in `memo` -> (the bytes, their sha256)
    for module in req.catalog.modules:
        pairs = module.targets(req.targets)
        if not pairs:
            continue
        headers = collect_headers(module, memo)
        source = compose(module)
        # NVRTC opens any include it cannot find in memory on disk: every name must be an in-memory header or one
        # of the pinned CUDA headers (the catalog checked the names are plain; this checks they resolve)
        check_resolved({"the composed program": source, **headers},
                       lambda n, hs=headers: n in hs or nvrtc.is_cuda_header(n), f"module {module.kind}")
        entry = module.module.model_dump(mode="json", exclude={"families"})
        # what every target's key shares, computed once per module (the keys are unchanged)
        source_sha = _sha(source)
        header_shas = {k: _header_sha(v, memo_sha) for k, v in sorted(headers.items())}
        symbols = [[s.name, s.macro_args] for s in module.symbols]
        for target, role in pairs:
            options = module_options(module, target, req.state_capacity)
            key = cache_key(
                {
                    "tool": __version__,
                    "meta": META_VERSION,
                    "source_sha256": source_sha,
                    "headers": header_shas,
                    "options": options,
                    "target": target.name,
                    "nvrtc": lib,
                    "module": entry,
                    "symbols": symbols,
                }
            )
            jobs.append(Job(module, target, role, source, headers, options, key))
    return jobs


def _resources(name: str, meta: dict, target: Target) -> Resources | None:
    k = meta["kernels"].get(name)
    if k is None:
        return None
    px = meta["ptxas"].get(name, {})
    static_smem = px.get("smem")
    if static_smem is None:  # ptxas prints no smem figure when there is none
        static_smem = max(0, k["static_smem"] - (SMEM_RESERVED_BYTES if target.cc >= 90 and k["static_smem"] else 0))
    return Resources(
        registers=k["registers"] or px.get("registers", 0),
        static_smem=static_smem,
        stack_frame=px.get("stack_frame", k["frame_size"]),
        spill_stores=px.get("spill_stores", 0),
        spill_loads=px.get("spill_loads", 0),
        max_threads=k["max_threads"],
        barriers=max(k["barriers"], px.get("barriers", 0)),
        param_bytes=k["param_bytes"],
        param_layout=[[p["offset"], p["size"]] for p in k["params"]],
    )


def judge(job: Job, meta: dict) -> tuple[list[SymbolBuild], list[str]]:
    """Per-symbol verdicts from a compiled module's metadata, and the foreign exports."""
    out = []
    func_atomics = meta.get("float_atomics_funcs", [])
    declared = {s.name for s in job.module.symbols}
    for sym in job.module.symbols:
        res = _resources(sym.name, meta, job.target)
        if res is None:
            verdict = Verdict(
                status="rejected",
                check="exports",
                reason=f"{sym.name} on {job.target.name}: declared in the catalog but not exported by the module",
            )
        else:
            verdict = admit.admit_symbol(sym, res, job.target)
            atomics = meta["float_atomics"].get(sym.name, []) + func_atomics
            if verdict.status == "admitted" and sym.deterministic and atomics:
                verdict = admit.reject_float_atomics(sym, job.target, atomics)
            tokens = sorted(set(meta["order_tokens"].get(sym.name, []) + meta["order_tokens_funcs"]))
            if (verdict.status == "admitted" and sym.deterministic and sym.policy.static_tokens == "deterministic"
                    and tokens):
                verdict = admit.reject_order_tokens(sym, job.target, tokens)
        rec = _symbol_record(sym, res, verdict)
        if res is not None:
            ack = job.module.family(sym.family).acknowledge
            rec.warnings = admit.placement_warnings(sym, job.target, meta["special_registers"].get(sym.name, []), ack) or None
        out.append(rec)
    foreign = sorted(set(meta["kernels"]) - declared)
    return out, foreign


def _symbol_record(sym: Symbol, res: Resources | None, verdict: Verdict) -> SymbolBuild:
    return SymbolBuild(
        name=sym.name,
        family=sym.family,
        dtype=sym.dtype or "",
        block=list(sym.block),
        dynamic_smem=sym.dynamic_smem,
        deterministic=sym.deterministic,
        resources=res,
        verdict=verdict,
    )


def _finish(job: Job, parts: dict[str, bytes], out: OutputStage, meta: dict | None = None) -> ModuleBuild:
    """The module's record from its compile result (`meta`: its metadata, when the caller decoded it already)."""
    meta = json.loads(parts["meta"]) if meta is None else meta
    log = parts["log"].decode(errors="replace")
    record = ModuleBuild(
        kind=job.module.kind,
        target=job.target.name,
        role=job.role,  # type: ignore[arg-type]
        built_only=job.module.built_only(job.target),
        mandatory=job.module.module.mandatory,
        status="compiled" if meta["ok"] else "failed",
        options=job.options,
        source_sha256=_sha(job.source),
        cache_key=job.key,
        cached=parts.get("cached") == b"1",
        compile_seconds=meta.get("seconds", 0.0),
    )
    if not meta["ok"]:
        # what reaches the manifest never quotes a file outside the catalog (defence behind the include rule)
        log = redact_log(log, lambda f: f in job.known_files or nvrtc.is_cuda_header_path(f))
        head = "\n".join(line for line in log.splitlines() if line.strip())
        record.log_head = "\n".join(head.splitlines()[:LOG_HEAD_LINES])
        reason = f"module {job.module.kind} failed to compile for {job.target.name}: " + (
            head.splitlines()[0] if head else "no log"
        )
        record.symbols = [
            _symbol_record(s, None, Verdict(status="rejected", check="compile", reason=reason)) for s in job.module.symbols
        ]
        return record
    for code in ("cubin", "ptx"):
        data = parts[code]
        if not data:
            continue
        rel = f"{job.target.name}/{job.module.kind}.{code}"
        out.add(rel, data)
        digest = parts.get(DIGEST_PREFIX + code)  # a cache hit's verified digest: no second pass over the bytes
        record.artifacts.append(Artifact(path=rel, sha256=digest.decode() if digest else _sha(data), size=len(data),
                                         code=code))  # type: ignore[arg-type]
    record.symbols, record.foreign_exports = judge(job, meta)
    for name in record.foreign_exports:
        record.symbols.append(
            SymbolBuild(
                name=name, family="", block=[0, 0, 0], dynamic_smem=0, deterministic=False,
                verdict=Verdict(
                    status="rejected", check="exports",
                    reason=f"{name} on {job.target.name}: exported by module {job.module.kind} but not declared in the catalog",
                ),
            )
        )
    return record


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
    with hold_out(req.out):
        stage = OutputStage(req.out)
        try:
            manifest = _build(req, stage, progress)
            remember = None
            if req.write_manifest:
                text, remember = _manifest_text(manifest, req.out / "manifest.toml")
                stage.add("manifest.toml", text)
            stage.commit()
            if remember is not None:  # only bytes that were written (or kept) become a memo
                _text_memo(*remember)
        except BaseException:
            stage.abort()
            raise
    return manifest


_CACHE_FIELDS = re.compile(rb"^cached = (?:true|false)\ncompile_seconds = ([0-9][0-9.e+-]{0,30})$", re.M)


def _written_float(text: bytes) -> bool:
    """Whether `text` is how tomli-w writes a finite float (a carried time must be one this build could write)."""
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and repr(value).encode() == text


def manifest_bytes(manifest: BuildManifest, previous: Path) -> bytes:
    """The manifest's TOML, or the `previous` file's own bytes where they differ from it only in which programs
    came from the cache (`cached`, `compile_seconds`): a rebuild that changes nothing leaves manifest.toml (and its
    mtime) alone; those fields keep saying how the build that wrote the file got each program.

    Writing the TOML (tomli-w: 0.15 s for the built-in catalog's 2083 symbols) is skipped when the manifest-text
    memo (:func:`_text_memo`) says the previous bytes are what it would write: those exact bytes were written by
    this code from a record whose plain data, with the previous file's own `cached` and `compile_seconds` put in,
    is this record's (compared by a sha256 of its JSON, which tells every type and order tomli-w writes apart)."""
    return _manifest_text(manifest, previous)[0]


def _manifest_text(manifest: BuildManifest, previous: Path) -> tuple[bytes, tuple[bytes, str] | None]:
    """manifest_bytes, and the (bytes, plain-data digest) to remember once they are written (None: nothing new)."""
    from mamba_forge.core.safety import MAX_MANIFEST_BYTES, PathRefused, read_bounded
    from mamba_forge.manifest.toml_io import dumps

    try:
        old = read_bounded(previous, MAX_MANIFEST_BYTES, what="manifest", follow=False)
    except (PathRefused, OSError):  # none yet, or not one to keep: the new one is written
        old = None
    got = _got_fields(old, manifest) if old is not None else None
    remembered = _text_memo(old) if got is not None else None  # type: ignore[arg-type]
    if remembered is not None and remembered == _plain_digest(manifest, got):
        return old, None  # type: ignore[return-value]
    data = dumps(manifest).encode()
    if old is None or old == data:
        return data, (data, _plain_digest(manifest))
    # how each program was got, as tomli-w writes it in each module table (one line each: tomli-w writes no
    # multi-line strings, so `^` finds only keys); the previous file's values put in the new text's places
    # must give the previous file's bytes, anything else is a changed manifest
    new = _CACHE_FIELDS.split(data)[::2]  # the text around the fields (split also returns the group)
    if got is None or len(new) != len(got) + 1:
        return data, (data, _plain_digest(manifest))
    as_before = b"".join(piece for i, text in enumerate(new[:-1]) for piece in (text, got[i])) + new[-1]
    if as_before == old:
        return old, (old, _plain_digest(manifest, got))
    return data, (data, _plain_digest(manifest))


def _got_fields(old: bytes, manifest: BuildManifest) -> list[bytes] | None:
    """The previous file's `cached`/`compile_seconds` lines, one per module of `manifest`, or None."""
    got = [m.group(0) for m in _CACHE_FIELDS.finditer(old) if _written_float(m.group(1))]
    return got if len(got) == len(manifest.modules) else None


def _plain_digest(manifest: BuildManifest, got: list[bytes] | None = None) -> str:
    """sha256 of the manifest's plain data as JSON (order and types kept: 1, 1.0 and true differ), with each
    module's `cached` and `compile_seconds` taken from the `got` lines when given."""
    from mamba_forge.core.codec import to_dict

    plain = to_dict(manifest)
    for module, line in zip(plain["modules"], got or (), strict=False):
        cached, seconds = line.split(b"\n")
        module["cached"] = cached.endswith(b"true")
        module["compile_seconds"] = float(seconds.split(b" = ", 1)[1])
    return hashlib.sha256(json.dumps(plain, separators=(",", ":")).encode()).hexdigest()


_TEXT_CODE = ("manifest/toml_io.py", "core/codec.py", "core/schema.py", "build/builder.py")
_text_code_digest: str | None = None


def _text_memo(data: bytes, digest: str | None = None) -> str | None:
    """The manifest-text memo, in the private cache under the sha256 of the exact bytes (and tomli-w's version
    and the code that turns a record into them): `digest` given, remember that these bytes are what `dumps` wrote
    for a record of that plain-data digest; else the remembered digest, or None. No usable cache: None."""
    global _text_code_digest
    import tomli_w

    cache = memo_cache() if digest is None or memo_writes() else None
    if cache is None:
        return None
    if _text_code_digest is None:
        pkg = Path(__file__).resolve().parents[1]
        _text_code_digest = hashlib.sha256(b"".join(_sha((pkg / f).read_bytes()).encode() for f in _TEXT_CODE)).hexdigest()
    key = cache_key({"kind": "build-manifest-text", "format": 1, "sha256": _sha(data), "size": len(data),
                     "tomli_w": getattr(tomli_w, "__version__", "?"), "code": _text_code_digest})
    if digest is not None:
        cache.put(key, {"plain_sha256": digest.encode()})
        return None
    parts = cache.get(key, lambda p: None if re.fullmatch(rb"[0-9a-f]{64}", p.get("plain_sha256", b"")) else "bad")
    return parts["plain_sha256"].decode() if parts is not None else None


def _build(req: BuildRequest, stage: OutputStage, progress: ProgressFn | None) -> BuildManifest:
    cache = open_cache(req)
    memo: HeaderMemo = {}
    jobs = plan(req, memo)
    if progress:
        missing = [j for j in jobs if not (cache and cache.has(j.key))]
        progress("plan", PlanSummary(targets=[t.name for t in req.targets], programs=len(jobs),
                                     symbols=sum(len(j.module.symbols) for j in jobs), cached=len(jobs) - len(missing),
                                     symbols_to_compile=sum(len(j.module.symbols) for j in missing),
                                     workers=_workers(req, len(missing))))
    results: dict[int, ModuleBuild] = {}
    pending: list[int] = []
    for i, job in enumerate(jobs):
        decoded: dict = {}
        parts = cache.get(job.key, accept=lambda p, cc=job.target.cc, d=decoded: entry_problem(p, cc, d)) if cache else None
        if parts is not None:
            results[i] = _finish(job, dict(parts, cached=b"1"), stage, decoded.get("meta"))
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
        # longest programs first keeps the pool busy to the end
        pending.sort(key=lambda i: -len(jobs[i].source))
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


def collect_headers_at(base: Path, memo: HeaderMemo | None = None) -> dict[str, bytes]:
    """Every header under an include folder, by relative name (bounded, include-checked: catalog/sources.py);
    read once per build where the caller passes its `memo`."""
    if memo is None:
        return read_headers(base)
    if base not in memo:
        memo[base] = read_headers(base)
    return memo[base]


def _workers(req: BuildRequest, compiles: int) -> int:
    return max(1, min(compiles, req.jobs or os.cpu_count() or 1))


def count_jobs(req: BuildRequest) -> int:
    return sum(len(m.targets(req.targets)) for m in req.catalog.modules)


def timed_build(req: BuildRequest, progress: ProgressFn | None = None) -> tuple[BuildManifest, float]:
    t0 = time.perf_counter()
    manifest = build(req, progress)
    return manifest, time.perf_counter() - t0
