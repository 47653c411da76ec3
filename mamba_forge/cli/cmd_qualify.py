"""`mamba-forge qualify`: check every symbol on the attached GPU(s), write a signed qualified manifest."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mamba_forge import cli_json as js
from mamba_forge.cli.common import (
    MAX_JOBS,
    MAX_TIMEOUT_S,
    DryRunOpt,
    JsonOpt,
    QuietOpt,
    article,
    must_exist,
    say,
    say_err,
    stderr,
    stdout,
)
from mamba_forge.core.errors import ForgeError

if TYPE_CHECKING:
    from mamba_forge.qualify.runner import QualifyRequest, QualifyResult


def _parse_devices(text: str) -> list[int] | None:
    """'0', '0,1' or 'all' (None: every GPU of the host)."""
    if text.strip() == "all":
        return None
    try:
        devs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ForgeError(f"--device {text!r} is not an ordinal, a list or 'all'", hint="e.g. --device 0 or --device all") from None
    if not devs or any(d < 0 for d in devs):
        raise ForgeError(f"--device {text!r} names no GPU", hint="e.g. --device 0")
    return devs


def _check_out_file(path: Path, inputs: list[Path], *, create: bool, companions: list[Path] = ()) -> None:
    """qualify --out, before any work: not an input, not a folder, its folder a folder (made unless a dry run);
    nor is any companion file written beside it (X.runtime.json, the <key id>.pub) an input or a folder."""
    from mamba_forge.core.safety import PathRefused, check_output_file, same_file

    try:
        if create:
            check_output_file(path, inputs=inputs, what="--out")
        else:
            for p in inputs:
                if same_file(path, p):
                    raise PathRefused(f"--out {path} is also an input of this command; write it elsewhere")
            if path.is_dir():
                raise PathRefused(f"--out {path} is a folder; name a file")
            for p in path.parents:
                if p.exists() or p.is_symlink():
                    if not p.is_dir():
                        raise PathRefused(f"the folder of --out {path}: {p} exists and is not a folder")
                    break
        for c in companions:
            if any(same_file(c, p) for p in inputs):
                raise PathRefused(f"--out {path} would write {c} beside it, an input of this command; write it elsewhere")
            if c.is_dir():
                raise PathRefused(f"--out {path} would write {c} beside it, which is a folder; write it elsewhere")
    except (PathRefused, OSError) as exc:
        raise ForgeError(str(exc), hint="pass --out manifests/NAME.toml") from None


def _build_files(build_dir: Path, bm) -> list[Path]:
    """Every file a build manifest names: the manifest itself and each module's artifacts."""
    return [build_dir / "manifest.toml", *(build_dir / a.path for m in bm.modules for a in m.artifacts)]


def _catalog_files(cat, outputs: list[Path]) -> list[Path]:
    """The catalog's files: its root, route, family and source files, and (include folders are read whole) each
    output's name inside each include folder."""
    files = [cat.path, *(cat.path.parent / f for f in cat.route_files)]
    for m in cat.modules:
        files += [m.root / f for f in (*m.module.families, *m.module.sources)]
        files += [m.root / inc / p.name for inc in m.module.include for p in outputs]
    return files


def _read_build(build_dir: Path):
    from mamba_forge.core.schema import BuildManifest
    from mamba_forge.manifest.toml_io import read

    if not build_dir.is_dir():
        raise ForgeError(f"--build {build_dir} is not a folder", hint="pass the --out folder of `mamba-forge build`")
    try:
        return read(build_dir / "manifest.toml", BuildManifest)
    except ForgeError as exc:
        raise ForgeError(f"--build {build_dir}: {exc.message}", hint="pass the --out folder of `mamba-forge build`") from None


