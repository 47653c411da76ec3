"""Assembly of the qualified manifest (manifest_version 2): per symbol of the device's modules, the build verdict,
the worker's verdict (or built-only / untested), the symbol's launch contract (contract.py: the catalog's params,
grid and dims joined with the ABI census), the cubins qualified, and the GEMM route table."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from mamba_forge import __version__
from mamba_forge.core.schema import (
    ModuleBuild,
    QArtifact,
    QCheck,
    QDevice,
    QResources,
    QRoute,
    QRung,
    QSymbol,
    QToolchain,
    QTune,
    QualifiedManifest,
)
from mamba_forge.manifest.qualified import timestamps
from mamba_forge.qualify.contract import contract
from mamba_forge.qualify.events import UNKNOWN_DEVICE, SymbolResult
from mamba_forge.qualify.plan import Group, device_modules
from mamba_forge.qualify.supervise import Outcome

if TYPE_CHECKING:
    from mamba_forge.qualify.runner import QualifyRequest


def assemble(req: QualifyRequest, outcomes: dict[int, Outcome], groups: list[Group], seconds: float) -> QualifiedManifest:
    first = outcomes[min(outcomes)]
    dev = first.device or UNKNOWN_DEVICE
    cc = dev.cc
    run_targets = {(g.module, g.target) for g in groups}
    created, expires = timestamps()
    b = req.build
    artifacts: list[QArtifact] = []
    symbols: list[QSymbol] = []
    sources: dict[str, str] = {}
    cat_syms = req.catalog.symbols
    chosen = device_modules(b, _cc_tuple(cc), req.only_modules) if cc != "?" else set()
    for m in b.modules:
        on_device = (m.kind, m.target) in chosen
        if not on_device and not (m.built_only and (req.only_modules is None or m.kind in req.only_modules)):
            continue
        sources[f"{m.kind}/{m.target}"] = m.source_sha256
        if on_device and m.status == "compiled":
            # Cubins only: they are what was qualified and what the loader loads. NVRTC's PTX is not
            # byte-reproducible (NVVM's register numbering varied between two processes for the Fixed module,
            # while the cubins were identical), so it stays in the build folder and out of the signed manifest.
            for a in (a for a in m.artifacts if a.code == "cubin"):
                artifacts.append(QArtifact(module=m.kind, target=m.target, role=m.role, path=a.path, code=a.code,
                                           size=a.size, sha256=a.sha256))
        for s in m.symbols:
            symbols.append(_symbol_record(m, s, first.results.get(s.name) if (m.kind, m.target) in run_targets else None,
                                          cat_syms.get(s.name), req.catalog, b.state_capacity, on_device))
    routes = route_table(req.catalog.routes, symbols)
    return QualifiedManifest(
        created=created, expires=expires, tool_version=__version__, level=req.level,  # type: ignore[arg-type]
        qualification_seconds=round(seconds, 2), development_key=False, sanitizer=req.sanitizer, catalog=b.catalog,
        catalog_sha256=b.catalog_sha256, state_capacity=b.state_capacity,
        toolchain=QToolchain(nvrtc_version=b.toolchain.nvrtc_version, library=b.toolchain.library,
                             header_sha256=b.toolchain.header_sha256, base_options=b.toolchain.base_options,
                             source_sha256=sources),
        device=QDevice(name=dev.name, cc=cc, sm_count=dev.sm_count, driver_version=dev.driver_version,
                       count=len(outcomes)),
        artifacts=artifacts, symbols=symbols, routes=routes,
    )


def _cc_tuple(text: str) -> tuple[int, int]:
    a, _, b2 = text.partition(".")
    return int(a), int(b2 or 0)


def _launch(m: ModuleBuild, layout: list[list[int]], cat, catalog, state_capacity: int) -> dict:
    """The symbol's launch contract (empty when the catalog no longer declares it)."""
    if cat is None:
        return {}
    return contract(cat, catalog.module(m.kind), layout, state_capacity)


def _symbol_record(m: ModuleBuild, s, rec: SymbolResult | None, cat, catalog, state_capacity: int,
                   on_device: bool) -> QSymbol:
    static_layout = s.resources.param_layout if s.resources else []
    base = dict(name=s.name, module=m.kind, target=m.target, family=s.family, dtype=s.dtype, block=list(s.block),
                dynamic_smem=s.dynamic_smem, deterministic=s.deterministic,
                fallback=list(cat.fallback) if cat is not None else [],
                **_launch(m, static_layout, cat, catalog, state_capacity))
    if s.verdict.status == "rejected":
        return QSymbol(**base, status="rejected", reason=s.verdict.reason, check=s.verdict.check)
    if not on_device:
        return QSymbol(**base, status="built-only",
                       reason=f"no {m.target} GPU here: built and statically admitted only", check="")
    if rec is None:
        return QSymbol(**base, status="rejected", check="untested", reason=f"{s.name}: not qualified in this run")
    status = rec.status
    reason = rec.reason
    if status == "admitted" and m.role == "check":
        status = "checked"  # arithmetic checked on this GPU for another family: never qualified for its own
        reason = f"arithmetic checked on {m.target} for another GPU family; not qualified to serve here"
    res = rec.resources
    checks = [QCheck(**asdict(c)) for c in rec.checks]
    if m.role == "check" and status == "checked":
        checks.append(QCheck(name="role", passed=True, detail=f"checked on {m.target}; not qualified for its own family"))
    if rec.params:  # the live census (cuFuncGetParamInfo) decides the ABI slots of a symbol that ran
        base.update(_launch(m, rec.params, cat, catalog, state_capacity))
    return QSymbol(
        **base,
        status=status, reason=reason, check=rec.check, seed=rec.seed,
        resources=QResources(**asdict(res)) if res else None, checks=checks,
    )


def route_table(routes, symbols: list[QSymbol]) -> list[QRoute]:
    """The manifest's [[routes]]: per catalog route key, its rungs whose symbols this manifest holds on its device
    (admitted or rejected: the runtime serves the admitted ones and reports the rejected), in route order, and the
    key's tuning rules for those rungs (catalog/route_tuning.py). Keys with no such rung are left out."""
    here = {s.name for s in symbols if s.status in ("admitted", "rejected")}
    table = []
    for r in routes:
        rungs = [QRung(symbol=x.symbol, eq_class=x.eq_class, mode=x.mode, m_min=x.m_min, m_max=x.m_max,
                       needs=dict(x.needs), bias=x.bias, n_min=x.n_range[0], n_max=x.n_range[1],
                       k_min=x.k_range[0], k_max=x.k_range[1]) for x in r.rungs() if x.symbol in here]
        tuning = [QTune(eq_class=t.eq_class, symbol=t.symbol, n_min=t.n[0], n_max=t.n[1], k_min=t.k[0],
                        k_max=t.k[1], m_min=t.m[0], m_max=t.m[1]) for t in r.tuning if t.symbol in here]
        if rungs:
            table.append(QRoute(layout=r.layout, a=r.a, b=r.b, c=r.c, symbols=[x.symbol for x in rungs], rungs=rungs,
                                tuning=tuning or None))
    return table


__all__ = ["assemble", "route_table"]
