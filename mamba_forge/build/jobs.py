"""The build's plan: the request, and one job per (module kind x target) it asks for: the module's composed program
(its sources in catalog order, each behind ``#line 1 "<path>"``, then per symbol its generated extern "C" wrapper
(catalog/wrappers.py) or its family's ``MACRO(symbol, args...)`` line), the headers of its include folders (in memory,
by relative name), its NVRTC options and its cache key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from mamba_forge import __version__
from mamba_forge.build import nvrtc
from mamba_forge.catalog import wrappers
from mamba_forge.catalog.model import Catalog, ModuleSpec
from mamba_forge.catalog.sources import check_resolved, read_headers, read_source
from mamba_forge.catalog.targets import Target
from mamba_forge.core.cache import cache_key
from mamba_forge.core.errors import CatalogError

META_VERSION = 4  # the worker's metadata layout (build/worker.py): part of every cache key
BASE_OPTIONS = ["-std=c++17", "--fmad=true", "-DNDEBUG", "--frandom-seed=mamba-forge"]


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
    """The module's one program: its sources in order, then the catalog's instantiations (wrappers, macro lines)."""
    parts = [f"// mamba-forge module {module.kind}: composed from the catalog; do not edit\n"]
    for rel in module.module.sources:
        text = read_source(module.root / rel, f"module {module.kind}: source")
        parts.append(f'#line 1 "{rel}"\n{text}\n')
    lines = []
    for sym in module.symbols:
        line = wrappers.entry_point(module.family(sym.family), sym)
        if line is not None:
            lines.append(line)
    if lines:
        parts.append('#line 1 "<instantiations>"\n' + "\n".join(lines) + "\n")
    return "".join(parts)


def module_options(module: ModuleSpec, target: Target, state_cap: int) -> list[str]:
    opts = list(BASE_OPTIONS) + list(module.options) + [f"-arch={target.name}", "--ptxas-options=-v"]
    if module.module.state_capacity:
        opts.append(f"-DMF_STATE_CAP={state_cap}")
    opts.append(nvrtc.CUDA_INCLUDE_TOKEN)
    return opts


def sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _header_sha(data: bytes, memo_sha: dict[int, tuple[bytes, str]]) -> str:
    """sha256 of a header's bytes, once per build however many modules share them (the memo holds the bytes, so
    an id is never reused for other bytes while it lives)."""
    hit = memo_sha.get(id(data))
    if hit is None or hit[0] is not data:
        hit = memo_sha[id(data)] = (data, sha(data))
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
        source_sha = sha(source)
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



def collect_headers_at(base: Path, memo: HeaderMemo | None = None) -> dict[str, bytes]:
    """Every header under an include folder, by relative name (bounded, include-checked: catalog/sources.py);
    read once per build where the caller passes its `memo`."""
    if memo is None:
        return read_headers(base)
    if base not in memo:
        memo[base] = read_headers(base)
    return memo[base]


def count_jobs(req: BuildRequest) -> int:
    return sum(len(m.targets(req.targets)) for m in req.catalog.modules)
