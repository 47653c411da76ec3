"""Typed records that flow one way between the stages: build -> admit -> (qualify) -> manifest -> report.

They are pydantic models so that a manifest written with tomli-w reads back (tomllib) into the same objects.
TOML has no null: optional fields are left out when None (see manifest.dump).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BUILD_SCHEMA = 1


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Resources(Record):
    """Static resources of one symbol on one target (cubin + ptxas log)."""

    registers: int
    static_smem: int  # user static shared memory (excludes the 1 KB the system reserves on sm_90+)
    stack_frame: int
    spill_stores: int
    spill_loads: int
    max_threads: int  # from __launch_bounds__; 0 when the kernel declares none
    barriers: int
    param_bytes: int
    param_layout: list[list[int]] = Field(default_factory=list)  # [offset, size] per parameter, in order


class Verdict(Record):
    status: Literal["admitted", "rejected"]
    reason: str = ""  # names the symbol, the figure and the limit when rejected
    check: str = ""  # the check that decided: "registers", "smem", "spills", "exports", "float-atomics", ...


class SymbolBuild(Record):
    name: str
    family: str
    dtype: str = ""
    block: list[int]
    dynamic_smem: int
    deterministic: bool
    resources: Resources | None = None  # absent when the module failed to compile or the symbol is missing
    verdict: Verdict


class Artifact(Record):
    path: str  # relative to the build folder
    sha256: str
    size: int
    code: Literal["cubin", "ptx"]


class ModuleBuild(Record):
    kind: str
    target: str
    role: Literal["qualify", "check"]  # "check": built only to check arithmetic on another family's GPU
    built_only: bool = False  # no GPU of this family is reachable to qualify it: the manifest says so
    mandatory: bool
    status: Literal["compiled", "failed"]
    log_head: str = ""  # first lines of the NVRTC log when the compile failed
    options: list[str]
    source_sha256: str  # the composed program
    cache_key: str
    cached: bool = False
    compile_seconds: float = 0.0
    artifacts: list[Artifact] = Field(default_factory=list)
    symbols: list[SymbolBuild] = Field(default_factory=list)
    foreign_exports: list[str] = Field(default_factory=list)


class Toolchain(Record):
    nvrtc_version: str
    library: dict[str, str]  # wheel versions and the loaded libnvrtc digest
    header_sha256: dict[str, str]  # every project header the programs may include
    base_options: list[str]


class BuildManifest(Record):
    schema_version: int = BUILD_SCHEMA
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
