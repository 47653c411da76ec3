"""The `mamba-forge` command line: parse, call a stage, render. No pipeline logic lives here.

Errors reach the user as one line on stderr (``error: what is wrong; what to do``) with exit code 2 for bad
input and 1 for a failed check; never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from mamba_forge import __version__
from mamba_forge.errors import ForgeError

if TYPE_CHECKING:
    from mamba_forge.qualify.runner import QualifyRequest, QualifyResult

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
    context_settings={"help_option_names": ["-h", "--help"]},
)
out = Console()
err = Console(stderr=True)


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
        typer.Option("--arch", help="Target architecture(s): sm_90a, 9.0a (TORCH_CUDA_ARCH_LIST spelling), all or "
                     "native; repeat or comma-separate. Default: $MAMBA_FORGE_ARCH, else $TORCH_CUDA_ARCH_LIST, "
                     "else sm_80,sm_89,sm_90a,sm_100a,sm_120a."),
    ] = None,
    kernels: Annotated[
        list[str] | None,
        typer.Option("--kernels", help="Only symbols whose name matches this glob (repeatable), e.g. 'softplus*'."),
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
    import os

    from mamba_forge.build.builder import BuildRequest, count_jobs, timed_build
    from mamba_forge.catalog.model import default_catalog_path, load_catalog, state_capacity
    from mamba_forge.catalog.targets import get_target, select_targets
    from mamba_forge.manifest.toml_io import write
    from mamba_forge.report.tables import render_build
    from mamba_forge.safety import PathRefused, prepare_output_dir

    chosen = select_targets(arch, os.environ)
    targets = [get_target(n) for n in chosen.names]
    cap = state_capacity(state_cap)
    cat = load_catalog(catalog or default_catalog_path())
    req = BuildRequest(cat, targets, out_dir, jobs=jobs, state_capacity=cap, cache_location=None if no_cache else "default",
                       kernels=tuple(kernels or ()))  # checks --kernels: bad input leaves no --out folder behind
    try:  # a bad --out is one line before anything compiles
        prepare_output_dir(out_dir, what="--out folder")
    except PathRefused as exc:
        raise ForgeError(str(exc)) from None
    show = not quiet and not as_json
    for note in chosen.notes if not quiet else ():
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
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
        from mamba_forge.manifest.codec import to_dict

        sys.stdout.write(json.dumps(to_dict(manifest), indent=1) + "\n")
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
    manifest: Annotated[Path, typer.Argument(help="A manifest.toml (build or qualified), or an index.")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    diff_with: Annotated[
        Path | None, typer.Option("--diff", help="`report --diff A B`: what changed from manifest A to MANIFEST (B); exit 1 when they differ, as diff does.")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="text or markdown (release notes).")] = "text",
) -> None:
    """Render a manifest: a summary per module kind, every rejected symbol with its reason; or a diff of two."""
    from mamba_forge.report import tables as rpt
    from mamba_forge.report.diff import diff, read_document

    if fmt not in ("text", "markdown"):
        raise ForgeError(f"unknown --format {fmt!r}", hint="use text or markdown")
    doc = read_document(manifest)
    if diff_with is not None:
        d = diff(read_document(diff_with).record, doc.record)
        if as_json:
            sys.stdout.write(json.dumps(d, indent=1) + "\n")
        else:
            rpt.render_diff(d, out, str(diff_with), str(manifest))
        if d["changed"]:  # like diff(1): 0 the same, 1 they differ
            raise typer.Exit(1)
        return
    if doc.kind != "build":
        if as_json:
            data = rpt.qualified_report(doc) if doc.kind == "qualified" else rpt.index_report(doc)
            sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
        elif fmt == "markdown":
            sys.stdout.write(rpt.qualified_markdown(doc))
        elif doc.kind == "qualified":
            rpt.render_qualified(doc, out)
        else:
            rpt.render_index(doc, out)
        return
    if fmt == "markdown":
        raise ForgeError("--format markdown renders qualified manifests and indexes", hint="drop it for a build manifest")
    m = doc.record
    if as_json:
        rejected = [
            {"module": mod.kind, "target": mod.target, "symbol": s.name, "check": s.verdict.check, "reason": s.verdict.reason}
            for mod, s in m.symbols()
            if s.verdict.status == "rejected"
        ]
        sys.stdout.write(json.dumps({"summary": rpt.build_summary(m), "rejected": rejected}, indent=1) + "\n")
    else:
        rpt.render_build(m, out)


KeyOpt = Annotated[
    list[Path] | None,
    typer.Option("--key", help="Trusted public key file or folder of *.pub (besides manifests/keys and your trust folder)."),
]


@app.command()
def verify(
    target: Annotated[Path, typer.Argument(help="A signed manifest, a bundle (.tar.gz or folder) or a release index.")],
    key: KeyOpt = None,
    build_dir: Annotated[Path | None, typer.Option("--build", help="Where a bare manifest's artifacts are (default: its folder).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Check the signature, every artifact's size and sha256, and completeness. Exit 0 when all hold, else 1."""
    from mamba_forge.runtime.errors import LoadError
    from mamba_forge.runtime.trust import trusted_keys
    from mamba_forge.runtime.verify import open_verified

    keys = trusted_keys(key or None)  # an unsafe trust folder or key is bad input (TrustRefused: exit 2)
    try:
        v = open_verified(target, keys=keys, build=build_dir)
    except LoadError as exc:
        if as_json:
            sys.stdout.write(json.dumps({"ok": False, "path": str(target), "reason": str(exc)}) + "\n")
            raise typer.Exit(1) from None
        from mamba_forge.errors import ManifestError

        raise ManifestError(str(exc)) from None
    if v.manifest is None:
        what = f"index of {len(v.entries)} manifest(s): " + ", ".join(e.manifest.device.name for e in v.entries)
    else:
        n = sum(1 for s in v.manifest.symbols if s.status == "admitted")
        what = f"{len(v.manifest.artifacts)} artifact(s), {n} admitted symbol(s) for {v.manifest.device.name}"
    dev = " (development key)" if v.signature.development_key else ""
    if as_json:
        sys.stdout.write(json.dumps({"ok": True, "path": str(target), "kind": v.kind, "key_id": v.signature.key_id,
                                     "development_key": v.signature.development_key}) + "\n")
    else:
        out.print(f"ok: {target}: signature by key {v.signature.key_id[:16]}…{dev}; {what}", markup=False, highlight=False,
                  soft_wrap=True)


