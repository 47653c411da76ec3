"""A compiled program's record: each symbol's resources read from the worker's metadata (the ELF and the ptxas
log), its admission verdict, the artifacts added to the build's output, and the compile log's head on a failure."""

from __future__ import annotations

import json

from mamba_forge.build import admit, nvrtc
from mamba_forge.build.jobs import Job, sha
from mamba_forge.build.outputs import OutputStage
from mamba_forge.build.worker import ARTIFACT_PARTS
from mamba_forge.catalog.compile_rules import redact_log
from mamba_forge.catalog.model import Symbol
from mamba_forge.catalog.targets import SMEM_RESERVED_BYTES, Target
from mamba_forge.core.cache import DIGEST_PREFIX, SIZE_PREFIX
from mamba_forge.core.schema import Artifact, ModuleBuild, Resources, SymbolBuild, Verdict
from mamba_forge.core.vocab import PDL_MIN_CC

LOG_HEAD_LINES = 12


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
            if (verdict.status == "admitted" and sym.pdl_max_blocks and job.target.cc >= PDL_MIN_CC.number
                    and sym.name not in meta["pdl_waits"]):
                verdict = admit.reject_pdl_without_wait(sym, job.target)
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


def artifact_path(job: Job, code: str) -> str:
    """Where a program's cubin or ptx goes inside the output folder."""
    return f"{job.target.name}/{job.module.kind}.{code}"


def _finish(job: Job, parts: dict[str, bytes], out: OutputStage, meta: dict | None = None) -> ModuleBuild:
    """The module's record from its compile result (`meta`: its metadata, when the caller decoded it already).
    A cubin or ptx left unread in the cache (only its digest and size in `parts`) must be one `out` holds."""
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
        source_sha256=sha(job.source),
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
    for code in ARTIFACT_PARTS:
        data = parts.get(code)
        size = len(data) if data is not None else int(parts[SIZE_PREFIX + code])
        if not size:
            continue
        rel = artifact_path(job, code)
        got = parts.get(DIGEST_PREFIX + code)  # a cache hit's verified digest: no second pass over the bytes
        digest = got.decode() if got else sha(data)  # type: ignore[arg-type]
        if data is not None:
            out.add(rel, data, digest)
        elif not out.current(rel, digest):
            raise ValueError(f"{rel}: its bytes were left unread in the cache, yet the output does not hold them")
        record.artifacts.append(Artifact(path=rel, sha256=digest, size=size, code=code))  # type: ignore[arg-type]
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
