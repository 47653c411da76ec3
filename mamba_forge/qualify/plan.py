"""Planning: which (module, target) pairs of a build run on the attached GPU, the groups of symbols to qualify
there (those admitted at build), and how they are shared out among concurrent workers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mamba_forge.catalog.targets import TARGETS
from mamba_forge.core.schema import BuildManifest


@dataclass
class Group:
    module: str
    target: str
    role: str
    cubin: str | None
    ptx: str | None
    symbols: list[dict]  # {"name", "build_layout", "placement_warned"}

    def job(self, names: set[str] | None = None) -> dict:
        syms = [s for s in self.symbols if names is None or s["name"] in names]
        return {"module": self.module, "target": self.target, "role": self.role, "cubin": self.cubin, "ptx": self.ptx,
                "symbols": syms}

    def only(self, names: set[str]) -> Group:
        """This group with just the symbols named (e.g. those admitted, for the sanitizer passes)."""
        return Group(self.module, self.target, self.role, self.cubin, self.ptx,
                     [s for s in self.symbols if s["name"] in names])

def narrow_build(build: BuildManifest, globs: list[str] | None) -> BuildManifest:
    """`qualify --kernels GLOB`: the build with only the symbols matching a glob (fnmatch, case-sensitive), modules
    left without any dropped; the manifest then names only those. A glob that matches nothing is bad input."""
    if not globs:
        return build
    from fnmatch import fnmatchcase

    from mamba_forge.catalog.select import MAX_GLOB
    from mamba_forge.core.errors import ForgeError

    for g in globs:
        if not g or len(g) > MAX_GLOB:
            raise ForgeError(f"--kernels {g[:40]!r} is {'empty' if not g else 'too long'}",
                             hint="pass a glob over symbol names, e.g. --kernels 'gemm_bi_*'")
    modules, matched = [], set()
    for m in build.modules:
        keep = [s for s in m.symbols if any(fnmatchcase(s.name, g) for g in globs)]
        matched.update(g for g in globs for s in keep if fnmatchcase(s.name, g))
        if keep:
            modules.append(dataclasses.replace(m, symbols=keep))
    missing = [g for g in globs if g not in matched]
    if missing:
        raise ForgeError(f"--kernels {missing[0]!r} matches no symbol of the build",
                         hint="`mamba-forge report BUILD/manifest.toml --symbols '*'` lists them")
    return dataclasses.replace(build, modules=modules)


def device_targets(cc: tuple[int, int]) -> list[str]:
    """Targets whose cubins run on a device of this compute capability (cubins are exact-cc here)."""
    return [t.name for t in TARGETS.values() if t.cc == cc[0] * 10 + cc[1]]


def device_modules(build: BuildManifest, cc: tuple[int, int], only_modules: set[str] | None = None) -> set[tuple[str, str]]:
    """(module kind, target) pairs of the build that this device runs: one target per module kind, the
    arch-specific one first (sm_90a before sm_90), so a symbol name appears once per manifest."""
    prefer = sorted(device_targets(cc), key=lambda t: not t.endswith("a"))
    chosen: dict[str, str] = {}
    for t in prefer:
        for m in build.modules:
            if m.target == t and not m.built_only and m.kind not in chosen:
                if only_modules is None or m.kind in only_modules:
                    chosen[m.kind] = t
    return set(chosen.items())


def plan_groups(build: BuildManifest, cc: tuple[int, int], only_modules: set[str] | None = None) -> list[Group]:
    """One group per compiled (module, target) that runs on this device, holding the symbols admitted at build."""
    on_device = device_modules(build, cc, only_modules)
    groups = []
    for m in build.modules:
        if (m.kind, m.target) not in on_device or m.status != "compiled":
            continue
        cubin = next((a.path for a in m.artifacts if a.code == "cubin"), None)
        ptx = next((a.path for a in m.artifacts if a.code == "ptx"), None)
        syms = [
            {"name": s.name, "build_layout": s.resources.param_layout if s.resources else [],
             # the build saw it read %smid, %clock...: the placement check runs it more often
             "placement_warned": any(w.startswith("warning:") for w in s.warnings or [])}
            for s in m.symbols
            if s.verdict.status == "admitted"
        ]
        if syms:
            groups.append(Group(m.kind, m.target, m.role, cubin, ptx, syms))
    return groups


def shard(groups: list[Group], n: int) -> list[list[Group]]:
    """Split the symbols over n workers (round robin within each group; each worker loads the modules it needs).
    Workers on one GPU overlap one another's host work (inputs, references, comparisons) with GPU work."""
    n = max(1, n)
    shards: list[list[Group]] = [[] for _ in range(n)]
    for g in groups:
        for i in range(n):
            part = g.symbols[i::n]
            if part:
                shards[i].append(Group(g.module, g.target, g.role, g.cubin, g.ptx, part))
    return [s for s in shards if s]


__all__ = ["Group", "device_modules", "device_targets", "plan_groups", "shard"]