@app.command()
def merge(
    manifests: Annotated[list[Path], typer.Argument(help="Per-device signed manifests (or .tar.gz bundles).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The signed index to write (beside the manifests).")],
    sign_key: Annotated[
        Path | None, typer.Option("--sign-key", help="PEM private key (default: $MAMBA_FORGE_SIGNING_KEY).")
    ] = None,
    key: KeyOpt = None,
    development_key: Annotated[bool, typer.Option("--development-key", help="Mark the index as signed by a development key.")] = False,
) -> None:
    """Write one signed release index over verified per-device manifests; the loader picks the device's entry."""
    from mamba_forge.manifest.bundle import signing_key, write_index
    from mamba_forge.runtime.trust import trusted_keys

    private = signing_key(sign_key)
    path = write_index(manifests, output, private, keys=trusted_keys(key or None), development_key=development_key)
    out.print(f"wrote {path}: {len(manifests)} manifest(s)", markup=False, highlight=False, soft_wrap=True)


@app.command()
def bundle(
    manifest: Annotated[Path, typer.Argument(help="A signed qualified manifest.")],
    build_dir: Annotated[Path, typer.Option("--build", help="The build folder holding its artifacts.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="OUT.tar.gz (reproducible bytes) or a new folder.")],
    key: KeyOpt = None,
) -> None:
    """Pack a verified manifest with exactly the artifacts it names; the loader and `verify` accept the result."""
    from mamba_forge.manifest.bundle import write_bundle
    from mamba_forge.runtime.trust import trusted_keys

    path = write_bundle(manifest, output, keys=trusted_keys(key or None), build=build_dir)
    out.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


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


@app.command()
def qualify(
    device: Annotated[str, typer.Option("--device", help="GPU ordinal, a list (0,1) or 'all'.")] = "0",
    build_dir: Annotated[Path | None, typer.Option("--build", help="A build folder (manifest.toml); default: build now.")] = None,
    catalog: Annotated[Path | None, typer.Option("--catalog", help="Catalog TOML (default: the built-in one).")] = None,
    level: Annotated[str, typer.Option("--level", help="quick (5 repeats) or full (50 repeats).")] = "quick",
    sanitize: Annotated[bool | None, typer.Option("--sanitize/--no-sanitize", help="Run small launches under compute-sanitizer (memcheck, racecheck, synccheck, initcheck). Default: at --level full when compute-sanitizer is found.")] = None,
    sign_key: Annotated[Path | None, typer.Option("--sign-key", help="Ed25519 private key (PEM).")] = None,
    out_path: Annotated[Path | None, typer.Option("--out", help="Signed manifest path (default manifests/<GPU>-<level>.toml).")] = None,
    module: Annotated[list[str] | None, typer.Option("--module", help="Only these module kinds (repeatable).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1.0, help="Seconds a launch may take before it counts as hung.")] = 20.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Base seed of the random inputs (default: fresh).")] = None,
    state_cap: Annotated[int, typer.Option("--state-cap", help="d_state capacity when building here.")] = 64,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Concurrent workers per GPU.")] = 4,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress or tables.")] = False,
) -> None:
    """Qualify every symbol that targets the attached GPU(s) and write a signed qualified manifest."""
    from mamba_forge.qualify import keys, runner
    from mamba_forge.report.qualify import render_qualify_summary

    if level not in ("quick", "full"):
        raise ForgeError(f"--level {level!r} is neither quick nor full")
    req, info = runner.prepare_request(
        _parse_devices(device), build_dir, catalog, level=level, sanitize=sanitize, timeout_s=timeout, seed=seed,
        modules=module, state_cap=state_cap, say=lambda m: err.print(m, markup=False, highlight=False), jobs=jobs,
    )
    key = keys.resolve_key(sign_key)
    if key.development:
        err.print(f"note: no --sign-key and no $MAMBA_FORGE_SIGNING_KEY: signing with the {key.source}; "
                  "the manifest is marked development_key = true", markup=False, highlight=False)
    result = runner.qualify(req, cc_hint=info.cc) if quiet else _qualify_with_progress(req, info.cc)
    for n in result.notes:
        err.print(f"note: {n}", markup=False, highlight=False)
    dest = out_path or Path("manifests") / f"{info.name.replace(' ', '-')}-{level}.toml"
    path, pub = keys.write_signed(result.manifest, key, dest)
    if not quiet:
        render_qualify_summary(result.manifest, out)
        out.print(f"signed manifest -> {path} (public key {pub}); qualified in {result.manifest.qualification_seconds:.1f} s",
                  markup=False, highlight=False)


