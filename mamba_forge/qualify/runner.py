"""The qualification, end to end (the orchestration only):

    plan (plan.py) -> supervise workers (supervise.py; the checks run in worker.py, checks.py) -> sanitize
    (sanitize.py) -> compare GPUs (compare.py) -> route classes (equivalence.py) -> assemble the manifest
    (assemble.py) -> sign (keys.py)

Progress reaches the caller through `on_event` (the worker events of events.py); rendering is the CLI's.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mamba_forge.catalog.model import Catalog
from mamba_forge.core.errors import ForgeError
from mamba_forge.core.schema import BuildManifest, QualifiedManifest
from mamba_forge.qualify.assemble import assemble
from mamba_forge.qualify.compare import cross_device
from mamba_forge.qualify.equivalence import apply as route_equivalence
from mamba_forge.qualify.plan import device_targets, narrow_build, plan_groups, shard
from mamba_forge.qualify.sanitize import SANITIZER_TOOLS, apply_sanitizer, sanitizer_available, sanitizer_mode
from mamba_forge.qualify.supervise import (
    DEFAULT_WORKER,
    OnEvent,
    Outcome,
    WorkerSettings,
    in_parallel,
    merge_outcomes,
    run_groups,
)


@dataclass
class QualifyRequest:
    build_dir: Path
    build: BuildManifest
    catalog: Catalog
    devices: list[int]
    level: str = "quick"
    sanitize: bool | None = None  # None: by level (full runs it when compute-sanitizer is found)
    timeout_s: float | None = None  # a fixed budget per launch (--timeout); None: 50x each symbol's first launch + 1 s, >= 2 s
    seed: int | None = None
    only_modules: set[str] | None = None
    worker_command: list[str] | None = None
    jobs: int = 4  # concurrent workers per GPU

    @property
    def passes(self) -> int:
        """Worker passes over each symbol: the main one, then one per sanitizer tool."""
        return 1 + (len(SANITIZER_TOOLS) if self.sanitizer == "ran" else 0)

    @property
    def sanitizer(self) -> str:
        return sanitizer_mode(self.level, self.sanitize)


@dataclass
class QualifyResult:
    manifest: QualifiedManifest
    outcomes: dict[int, Outcome]
    notes: list[str]


def qualify(req: QualifyRequest, on_event: OnEvent | None = None, cc_hint: tuple[int, int] | None = None) -> QualifyResult:
    """Qualify every symbol that targets the device(s); returns the (unsigned) manifest."""
    t0 = time.perf_counter()
    if req.sanitize and not sanitizer_available():
        raise ForgeError("--sanitize needs compute-sanitizer on PATH", hint="install the CUDA toolkit's sanitizer or drop --sanitize")
    seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(6), "little")
    cc = cc_hint or _probe_cc(req)
    groups = plan_groups(req.build, cc, req.only_modules)
    if not groups:
        raise ForgeError(
            f"the build in {req.build_dir} has no module for compute capability {cc[0]}.{cc[1]} "
            f"(built: {', '.join(req.build.targets)})",
            hint=f"build for {', '.join(device_targets(cc)) or 'this GPU'} or omit --build",
        )
    notes: list[str] = []
    outcomes: dict[int, Outcome] = {}

    def one(dev: int) -> None:
        ws = WorkerSettings(req.build_dir, req.catalog.path, dev, req.level, seed, req.timeout_s,
                            command=req.worker_command or list(DEFAULT_WORKER), state_capacity=req.build.state_capacity)
        oc = merge_outcomes(in_parallel(lambda sh: run_groups(sh, ws, on_event), shard(groups, req.jobs)))
        if req.sanitizer == "ran":
            admitted = {n for n, r in oc.results.items() if r.admitted}
            sgroups = [g for g in (g.only(admitted) for g in groups) if g.symbols]
            # the four tools at once (each a shard per job): a worker under a tool is bound by the tool's
            # host-side instrumentation, not by the GPU; verdicts are applied in tool order, not finish order
            tasks = [(WorkerSettings(req.build_dir, req.catalog.path, dev, req.level, seed, req.timeout_s,
                                     command=ws.command, sanitize_tool=tool, state_capacity=ws.state_capacity), sh)
                     for tool in SANITIZER_TOOLS for sh in (shard(sgroups, req.jobs) if sgroups else [])]
            for (sws, _), soc in zip(tasks, in_parallel(lambda t: run_groups(t[1], t[0], on_event, sanitize=True),
                                                        tasks), strict=True):
                apply_sanitizer(oc, soc, sws.sanitize_tool)
        outcomes[dev] = oc

    threads = [threading.Thread(target=one, args=(d,)) for d in req.devices]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if len(req.devices) > 1:
        notes += cross_device(outcomes)
    # rungs of a route class must compute the same bits (judged per GPU; the first GPU's notes are kept)
    notes += [route_equivalence(outcomes[d].results, req.catalog.routes) for d in sorted(outcomes)][0]
    seconds = time.perf_counter() - t0
    manifest = assemble(req, outcomes, groups, seconds)
    return QualifyResult(manifest, outcomes, notes)


def _probe_cc(req: QualifyRequest) -> tuple[int, int]:
    from mamba_forge.gpu import driver as cu

    try:
        info = cu.Device(req.devices[0]).info()
    except cu.CudaError as exc:
        raise ForgeError(f"cannot open GPU {req.devices[0]}: {exc}", hint="check nvidia-smi and --device") from None
    return info.cc


def prepare_request(devices: list[int] | None, build_dir: Path | None, catalog_path: Path | None, *, level: str,
                    sanitize: bool | None, timeout_s: float | None, seed: int | None, modules: list[str] | None, state_cap: int,
                    say: Callable[[str], None], jobs: int = 4, kernels: list[str] | None = None,
                    build_manifest: BuildManifest | None = None):
    """Open the device(s), load the catalog and the build (building for the device's target when none is given).
    `build_manifest`: build_dir's manifest when the caller has read it already (the CLI does, before the GPU, so
    bad input is one line): a 20k-symbol build manifest costs seconds to parse, it is read once. Names in the
    progress lines (`say`) are escaped (errors.printable): a catalog name or folder cannot write escape
    sequences to the terminal."""
    from mamba_forge.build.builder import BuildRequest, build
    from mamba_forge.catalog.model import default_catalog_path, load_catalog, state_capacity
    from mamba_forge.catalog.targets import get_target
    from mamba_forge.core.errors import printable
    from mamba_forge.gpu import driver as cu
    from mamba_forge.manifest.toml_io import read, write

    try:
        count = cu.device_count()
    except cu.CudaError as exc:
        raise ForgeError(f"no usable GPU: {exc}", hint="qualify needs an NVIDIA GPU with a CUDA 13 driver") from None
    devices = list(range(count)) if devices is None else devices
    if not devices or max(devices) >= count:
        raise ForgeError(f"--device {devices}: this host has {count} GPU(s)", hint=f"choose 0..{max(count - 1, 0)} or all")
    infos = [cu.Device(d).info() for d in devices]
    if len({(i.name, i.cc) for i in infos}) > 1:
        raise ForgeError("--device names GPUs of different models", hint="qualify one model per manifest")
    info = infos[0]
    cat = load_catalog(catalog_path or default_catalog_path())
    if build_dir is None:
        targets = sorted(device_targets(info.cc), key=lambda t: not t.endswith("a"))
        if not targets:
            raise ForgeError(f"no known target for compute capability {info.cc_text}")
        build_dir = Path("build") / f"qualify-{targets[0]}"
        say(f"building {printable(cat.name)} for {targets[0]} into {printable(build_dir)} …")
        bm = build(BuildRequest(cat, [get_target(targets[0])], build_dir, state_capacity=state_capacity(state_cap)))
        write(build_dir / "manifest.toml", bm)
    else:
        bm = build_manifest if build_manifest is not None else read(Path(build_dir) / "manifest.toml", BuildManifest)
    bm = narrow_build(bm, kernels)  # the same globs again: a build already narrowed by them stays as it is
    if bm.catalog_sha256 != cat.digest():
        say(f"warning: the build in {printable(build_dir)} was made from a different catalog state; specs come "
            f"from {printable(cat.path)}")
    if modules:
        unknown = set(modules) - {m.kind for m in cat.modules}
        if unknown:
            raise ForgeError(f"--module {sorted(unknown)}: no such module kind", hint=f"known: {[m.kind for m in cat.modules]}")
    req = QualifyRequest(build_dir=Path(build_dir), build=bm, catalog=cat, devices=devices, level=level,
                         sanitize=sanitize, timeout_s=timeout_s, seed=seed,
                         only_modules=set(modules) if modules else None, jobs=jobs)
    return req, info


__all__ = ["QualifyRequest", "QualifyResult", "prepare_request", "qualify"]
