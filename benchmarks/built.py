"""Kernels a benchmark builds itself (candidates no signed manifest holds yet, check builds for another GPU family),
served through the public runtime: a fresh NVRTC build of some catalog modules into a temporary folder, opened as
a ``mamba_forge.runtime.Kernels`` (run as `python benchmarks/bench_*.py`, so this module is importable as
`built`). Every launch is a runtime Kernel's keyword call (or ``kernels.gemm``): grid, block, dynamic shared
memory, the scalars and the packed arguments come from the symbol's Contract, as an engine's would.

What differs from ``mamba_forge.runtime.load``: nothing here was qualified or signed. Each symbol the build admitted
(statically: ABI, registers, spills) gets the record the qualifier would sign for it (qualify/contract.py
``contract``: the catalog's declaration with the build's ABI census and state capacity) with status "admitted",
and its module's cubin serves under the size and sha256 the build recorded (the loader checks them before
cuModuleLoadData). A module built in the "check" role (another GPU family's tiles, compiled for this target to
check their arithmetic) serves here too: running those is what the check-build benchmarks are for.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace


def built_kernels(modules: Iterable[str], *, kernels: Iterable[str] | None = None, target: str = "sm_90a",
                  catalog: str | Path | None = None, state_capacity: int = 64, prefix: str = "mf-bench-",
                  on_rejected: Callable[[str, str], None] | None = None, backend=None):
    """Build these module kinds (with `kernels`, only the symbols those globs match: an empty selection is refused,
    never taken for every symbol) of `catalog` (default: the repository's) for `target` into a fresh folder, and
    return them as runtime Kernels on device 0. A module that fails to compile stops the caller (SystemExit with its log head); `on_rejected(symbol, reason)` hears each
    symbol the build rejected (default: printed). `backend`: the runtime's GPU backend (default CudaBackend();
    the CPU tests pass a fake)."""
    from mamba_forge.build.builder import BuildRequest, build
    from mamba_forge.catalog.model import default_catalog_path, load_catalog
    from mamba_forge.catalog.targets import get_target
    from mamba_forge.core.schema import QArtifact, RuntimeSymbol
    from mamba_forge.qualify.assemble import route_table
    from mamba_forge.qualify.contract import contract
    from mamba_forge.runtime import CudaBackend, Kernels
    from mamba_forge.runtime.sources import Source

    if kernels is not None:
        kernels = tuple(kernels)
        if not kernels:
            raise SystemExit("no symbol selected to build (check --only and the like)")
    cat = load_catalog(Path(catalog) if catalog else default_catalog_path())
    out = Path(tempfile.mkdtemp(prefix=prefix))
    man = build(BuildRequest(cat, [get_target(target)], out, state_capacity=state_capacity,
                             kernels=kernels or (), modules=tuple(modules)))
    artifacts, symbols = [], []
    for mod in man.modules:
        if mod.target != target:
            continue
        if mod.status != "compiled":
            raise SystemExit(f"{mod.kind} failed to compile:\n{mod.log_head}")
        cubin = next(a for a in mod.artifacts if a.code == "cubin")
        artifacts.append(QArtifact(module=mod.kind, target=target, role="qualify", path=cubin.path, code="cubin",
                                   size=cubin.size, sha256=cubin.sha256))
        for s in mod.symbols:
            if s.verdict.status != "admitted":
                (on_rejected or _print_rejected)(s.name, s.verdict.reason)
                continue
            fields = contract(cat.symbols[s.name], cat.module(mod.kind), s.resources.param_layout, man.state_capacity)
            symbols.append(RuntimeSymbol(name=s.name, module=mod.kind, target=target, family=s.family, dtype=s.dtype,
                                         status="admitted", block=list(s.block), dynamic_smem=s.dynamic_smem,
                                         deterministic=s.deterministic, **fields))
    table = SimpleNamespace(artifacts=artifacts, symbols=symbols, routes=route_table(cat.routes, symbols))
    backend = backend or CudaBackend()
    built = Kernels(SimpleNamespace(manifest=table, source=Source(label=f"build folder {out}", root=out)),
                    backend.device_info(0), backend)
    backend.activate(0)
    return built


def _print_rejected(name: str, reason: str) -> None:
    print(f"{name}: not admitted ({reason})")


def contract_kwargs(kern, dims: dict, tensor: Callable) -> dict:
    """Keyword arguments for runtime Kernel `kern` at `dims`, all from its Contract (Contract.at): each pointer
    parameter a tensor(param, element count) of the caller's making, each scalar at the contract's value there
    (the qualified value of a literal one), and each dim no scalar carries."""
    c = kern.contract
    at = c.at({d: dims[d] for d in c.dims})
    kwargs = {p.name: tensor(p, at.counts[p.name]) for p in kern.param_specs if p.kind == "pointer"}
    kwargs.update({name: value for name, (_type, value) in at.scalars.items()})
    kwargs.update({d: v for d, v in at.dims.items() if d in c.accepted and d not in kwargs})
    return kwargs


def launcher_at(kern, dims: dict, tensor: Callable):
    """(launch, bytes moved): kern's keyword launch at `dims` on contract_kwargs' arguments (made once: the timed
    call pays only the launch), and the bytes it reads and writes (bytes_moved)."""
    kwargs = contract_kwargs(kern, dims, tensor)
    return (lambda: kern(**kwargs)), bytes_moved(kern, kwargs)


def uniform_tensors(ranges: dict[str, tuple[float, float]]) -> Callable:
    """contract_kwargs' `tensor`: each pointer uniform in ranges[its name] (default [-1, 1)), drawn on the GPU
    (common.device_values: integer counters and steps zero)."""
    from common import device_values  # benchmarks/common.py

    return lambda p, count: device_values(count, p.dtype, *ranges.get(p.name, (-1.0, 1.0)))


def bytes_moved(kern, kwargs: dict) -> int:
    """Bytes a launch with `kwargs` reads and writes: every pointer's tensor once, an in/out one twice."""
    from mamba_forge.core.vocab import DTYPE_SIZES

    return sum(kwargs[p.name].numel() * DTYPE_SIZES[p.dtype] * (2 if p.role == "inout" else 1)
               for p in kern.param_specs if p.kind == "pointer")
