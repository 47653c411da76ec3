"""The catalog's expanded records, what the build and the qualifier consume: `Symbol` (one exported kernel, fully
expanded), `ModuleSpec` (a module with its families loaded and expanded) and `Catalog` (every module, the routes
and the digest of the catalog's files). :mod:`mamba_forge.catalog.model` builds them from the declarative schema
of catalog/entries.py, which still names them (``entries.Catalog``, resolved on first use).
The catalog memo (catalog/memo.py) unpickles these classes from this module, a mamba_forge.catalog.<name> module.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from mamba_forge.catalog.entries import Family, Module, Policy, _Model
from mamba_forge.catalog.targets import Target, gate_admits
from mamba_forge.core.errors import ForgeError


class Symbol(_Model):
    """One exported kernel, fully expanded."""

    name: str
    module: str
    family: str
    dtype: str | None  # the variant dtype, where the family has variants
    params_env: dict[str, int | str]  # instance parameters (tile sizes, dtype keys)
    macro_args: list[str]
    block: tuple[int, int, int]
    dynamic_smem: int
    policy: Policy
    pdl_max_blocks: int = 0  # the family's launch.pdl_max_blocks
    deterministic: bool
    fallback: list[str]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


class ModuleSpec(BaseModel):
    """A module with its families loaded and expanded, ready to compose and build."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    module: Module
    root: Path  # catalog folder: sources and headers resolve relative to it
    families: tuple[Family, ...]
    symbols: tuple[Symbol, ...]
    options: tuple[str, ...]  # defaults + module options (before target and state capacity)

    @property
    def kind(self) -> str:
        return self.module.kind

    def targets(self, wanted: list[Target]) -> list[tuple[Target, str]]:
        """(target, role) pairs this module builds for among `wanted`: role 'qualify' or 'check'."""
        out = []
        for t in wanted:
            if any(gate_admits(g, t) for g in self.module.arch):
                out.append((t, "qualify"))
            elif any(gate_admits(g, t) for g in self.module.check_arch):
                out.append((t, "check"))
        return out

    def built_only(self, target: Target) -> bool:
        return any(gate_admits(g, target) for g in self.module.build_only)

    def family(self, name: str) -> Family:
        found = self._family_index.get(name)
        if found is None:  # as before: StopIteration for a name the module does not have
            return next(f for f in self.families if f.name == name)
        return found

    @cached_property
    def _family_index(self) -> dict[str, Family]:
        """name -> the first family of that name (the build asks once per symbol and target: 2406 times)."""
        index: dict[str, Family] = {}
        for f in self.families:
            index.setdefault(f.name, f)
        return index


class Catalog(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    path: Path
    name: str
    modules: tuple[ModuleSpec, ...]
    route_files: tuple[str, ...] = ()  # route and route tuning files (in the digest)
    routes: tuple = ()  # mamba_forge.catalog.routes.Route records, in file order
    files_sha256: str = ""  # a narrowed catalog's digest: the whole catalog's (see narrowed)

    @cached_property
    def symbols(self) -> dict[str, Symbol]:
        return {s.name: s for m in self.modules for s in m.symbols}

    def module(self, kind: str) -> ModuleSpec:
        for m in self.modules:
            if m.kind == kind:
                return m
        raise ForgeError(f"no module kind {kind!r} in {self.path}", hint=f"known: {[m.kind for m in self.modules]}")

    def narrowed(self, modules: tuple[ModuleSpec, ...]) -> Catalog:
        """This catalog with fewer modules or symbols (`build --module`, `--kernels`): the same path, routes and
        digest, so a filtered build records the catalog it came from."""
        return Catalog(path=self.path, name=self.name, modules=modules, route_files=self.route_files,
                       routes=self.routes, files_sha256=self.digest())

    def digest(self) -> str:
        """sha256 over the catalog's own files (root, family and route files)."""
        if self.files_sha256:
            return self.files_sha256
        h = hashlib.sha256()
        files = {self.path.parent / f for m in self.modules for f in m.module.families}
        files |= {self.path.parent / f for f in self.route_files}
        for p in [self.path] + sorted(files):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
        return h.hexdigest()


__all__ = ["Catalog", "ModuleSpec", "Symbol"]
