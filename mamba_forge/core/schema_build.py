"""The build manifest's records (build/manifest.toml): BuildManifest with its ModuleBuild, SymbolBuild, Resources,
Verdict, Artifact and Toolchain. Standard library only; part of the one schema (core/schema.py re-exports them;
core/codec.py converts them)."""

from __future__ import annotations

from dataclasses import field
from typing import Literal

from mamba_forge.core.record import record

BUILD_SCHEMA = 1  # build manifest schema_version


@record
class Resources:
    """Static resources of one symbol on one target (cubin + ptxas log)."""

    registers: int
    static_smem: int  # user static shared memory (excludes the 1 KB the system reserves on sm_90+)
    stack_frame: int
    spill_stores: int
    spill_loads: int
    max_threads: int  # from __launch_bounds__; 0 when the kernel declares none
    barriers: int
    param_bytes: int
    param_layout: list[list[int]] = field(default_factory=list)  # [offset, size] per parameter, in order


@record
class Verdict:
    status: Literal["admitted", "rejected"]
    reason: str = ""  # names the symbol, the figure and the limit when rejected
    check: str = ""  # the check that decided: "registers", "smem", "spills", "exports", "float-atomics", ...


@record
class SymbolBuild:
    name: str
    family: str
    dtype: str = ""
    block: list[int]
    dynamic_smem: int
    deterministic: bool
    resources: Resources | None = None  # absent when the module failed to compile or the symbol is missing
    verdict: Verdict
    # static notes that do not reject: reads of placement-dependent special registers (build/admit.py)
    warnings: list[str] | None = None


@record
class Artifact:
    path: str  # relative to the build folder
    sha256: str
    size: int
    code: Literal["cubin", "ptx"]


@record
class ModuleBuild:
    kind: str
    target: str
    role: Literal["qualify", "check"]  # "check": built only to check arithmetic on another family's GPU
    built_only: bool = False  # no GPU of this family is reachable to qualify it
    mandatory: bool
    status: Literal["compiled", "failed"]
    log_head: str = ""  # first lines of the NVRTC log when the compile failed
    options: list[str]
    source_sha256: str  # the composed program
    cache_key: str
    cached: bool = False
    compile_seconds: float = 0.0
    artifacts: list[Artifact] = field(default_factory=list)
    symbols: list[SymbolBuild] = field(default_factory=list)
    foreign_exports: list[str] = field(default_factory=list)


@record
class Toolchain:
    nvrtc_version: str
    library: dict[str, str]  # wheel versions and the loaded libnvrtc digest
    header_sha256: dict[str, str]  # every project header the programs may include
    base_options: list[str]


@record
class BuildManifest:
    schema_version: Literal[1] = BUILD_SCHEMA
    kind: Literal["build"] = "build"
    tool_version: str
    catalog: str  # catalog name
    catalog_sha256: str
    state_capacity: int
    targets: list[str]
    toolchain: Toolchain
    modules: list[ModuleBuild]

    def symbols(self):
        for m in self.modules:
            for s in m.symbols:
                yield m, s

    def failed_mandatory(self) -> list[ModuleBuild]:
        return [m for m in self.modules if m.mandatory and m.status == "failed"]
