"""`mamba-forge build`: compile every module kind for the targets, read resources, admit each symbol."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mamba_forge import cli_json as js
from mamba_forge.catalog.targets import DEFAULT_TARGETS  # the help names the one default list
from mamba_forge.cli.common import MAX_JOBS, DryRunOpt, JsonOpt, QuietOpt, plural, say, say_err, stderr, stdout
from mamba_forge.core.errors import ForgeError


def build(
    arch: Annotated[
        list[str] | None,
        typer.Option("--arch", metavar="ARCH", help="Target architecture(s): sm_90a, 9.0a (TORCH_CUDA_ARCH_LIST "
                     "spelling), all or native; repeat or comma-separate. Default: $MAMBA_FORGE_ARCH, else "
                     f"$TORCH_CUDA_ARCH_LIST, else {','.join(DEFAULT_TARGETS)}."),
    ] = None,
    kernels: Annotated[
        list[str] | None,
        typer.Option("--kernels", metavar="GLOB", help="Only symbols whose name matches this glob (repeatable), "
                     "e.g. 'softplus*'."),
    ] = None,
    module: Annotated[
        list[str] | None, typer.Option("--module", metavar="KIND", help="Only this module kind (repeatable), e.g. Fixed.")
    ] = None,
    catalog: Annotated[Path | None, typer.Option("--catalog", metavar="FILE", help="Catalog TOML (default: the built-in one).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", metavar="DIR", help="Output folder for artifacts and manifest.toml.")] = Path("build"),
    jobs: Annotated[int, typer.Option("--jobs", "-j", metavar="N", min=0, max=MAX_JOBS, help=f"Worker processes (0: one per CPU; at most {MAX_JOBS}).")] = 0,
    state_cap: Annotated[int, typer.Option("--state-cap", metavar="N", help="Largest d_state to support (rounded up to 16s).")] = 64,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Build without the private cache.")] = False,
    dry_run: DryRunOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Compile every module kind for the target architectures, read resources and admit each symbol."""
    import os

    from mamba_forge import progress
    from mamba_forge.build.builder import BuildRequest, count_jobs, timed_build
    from mamba_forge.catalog.model import default_catalog_path, load_catalog, state_capacity
    from mamba_forge.catalog.targets import get_target, select_targets
    from mamba_forge.core.cache import memo_writes_off, memos_off
    from mamba_forge.core.safety import PathRefused, prepare_output_dir

    chosen = select_targets(arch, os.environ)
    targets = [get_target(n) for n in chosen.names]
    cap = state_capacity(state_cap)
    with memo_writes_off(dry_run), memos_off(no_cache):  # a dry run writes nothing; --no-cache uses no memo
        cat = load_catalog(catalog or default_catalog_path())
    _check_globs(kernels or (), [s.name for m in cat.modules for s in m.symbols], cat.path, out_dir)
    _check_catalog_apart(cat, [t.name for t in targets], out_dir)  # a dry run too: it says what the build does
    req = BuildRequest(cat, targets, out_dir, jobs=jobs, state_capacity=cap, cache_location=None if no_cache else "default",
                       kernels=tuple(kernels or ()), modules=tuple(module or ()),  # bad input leaves no --out behind
                       write_manifest=True)  # renamed in with the artifacts: a failed build keeps the old one
    for note in chosen.notes if not quiet else ():
        say_err(f"note: {note}")
    if dry_run:
        from mamba_forge.dryrun import build_plan, render_build_plan

        with memo_writes_off():
            p = build_plan(req)
        if as_json:
            js.emit(p)
        elif not quiet:
            for line in render_build_plan(p):
                say(line)
        return
    try:  # a bad --out is one line before anything compiles
        prepare_output_dir(out_dir, what="--out folder")
    except PathRefused as exc:
        raise ForgeError(str(exc)) from None
    # -q: no console at all (rich is not imported for a quiet build that succeeds)
    with progress.Progress("build", count_jobs(req), None if quiet else stderr(), quiet=quiet) as bar:

        def on_event(kind: str, rec) -> None:
            if kind == "plan":
                # programs weighed by their symbols: a Fixed program takes 60 s, most others a few
                queue = rec.order
                bar.begin(_header(rec, max((w for _, w in queue), default=0)), timed=rec.programs - rec.cached,
                          workers=rec.workers, prior_s=PRIOR_SECONDS_PER_SYMBOL, weight=rec.symbols_to_compile,
                          queue=queue)
            elif kind == "done" and rec is not None:
                bar.finished(f"{rec.kind} {rec.target}", seconds=None if rec.cached else rec.compile_seconds,
                             tag="cached" if rec.cached else "", weight=len(rec.symbols))

        with memos_off(no_cache):
            manifest, seconds = timed_build(req, on_event)
    for w in req.warnings if not quiet else ():
        say_err(f"warning: {w}")
    failed = manifest.failed_mandatory()
    names = ", ".join(f"{m.kind} ({m.target})" for m in failed)
    if as_json:
        from mamba_forge.core.codec import to_dict

        js.emit({"path": str(out_dir / "manifest.toml"), "seconds": round(seconds, 3),
                 "failed_mandatory": [f"{m.kind} ({m.target})" for m in failed], "manifest": to_dict(manifest)},
                ok=not failed)
    elif not quiet:
        from mamba_forge.report.tables import render_build  # rich's tables: not imported for -q or --json

        render_build(manifest, stdout())
        n_sym = sum(1 for _ in manifest.symbols())
        n_rej = sum(1 for _, s in manifest.symbols() if s.verdict.status == "rejected")
        say(f"built {plural(len(manifest.modules), 'program')}, {plural(n_sym, 'symbol')} ({n_rej} rejected) in "
            f"{seconds:.2f}s -> {out_dir / 'manifest.toml'}")
    if failed:
        stderr().print(f"error: mandatory module failed to compile: {names}; see the log above or `mamba-forge report`",
                  markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)