def _qualify_with_progress(req: QualifyRequest, cc: tuple[int, int]) -> QualifyResult:
    """runner.qualify() under a progress bar per GPU (on stderr): module and symbol in flight, count, and each
    rejection as it comes."""
    import threading

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mamba_forge.qualify import runner
    from mamba_forge.qualify.events import Event, Fault, ModuleError, Start, SymbolResult, Timeout
    from mamba_forge.qualify.plan import plan_groups

    total = sum(len(g.symbols) for g in plan_groups(req.build, cc, req.only_modules)) * req.passes
    lock = threading.Lock()  # events come from one supervising thread per worker
    with Progress(TextColumn("[bold]qualify[/bold] GPU {task.fields[dev]}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.description}"), console=err, transient=True) as progress:
        tasks = {d: progress.add_task("", total=total, dev=d) for d in req.devices}

        def on_event(dev: int, ev: Event) -> None:
            with lock:
                if isinstance(ev, Start):
                    progress.update(tasks[dev], description=f"{ev.module} {ev.symbol}")
                elif isinstance(ev, SymbolResult | Fault | Timeout):
                    progress.update(tasks[dev], advance=1)
                    if not isinstance(ev, SymbolResult) or ev.status == "rejected":
                        progress.console.print(f"  rejected {ev.symbol}: {ev.reason}", markup=False, highlight=False)
                elif isinstance(ev, ModuleError):
                    progress.console.print(f"  {ev.reason}", markup=False, highlight=False)

        return runner.qualify(req, on_event, cc_hint=cc)


@app.command()
def keygen(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for <name>.key (mode 0600) and <name>.pub.")] = Path("keys"),
    name: Annotated[str, typer.Option("--name", help="File name stem.")] = "mamba-forge",
) -> None:
    """Write an Ed25519 key pair for signing qualified manifests."""
    from mamba_forge.manifest.signing import write_keypair

    try:
        priv, pub, kid = write_keypair(out_dir, name)
    except FileExistsError as exc:
        raise ForgeError(str(exc), hint="choose another --name or --out") from None
    out.print(f"private key {priv} (mode 0600), public key {pub}, key id {kid}", markup=False, highlight=False)


from mamba_forge.cli_env import register as _register_env_and_cache  # noqa: E402 - needs `app` above

_register_env_and_cache(app)


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
