"""The `mamba-forge` command line: parse, call a stage, render. No pipeline logic lives here.

Errors reach the user as one line on stderr (``error: what is wrong; what to do``) with exit code 2 for bad
input and 1 for a failed check; never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from . import __version__
from .errors import ForgeError

try:  # typer >= 0.28 vendors its own click; older typer uses click itself
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as _click_exc

app = typer.Typer(
    name="mamba-forge",
    help="Build, qualify, sign and load deterministic Mamba SSM CUDA kernels.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
out = Console()
err = Console(stderr=True)


def _split_archs(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [a.strip() for v in values for a in v.split(",") if a.strip()]


def _version_callback(value: bool) -> None:
    if value:
        out.print(f"mamba-forge {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


@app.command()
def build(
    arch: Annotated[
        list[str] | None,
        typer.Option("--arch", help="Target architecture(s), e.g. sm_90a; repeat or comma-separate. Default: all."),
    ] = None,
    catalog: Annotated[Path | None, typer.Option("--catalog", help="Catalog TOML (default: the built-in one).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Output folder for artifacts and manifest.toml.")] = Path("build"),
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=0, help="Worker processes (0: one per CPU).")] = 0,
    state_cap: Annotated[int, typer.Option("--state-cap", help="Largest d_state to support (rounded up to 16s).")] = 64,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Build without the private cache.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress or tables; exit code only.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the build manifest as JSON on stdout.")] = False,
) -> None:
    """Compile every module kind for the target architectures, read resources and admit each symbol."""
    from .build import BuildRequest, count_jobs, timed_build
    from .catalog import default_catalog_path, iter_targets, load_catalog, state_capacity
    from .manifest import write
    from .report import render_build

    targets = list(iter_targets(_split_archs(arch)))
    cap = state_capacity(state_cap)
    cat = load_catalog(catalog or default_catalog_path())
    req = BuildRequest(cat, targets, out_dir, jobs=jobs, state_capacity=cap, cache_location=None if no_cache else "default")
    show = not quiet and not as_json
    if show:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("[bold]build[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=err, transient=True,
        ) as progress:
            task = progress.add_task("", total=count_jobs(req))

            def on_event(kind: str, rec) -> None:
                if kind == "done" and rec is not None:
                    tag = "cached" if rec.cached else f"{rec.compile_seconds:.1f}s"
                    progress.update(task, advance=1, description=f"{rec.kind} {rec.target} ({tag})")

            manifest, seconds = timed_build(req, on_event)
    else:
        manifest, seconds = timed_build(req)
    for w in req.warnings:
        err.print(f"warning: {w}", markup=False, highlight=False)
    write(out_dir / "manifest.toml", manifest)
    failed = manifest.failed_mandatory()
    if as_json:
        sys.stdout.write(json.dumps(manifest.model_dump(mode="json"), indent=1) + "\n")
    elif show:
        render_build(manifest, out)
        n_sym = sum(1 for _ in manifest.symbols())
        n_rej = sum(1 for _, s in manifest.symbols() if s.verdict.status == "rejected")
        out.print(
            f"built {len(manifest.modules)} programs, {n_sym} symbols ({n_rej} rejected) in {seconds:.2f}s "
            f"-> {out_dir / 'manifest.toml'}"
        )
    if failed:
        names = ", ".join(f"{m.kind} ({m.target})" for m in failed)
        err.print(f"error: mandatory module failed to compile: {names}; see the log above or `mamba-forge report`", markup=False)
        raise typer.Exit(1)


@app.command()
def report(
    manifest: Annotated[Path, typer.Argument(help="A manifest.toml (build or qualified).")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Render a manifest: a summary per module kind, every rejected symbol with its reason."""
    from .manifest import read
    from .records import BuildManifest
    from .report import build_summary, render_build

    m = read(manifest, BuildManifest)
    if as_json:
        rejected = [
            {"module": mod.kind, "target": mod.target, "symbol": s.name, "check": s.verdict.check, "reason": s.verdict.reason}
            for mod, s in m.symbols()
            if s.verdict.status == "rejected"
        ]
        sys.stdout.write(json.dumps({"summary": build_summary(m), "rejected": rejected}, indent=1) + "\n")
    else:
        render_build(m, out)


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns every user-facing error into one line and an exit code."""
    if argv is None:
        argv = sys.argv[1:]
    if not argv:
        argv = ["--help"]
    try:
        rc = app(args=argv, standalone_mode=False)
    except ForgeError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return exc.exit_code
    except _click_exc.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "mamba-forge"
        err.print(f"error: {exc.format_message()}; see `{cmd} --help`", markup=False, highlight=False, soft_wrap=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err.print("error: aborted", markup=False)
        return 130
    except KeyboardInterrupt:
        err.print("error: interrupted", markup=False)
        return 130
    return rc if isinstance(rc, int) else 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