# A program's compile time before any has finished here, by its symbols: the default catalog's 41 programs (2083
# symbols) for the 8 default targets took 240 s on 2 cores with a cold cache (2026-12-03; 32 min on a shared
# machine on 2026-12-01), about 0.23 s of one core a symbol. A rough prior (the GEMM programs take longer a symbol
# than the elementwise ones), replaced by the finished programs' time per symbol as soon as there is one.
PRIOR_SECONDS_PER_SYMBOL = 0.23


def _header(plan, largest: int = 0) -> str:
    """The build's first line: what it will compile, what the cache already holds, and roughly how long
    (`largest`: the symbols of the largest program the build may compile)."""
    from mamba_forge.progress import about

    to_compile = plan.programs - plan.cached
    head = (f"build: {plural(plan.programs, 'program')}, {plural(plan.symbols, 'symbol')} for "
            f"{plural(len(plan.targets), 'target')} ({', '.join(plan.targets)}); {plan.cached} cached, "
            f"{to_compile} to compile")
    if not to_compile:
        return head
    guess = first_guess_s(plan.symbols_to_compile, to_compile, plan.workers, largest)
    return head + f" with {plural(plan.workers, 'worker')} ({about(guess)}, a first guess)"


def first_guess_s(symbols: int, programs: int, workers: int, largest: int) -> float:
    """The build's time before any program has finished: its `symbols` spread over the workers, but never less
    than its largest program (`largest` symbols, at most all of them: which programs the cache holds is not
    known yet), which one worker compiles alone (the default catalog's Fixed program: 6 of its 7 minutes)."""
    per_worker = symbols / max(1, min(workers, programs))
    return PRIOR_SECONDS_PER_SYMBOL * max(per_worker, min(largest, symbols))


def _check_globs(globs, names: list[str], catalog_path, out_dir: Path) -> None:
    """A --kernels glob that matches no symbol of the catalog, with a hint that works before anything is built:
    the closest names, else the name prefixes the catalog has (empty or overlong globs: catalog.select says)."""
    from difflib import get_close_matches
    from fnmatch import fnmatchcase

    for g in globs:
        if not g or len(g) > 200 or any(fnmatchcase(n, g) for n in names):
            continue
        built = out_dir / "manifest.toml"
        close = get_close_matches(g.strip("*?[]"), names, n=3, cutoff=0.5)
        if close:
            hint = "close: " + ", ".join(close)
        else:
            prefixes = sorted({n.split("_", 1)[0] for n in names})
            hint = "its symbol names start with " + ", ".join(f"{p}_" for p in prefixes[:12]) + (
                f" and {len(prefixes) - 12} more" if len(prefixes) > 12 else "")
        if built.is_file():
            hint += f"; `mamba-forge report {built}` lists what was built there"
        raise ForgeError(f"--kernels {g!r} matches no symbol of {catalog_path}", hint=hint)


def _check_catalog_apart(cat, target_names: list[str], out_dir: Path) -> None:
    """The build never writes over its catalog: no file the catalog loads (root, family, route and source files,
    the headers of its include folders) is O/manifest.toml, O/.mamba-forge.lock or an artifact O/<target>/<Kind>.*
    (the same file after symlinks and hard links), nor lies in a folder O/<target> the build writes artifacts
    into. The catalog's folder may otherwise hold O or lie in it (`--out .` from a checkout): those names are the
    build's only writes there."""
    from mamba_forge.build.outputs import LOCK_NAME
    from mamba_forge.catalog.sources import HEADER_SUFFIXES
    from mamba_forge.core.safety import PathRefused, check_inputs_apart

    base = cat.path.parent
    files = [cat.path, *(base / f for f in cat.route_files)]
    folders: set[Path] = set()
    for m in cat.modules:
        files += [m.root / f for f in (*m.module.sources, *m.module.families)]
        folders |= {m.root / f for f in m.module.include}
    for folder in sorted(folders):
        files.append(folder)  # a folder of the catalog inside O/<target>: every header in it is too
        files += [h for h in folder.rglob("*") if h.suffix in HEADER_SUFFIXES]
    written = [out_dir / "manifest.toml", out_dir / LOCK_NAME]
    written += [out_dir / t / f"{m.kind}.{code}" for t in target_names for m in cat.modules for code in ("cubin", "ptx")]
    try:
        check_inputs_apart(written, files, folders=[out_dir / t for t in target_names],
                           what="the build's output")
    except PathRefused as exc:
        raise ForgeError(str(exc), hint="pass an --out folder apart from the catalog's files") from None