def qualify(
    device: Annotated[str, typer.Option("--device", metavar="GPU", help="GPU ordinal, a list (0,1) or 'all'.")] = "0",
    build_dir: Annotated[Path | None, typer.Option("--build", metavar="DIR", help="A build folder (manifest.toml); default: build now.")] = None,
    catalog: Annotated[Path | None, typer.Option("--catalog", metavar="FILE", help="Catalog TOML (default: the built-in one).")] = None,
    level: Annotated[str, typer.Option("--level", metavar="LEVEL", help="quick (5 repeats) or full (50 repeats).")] = "quick",
    sanitize: Annotated[bool | None, typer.Option("--sanitize/--no-sanitize", help="Run small launches under compute-sanitizer (memcheck, racecheck, synccheck, initcheck). Default: at --level full when compute-sanitizer is found.")] = None,
    sign_key: Annotated[Path | None, typer.Option("--sign-key", metavar="KEY", help="Ed25519 private key (PEM).")] = None,
    out_path: Annotated[Path | None, typer.Option("--out", metavar="FILE", help="Signed manifest path (default manifests/<GPU>-<level>.toml).")] = None,
    module: Annotated[list[str] | None, typer.Option("--module", metavar="KIND", help="Only these module kinds (repeatable).")] = None,
    kernels: Annotated[list[str] | None, typer.Option("--kernels", metavar="GLOB", help="Only symbols matching this glob (repeatable), e.g. 'gemm_bi_*'.")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", metavar="SECONDS", min=1.0, max=MAX_TIMEOUT_S, help="Seconds a launch may take before it counts as hung (default: 50x the symbol's first launch + 1 s, at least 2 s).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", metavar="N", min=0, max=2**63 - 1, help="Base seed of the random inputs (default: fresh).")] = None,
    state_cap: Annotated[int, typer.Option("--state-cap", metavar="N", help="d_state capacity when building here.")] = 64,
    jobs: Annotated[int, typer.Option("--jobs", "-j", metavar="N", min=0, max=MAX_JOBS, help=f"Concurrent workers per GPU (0: one per two CPUs, 2 to 8; at most {MAX_JOBS}).")] = 0,
    dry_run: DryRunOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Qualify every symbol that targets the attached GPU(s) and write a signed qualified manifest."""
    from mamba_forge.core.codec import to_dict
    from mamba_forge.qualify import keys, runner
    from mamba_forge.report.qualify import render_qualify_summary

    # the checks are host work as much as GPU work (references, comparisons): 8 workers qualified the catalog in
    # 27 s on the H200's 16-CPU host, where 4 took 107 s with larger shapes; a small host gets fewer
    jobs = jobs or auto_qualify_jobs()
    if level not in ("quick", "full"):
        raise ForgeError(f"--level {level!r} is neither quick nor full", hint="use --level quick or --level full")
    devices = _parse_devices(device)
    for p, what in ((catalog, "--catalog"), (sign_key, "--sign-key")):
        if p is not None:
            must_exist(p, what, f"pass an existing file to {what} or leave it out")
    from mamba_forge.core.cache import memo_writes_off

    with memo_writes_off(dry_run):  # a dry run writes nothing, memos included
        bm = _read_build(build_dir) if build_dir is not None else None  # before the GPU: bad input is one line
    # inputs: the catalog, the key and every file of the build (the unnarrowed manifest names them all)
    inputs = [p for p in (catalog, sign_key) if p is not None]
    inputs += _build_files(build_dir, bm) if bm is not None else []
    if bm is not None and kernels:
        from mamba_forge.qualify.plan import narrow_build

        bm = narrow_build(bm, kernels)
    if out_path is not None:
        _check_out_file(out_path, inputs, create=not dry_run, companions=keys.written_paths(out_path, None)[1:])
    if dry_run:
        with memo_writes_off():
            _qualify_dry_run(devices, bm, build_dir, catalog, level, sanitize, module, jobs, quiet, as_json)
        return
    req, info = runner.prepare_request(
        devices, build_dir, catalog, level=level, sanitize=sanitize, timeout_s=timeout, seed=seed,
        modules=module, state_cap=state_cap, say=say_err, jobs=jobs,
        kernels=kernels, build_manifest=bm,
    )
    key = keys.resolve_key(sign_key)
    if key.development and not quiet:
        stderr().print(f"note: no --sign-key and no $MAMBA_FORGE_SIGNING_KEY: signing with the {key.source}; "
                  "the manifest is marked development_key = true", markup=False, highlight=False)
    dest = out_path or Path("manifests") / f"{info.name.replace(' ', '-')}-{level}.toml"
    # now every input is known: the catalog's files, a build made just now, the key file: none may be written
    outputs = keys.written_paths(dest, key)
    if build_dir is None:
        inputs += _build_files(req.build_dir, _read_build(req.build_dir) if kernels else req.build)
    inputs += _catalog_files(req.catalog, outputs)
    inputs += [key.path, key.path.with_suffix(".pub")] if key.path is not None else []
    _check_out_file(dest, inputs, create=True, companions=outputs[1:])
    result = _qualify_with_progress(req, info.cc, quiet=quiet)
    for n in result.notes if not quiet else ():
        say_err(f"note: {n}")
    path, pub = keys.write_signed(result.manifest, key, dest)
    if as_json:
        js.emit({"path": str(path), "public_key": str(pub), "notes": list(result.notes),
                 "manifest": to_dict(result.manifest)})
    elif not quiet:
        render_qualify_summary(result.manifest, stdout())
        say(f"signed manifest -> {path} (public key {pub}); qualified in "
              f"{result.manifest.qualification_seconds:.1f} s")


def _qualify_dry_run(devices, bm, build_dir, catalog, level, sanitize, module, jobs, quiet, as_json) -> None:
    """The launch plan: on the attached GPU's compute capability, else (no GPU) on the build's first target's."""
    from mamba_forge.catalog.model import default_catalog_path, load_catalog
    from mamba_forge.catalog.targets import get_target
    from mamba_forge.dryrun import qualify_plan, render_qualify_plan
    from mamba_forge.gpu import driver as cu
    from mamba_forge.qualify.runner import QualifyRequest

    cat = load_catalog(catalog or default_catalog_path())
    if module:
        unknown = sorted(set(module) - {m.kind for m in cat.modules})
        if unknown:
            raise ForgeError(f"--module {unknown[0]!r}: no such module kind", hint=f"known: {', '.join(m.kind for m in cat.modules)}")
    try:
        count = cu.device_count()
        info = cu.Device((devices or [0])[0]).info() if count else None
    except cu.CudaError:
        info = None
    if info is not None:
        cc, name, source = info.cc, info.name, "the attached GPU"
    elif bm is not None and bm.targets:
        t = get_target(bm.targets[0])
        cc, name, source = (t.cc // 10, t.cc % 10), f"{article(t.family)} GPU", f"no GPU here: the build's target {t.name}"
    else:
        raise ForgeError("qualify --dry-run needs a GPU or --build DIR to plan for",
                         hint="pass --build with the folder of `mamba-forge build`")
    if bm is None:
        raise ForgeError("qualify --dry-run plans the launches of a build", hint="pass --build DIR (build first)")
    passes = QualifyRequest(build_dir=build_dir, build=bm, catalog=cat, devices=devices or [0], level=level,
                            sanitize=sanitize).passes
    p = qualify_plan(bm, cc, only_modules=set(module) if module else None, level=level, passes=passes,
                     devices=devices if devices is not None else list(range(max(1, count if info else 1))), jobs=jobs,
                     device_name=name, cc_source=source)
    if as_json:
        js.emit(p)
    elif not quiet:
        for line in render_qualify_plan(p):
            say(line)


def _qualify_with_progress(req: QualifyRequest, cc: tuple[int, int], *, quiet: bool = False) -> QualifyResult:
    """runner.qualify() reporting through progress.py on stderr: a bar on a terminal, else one line per
    finished symbol; each rejection as it comes."""
    import time

    from mamba_forge import progress
    from mamba_forge.qualify import runner
    from mamba_forge.qualify.events import Event, Fault, ModuleError, Start, SymbolResult, Timeout
    from mamba_forge.qualify.plan import plan_groups

    total = sum(len(g.symbols) for g in plan_groups(req.build, cc, req.only_modules)) * req.passes * len(req.devices)
    began: dict[tuple[int, str], tuple[str, float]] = {}
    with progress.Progress("qualify", total, stderr(), quiet=quiet) as bar:

        def on_event(dev: int, ev: Event) -> None:
            if isinstance(ev, Start):
                began[(dev, ev.symbol)] = (ev.module, time.monotonic())
                bar.started(f"GPU {dev} {ev.module} {ev.symbol}")
            elif isinstance(ev, SymbolResult | Fault | Timeout):
                module, t0 = began.pop((dev, ev.symbol), ("?", time.monotonic()))
                status = ev.status if isinstance(ev, SymbolResult) else "rejected"
                bar.finished(f"GPU {dev} {module} {ev.symbol}", tag=status, seconds=time.monotonic() - t0)
                if status == "rejected":
                    bar.note(f"  rejected {ev.symbol}: {ev.reason}")
            elif isinstance(ev, ModuleError):
                bar.note(f"  {ev.reason}")

        return runner.qualify(req, on_event, cc_hint=cc)


def auto_qualify_jobs(cpus: int | None = None) -> int:
    """Workers per GPU when --jobs is 0: one per two CPUs, at least 2, at most 8."""
    import os

    n = cpus if cpus is not None else (os.cpu_count() or 2)
    return max(2, min(8, n // 2))
