"""The `mamba-forge` command line: parse, call a stage, render. No pipeline logic lives here.

Errors reach the user as one line on stderr (``error: what is wrong; what to do``), never a traceback, with the
one exit-code table below (EXIT_CODES; README and `mamba-forge -h` show it). `--json` on every command prints
one envelope on stdout (cli_json.py); progress goes to stderr through progress.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from mamba_forge import __version__
from mamba_forge import cli_json as js
from mamba_forge.errors import ForgeError

if TYPE_CHECKING:
    from mamba_forge.qualify.runner import QualifyRequest, QualifyResult

try:  # typer >= 0.28 vendors its own click; older typer uses click itself
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as _click_exc

EXIT_CODES = {
    0: "ok (report --diff: the manifests are the same)",
    1: "a check failed: a manifest does not verify, a mandatory module did not compile, report --diff found "
       "differences",
    2: "bad input: a missing or unreadable file, a bad option, path or glob, no usable GPU; the one-line message "
       "says what to do",
}
EPILOG = "\b\nExit codes (every command):\n" + "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items())

# Help in plain words: typer >= 0.29 prints each argument's Python type beside it (`MANIFEST <list[Path]>`); the
# metavar already says what to pass, so the type is left out (tests/test_cli_conventions.py checks every -h).
if hasattr(getattr(typer, "core", None), "TyperArgument") and hasattr(typer.core.TyperArgument, "display_type_rich"):
    typer.core.TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]

app = typer.Typer(
    name="mamba-forge",
    help="Build, qualify, sign and load deterministic Mamba SSM CUDA kernels.",
    epilog=EPILOG,
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
out = Console()
err = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout (schema: mamba-forge schema).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress, notes or tables; the exit code only.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Say what would run, and why, with counts; write nothing.")]


def _text(line: str) -> None:
    """One line for a person on stdout (never with --json)."""
    out.print(line, markup=False, highlight=False, soft_wrap=True)


def _bad_input(exc: ForgeError) -> ForgeError:
    """A failure to read an input as bad input (exit 2), keeping its message."""
    return ForgeError(exc.message, hint=exc.hint)


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
        typer.Option("--arch", metavar="ARCH", help="Target architecture(s): sm_90a, 9.0a (TORCH_CUDA_ARCH_LIST "
                     "spelling), all or native; repeat or comma-separate. Default: $MAMBA_FORGE_ARCH, else "
                     "$TORCH_CUDA_ARCH_LIST, else sm_80,sm_89,sm_90a,sm_100a,sm_120a."),
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
    jobs: Annotated[int, typer.Option("--jobs", "-j", metavar="N", min=0, help="Worker processes (0: one per CPU).")] = 0,
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
    from mamba_forge.manifest.codec import to_dict
    from mamba_forge.report.tables import render_build
    from mamba_forge.safety import PathRefused, prepare_output_dir

    chosen = select_targets(arch, os.environ)
    targets = [get_target(n) for n in chosen.names]
    cap = state_capacity(state_cap)
    cat = load_catalog(catalog or default_catalog_path())
    req = BuildRequest(cat, targets, out_dir, jobs=jobs, state_capacity=cap, cache_location=None if no_cache else "default",
                       kernels=tuple(kernels or ()), modules=tuple(module or ()),  # bad input leaves no --out behind
                       write_manifest=True)  # renamed in with the artifacts: a failed build keeps the old one
    for note in chosen.notes if not quiet else ():
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if dry_run:
        from mamba_forge.dryrun import build_plan, render_build_plan

        p = build_plan(req)
        if as_json:
            js.emit(p)
        elif not quiet:
            for line in render_build_plan(p):
                _text(line)
        return
    try:  # a bad --out is one line before anything compiles
        prepare_output_dir(out_dir, what="--out folder")
    except PathRefused as exc:
        raise ForgeError(str(exc)) from None
    with progress.Progress("build", count_jobs(req), err, quiet=quiet) as bar:

        def on_event(kind: str, rec) -> None:
            if kind == "done" and rec is not None:
                bar.finished(f"{rec.kind} {rec.target}", seconds=None if rec.cached else rec.compile_seconds,
                             tag="cached" if rec.cached else "")

        manifest, seconds = timed_build(req, on_event)
    for w in req.warnings if not quiet else ():
        err.print(f"warning: {w}", markup=False, highlight=False)
    failed = manifest.failed_mandatory()
    names = ", ".join(f"{m.kind} ({m.target})" for m in failed)
    if as_json:
        js.emit({"path": str(out_dir / "manifest.toml"), "seconds": round(seconds, 3),
                 "failed_mandatory": [f"{m.kind} ({m.target})" for m in failed], "manifest": to_dict(manifest)},
                ok=not failed)
    elif not quiet:
        render_build(manifest, out)
        n_sym = sum(1 for _ in manifest.symbols())
        n_rej = sum(1 for _, s in manifest.symbols() if s.verdict.status == "rejected")
        _text(f"built {len(manifest.modules)} programs, {n_sym} symbols ({n_rej} rejected) in {seconds:.2f}s "
              f"-> {out_dir / 'manifest.toml'}")
    if failed:
        err.print(f"error: mandatory module failed to compile: {names}; see the log above or `mamba-forge report`",
                  markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _globs(what: str, globs: list[str] | None, names: list[str]) -> tuple[str, ...]:
    """Globs over symbol names; one that is empty, overlong or matches nothing is bad input."""
    from fnmatch import fnmatchcase

    for g in globs or ():
        if not g or len(g) > 200:
            raise ForgeError(f"{what} {g[:40]!r} is {'empty' if not g else 'too long'}", hint=f"e.g. {what} 'softplus*'")
        if not any(fnmatchcase(n, g) for n in names):
            raise ForgeError(f"{what} {g!r} matches no symbol of the manifest", hint="`mamba-forge report --json` lists them")
    return tuple(globs or ())


GlobOpt = Annotated[list[str] | None, typer.Option("--kernels", metavar="GLOB",
                                                    help="Only symbols whose name matches this glob (repeatable).")]


@app.command()
def report(
    manifest: Annotated[Path, typer.Argument(metavar="MANIFEST", help="A manifest.toml (build or qualified), or an index.")],
    diff_with: Annotated[
        Path | None, typer.Option("--diff", metavar="A", help="`report --diff A B`: what changed from manifest A to "
                                  "B; exit 1 when they differ, as diff does.")
    ] = None,
    kernels: GlobOpt = None,
    symbols: Annotated[list[str] | None, typer.Option("--symbols", metavar="GLOB", help="Also each matching "
                                                      "symbol's resources and checks (repeatable; '*' for all).")] = None,
    digests: Annotated[bool, typer.Option("--digests", help="Also digests: check digests and artifact sha256, and "
                                          "every digest change of a diff.")] = False,
    fmt: Annotated[str, typer.Option("--format", metavar="FORMAT", help="text or markdown (release notes).")] = "text",
    as_json: JsonOpt = False,
) -> None:
    """Render a manifest: a summary per module kind and every rejected symbol with its reason; or a diff of two."""
    import dataclasses

    from mamba_forge.manifest.codec import to_dict
    from mamba_forge.report import tables as rpt
    from mamba_forge.report.diff import diff, narrow, read_document

    if fmt not in ("text", "markdown"):
        raise ForgeError(f"unknown --format {fmt!r}", hint="use text or markdown")
    try:  # a file that is not a readable manifest is bad input here (verify is where a check fails)
        doc = read_document(manifest)
        base = read_document(diff_with) if diff_with is not None else None
    except ForgeError as exc:
        raise _bad_input(exc) from None
    names = _symbol_names(doc) + (_symbol_names(base) if base else [])
    kernels_t, symbols_t = _globs("--kernels", kernels, names), _globs("--symbols", symbols, names)
    if base is not None:
        d = diff(base.record, doc.record)
        if kernels_t:
            d = narrow(d, kernels_t)
        if as_json:
            js.emit({"kind": "diff", "a": str(diff_with), "b": str(manifest),
                     "digest_changed_symbols": rpt.digest_symbols(d), **d}, ok=not d["changed"])
        else:
            rpt.render_diff(d, out, str(diff_with), str(manifest), digests=digests)
        if d["changed"]:  # like diff(1): 0 the same, 1 they differ
            raise typer.Exit(1)
        return
    if doc.kind == "qualified" and kernels_t:
        doc = dataclasses.replace(doc, record=dataclasses.replace(
            doc.record, symbols=[s for s in doc.record.symbols if rpt.match_any(s.name, kernels_t)]))
    if doc.kind == "build" and kernels_t:
        doc = dataclasses.replace(doc, record=dataclasses.replace(doc.record, modules=[
            dataclasses.replace(m, symbols=[s for s in m.symbols if rpt.match_any(s.name, kernels_t)])
            for m in doc.record.modules]))
    if fmt == "markdown":
        if doc.kind == "build":
            raise ForgeError("--format markdown renders qualified manifests and indexes", hint="drop it for a build manifest")
        if as_json:
            raise ForgeError("--format markdown and --json exclude each other", hint="drop one")
        sys.stdout.write(rpt.qualified_markdown(doc))
        return
    if doc.kind == "qualified":
        if as_json:
            js.emit({"kind": "qualified", **rpt.qualified_report(doc)})
        else:
            rpt.render_qualified(doc, out, symbols=symbols_t, digests=digests)
        return
    if doc.kind == "index":
        if as_json:
            js.emit({"kind": "index", "index": to_dict(doc.record), "signature": rpt.index_report(doc)["signature"]})
        else:
            rpt.render_index(doc, out, digests=digests)
        return
    m = doc.record
    if as_json:
        rejected = [
            {"module": mod.kind, "target": mod.target, "symbol": s.name, "check": s.verdict.check, "reason": s.verdict.reason}
            for mod, s in m.symbols()
            if s.verdict.status == "rejected"
        ]
        js.emit({"kind": "build", "summary": rpt.build_summary(m), "rejected": rejected})
    else:
        rpt.render_build(m, out, symbols=symbols_t, digests=digests)


def _symbol_names(doc) -> list[str]:
    if doc.kind == "build":
        return [s.name for _, s in doc.record.symbols()]
    return [s.name for s in doc.record.symbols] if doc.kind == "qualified" else []


KeyOpt = Annotated[
    list[Path] | None,
    typer.Option("--key", metavar="PUB", help="Trusted public key file or folder of *.pub (besides manifests/keys "
                 "and your trust folder); repeatable."),
]


def _must_exist(path: Path, what: str, hint: str) -> None:
    if not (path.exists() or path.is_symlink()):
        raise ForgeError(f"{what} not found: {path}", hint=hint)


@app.command()
def verify(
    target: Annotated[Path, typer.Argument(metavar="PATH", help="A signed manifest, a bundle (.tar.gz or folder) or a release index.")],
    key: KeyOpt = None,
    build_dir: Annotated[Path | None, typer.Option("--build", metavar="DIR", help="Where a bare manifest's artifacts are (default: its folder).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check the signature, every artifact's size and sha256, and completeness. Exit 0 when all hold, else 1."""
    from mamba_forge.errors import ManifestError
    from mamba_forge.runtime.errors import LoadError
    from mamba_forge.runtime.trust import trusted_keys
    from mamba_forge.runtime.verify import open_verified

    _must_exist(target, "manifest or bundle", "pass the path of a signed manifest, bundle or index")
    if build_dir is not None:
        _must_exist(build_dir, "--build folder", "pass the build folder that holds the manifest's artifacts")
    keys = trusted_keys(key or None)  # an unsafe trust folder or key is bad input (TrustRefused: exit 2)
    try:
        v = open_verified(target, keys=keys, build=build_dir)
    except LoadError as exc:
        raise ManifestError(str(exc)) from None  # it does not verify: a check failed (exit 1)
    if v.manifest is None:
        what = f"index of {len(v.entries)} manifest(s): " + ", ".join(e.manifest.device.name for e in v.entries)
    else:
        n = sum(1 for s in v.manifest.symbols if s.status == "admitted")
        what = f"{len(v.manifest.artifacts)} artifact(s), {n} admitted symbol(s) for {v.manifest.device.name}"
    dev = " (development key)" if v.signature.development_key else ""
    if as_json:
        js.emit({"path": str(target), "kind": v.kind, "key_id": v.signature.key_id,
                 "development_key": v.signature.development_key, "summary": what})
    else:
        _text(f"ok: {target}: signature by key {v.signature.key_id[:16]}{dev}; {what}")


@app.command()
def merge(
    manifests: Annotated[list[Path], typer.Argument(metavar="MANIFEST", help="Per-device signed manifests (or .tar.gz bundles).")],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", help="The signed index to write (beside the manifests).")],
    sign_key: Annotated[
        Path | None, typer.Option("--sign-key", metavar="KEY", help="PEM private key (default: $MAMBA_FORGE_SIGNING_KEY).")
    ] = None,
    key: KeyOpt = None,
    development_key: Annotated[bool, typer.Option("--development-key", help="Mark the index as signed by a development key.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write one signed release index over verified per-device manifests; the loader picks the device's entry."""
    from mamba_forge.manifest.bundle import signing_key, write_index
    from mamba_forge.runtime.trust import trusted_keys

    for m in manifests:
        _must_exist(m, "manifest", "pass per-device signed manifests or bundles")
    private = signing_key(sign_key)
    path = write_index(manifests, output, private, keys=trusted_keys(key or None), development_key=development_key)
    if as_json:
        js.emit({"path": str(path), "manifests": [str(m) for m in manifests]})
    else:
        _text(f"wrote {path}: {len(manifests)} manifest(s)")


@app.command()
def bundle(
    manifest: Annotated[Path, typer.Argument(metavar="MANIFEST", help="A signed qualified manifest.")],
    build_dir: Annotated[Path, typer.Option("--build", metavar="DIR", help="The build folder holding its artifacts.")],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="OUT", help="OUT.tar.gz (reproducible bytes) or a new folder.")],
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pack a verified manifest with exactly the artifacts it names; the loader and `verify` accept the result."""
    from mamba_forge.manifest.bundle import write_bundle
    from mamba_forge.runtime.trust import trusted_keys

    _must_exist(manifest, "manifest", "pass a signed qualified manifest")
    _must_exist(build_dir, "--build folder", "pass the build folder that holds the manifest's artifacts")
    path = write_bundle(manifest, output, keys=trusted_keys(key or None), build=build_dir)
    if as_json:
        js.emit({"path": str(path)})
    else:
        _text(f"wrote {path}")


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


def _check_out_file(path: Path, inputs: list[Path], *, create: bool) -> None:
    """qualify --out, before any work: not an input, not a folder, its folder a folder (made unless a dry run)."""
    from mamba_forge.safety import PathRefused, check_output_file, same_file

    try:
        if create:
            check_output_file(path, inputs=inputs, what="--out")
            return
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
    except PathRefused as exc:
        raise ForgeError(str(exc), hint="pass --out manifests/NAME.toml") from None


def _read_build(build_dir: Path):
    from mamba_forge.manifest.schema import BuildManifest
    from mamba_forge.manifest.toml_io import read

    if not build_dir.is_dir():
        raise ForgeError(f"--build {build_dir} is not a folder", hint="pass the --out folder of `mamba-forge build`")
    try:
        return read(build_dir / "manifest.toml", BuildManifest)
    except ForgeError as exc:
        raise ForgeError(f"--build {build_dir}: {exc.message}", hint="pass the --out folder of `mamba-forge build`") from None


@app.command()
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
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS", min=1.0, help="Seconds a launch may take before it counts as hung.")] = 20.0,
    seed: Annotated[int | None, typer.Option("--seed", metavar="N", help="Base seed of the random inputs (default: fresh).")] = None,
    state_cap: Annotated[int, typer.Option("--state-cap", metavar="N", help="d_state capacity when building here.")] = 64,
    jobs: Annotated[int, typer.Option("--jobs", "-j", metavar="N", min=1, help="Concurrent workers per GPU.")] = 4,
    dry_run: DryRunOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Qualify every symbol that targets the attached GPU(s) and write a signed qualified manifest."""
    from mamba_forge.manifest.codec import to_dict
    from mamba_forge.qualify import keys, runner
    from mamba_forge.report.qualify import render_qualify_summary

    if level not in ("quick", "full"):
        raise ForgeError(f"--level {level!r} is neither quick nor full", hint="use --level quick or --level full")
    devices = _parse_devices(device)
    for p, what in ((catalog, "--catalog"), (sign_key, "--sign-key")):
        if p is not None:
            _must_exist(p, what, f"pass an existing file to {what} or leave it out")
    bm = _read_build(build_dir) if build_dir is not None else None  # before the GPU: bad input is one line
    if bm is not None and kernels:
        from mamba_forge.qualify.plan import narrow_build

        bm = narrow_build(bm, kernels)
    inputs = [p for p in (catalog, sign_key, build_dir / "manifest.toml" if build_dir else None) if p is not None]
    if out_path is not None:
        _check_out_file(out_path, inputs, create=not dry_run)
    if dry_run:
        _qualify_dry_run(devices, bm, build_dir, catalog, level, sanitize, module, jobs, quiet, as_json)
        return
    req, info = runner.prepare_request(
        devices, build_dir, catalog, level=level, sanitize=sanitize, timeout_s=timeout, seed=seed,
        modules=module, state_cap=state_cap, say=lambda m: err.print(m, markup=False, highlight=False), jobs=jobs,
        kernels=kernels,
    )
    key = keys.resolve_key(sign_key)
    if key.development and not quiet:
        err.print(f"note: no --sign-key and no $MAMBA_FORGE_SIGNING_KEY: signing with the {key.source}; "
                  "the manifest is marked development_key = true", markup=False, highlight=False)
    dest = out_path or Path("manifests") / f"{info.name.replace(' ', '-')}-{level}.toml"
    if out_path is None:
        _check_out_file(dest, inputs, create=True)
    result = _qualify_with_progress(req, info.cc, quiet=quiet)
    for n in result.notes if not quiet else ():
        err.print(f"note: {n}", markup=False, highlight=False)
    path, pub = keys.write_signed(result.manifest, key, dest)
    if as_json:
        js.emit({"path": str(path), "public_key": str(pub), "notes": list(result.notes),
                 "manifest": to_dict(result.manifest)})
    elif not quiet:
        render_qualify_summary(result.manifest, out)
        _text(f"signed manifest -> {path} (public key {pub}); qualified in "
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
        cc, name, source = (t.cc // 10, t.cc % 10), f"a {t.family} GPU", f"no GPU here: the build's target {t.name}"
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
            _text(line)


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
    with progress.Progress("qualify", total, err, quiet=quiet) as bar:

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


@app.command()
def keygen(
    out_dir: Annotated[Path, typer.Option("--out", metavar="DIR", help="Folder for <name>.key (mode 0600) and <name>.pub.")] = Path("keys"),
    name: Annotated[str, typer.Option("--name", metavar="NAME", help="File name stem.")] = "mamba-forge",
    as_json: JsonOpt = False,
) -> None:
    """Write an Ed25519 key pair for signing qualified manifests."""
    from mamba_forge.manifest.signing import write_keypair

    if not name or "/" in name or name in (".", "..") or name.startswith("."):
        raise ForgeError(f"--name {name!r} is not a plain file name stem", hint="e.g. --name release")
    if out_dir.exists() and not out_dir.is_dir():
        raise ForgeError(f"--out {out_dir} exists and is not a folder", hint="pass a folder for the key pair")
    try:
        priv, pub, kid = write_keypair(out_dir, name)
    except FileExistsError as exc:
        raise ForgeError(str(exc), hint="choose another --name or --out") from None
    if as_json:
        js.emit({"private_key": str(priv), "public_key": str(pub), "key_id": kid})
    else:
        _text(f"private key {priv} (mode 0600), public key {pub}, key id {kid}")


@app.command()
def schema(
    name: Annotated[str | None, typer.Argument(metavar="NAME", help="A command (build, report, cache-prune, ...) or "
                                               "envelope; leave out to list them.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the JSON Schema of a command's --json output (the files shipped in mamba_forge/schemas)."""
    from mamba_forge import schemas

    known = schemas.names()
    if name is None:
        if as_json:
            js.emit({"names": known})
        else:
            _text("\n".join(known))
        return
    key = schemas.file_name(name)
    if key not in known:
        raise ForgeError(f"no schema named {name!r}", hint=f"known: {', '.join(known)}")
    doc = json.loads(schemas.shipped(key))
    if as_json:
        js.emit(doc)
    else:
        sys.stdout.write(schemas.dumps(doc))


from mamba_forge.cli_env import register as _register_env_and_cache  # noqa: E402 - needs `app` above

_register_env_and_cache(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns every user-facing error into one line and an exit code (and, with
    --json, an envelope with ok false)."""
    if argv is None:
        argv = sys.argv[1:]
    if not argv:
        argv = ["--help"]
    js.start(argv)

    def fail(message: str, code: int) -> int:
        err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
        js.emit_error(message, code)
        return code

    try:
        rc = app(args=argv, standalone_mode=False)
    except ForgeError as exc:
        return fail(str(exc), exc.exit_code)
    except _click_exc.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "mamba-forge"
        return fail(f"{exc.format_message().rstrip('.')}; see `{cmd} --help`", 2)
    except typer.Abort:
        return fail("aborted", 130)
    except typer.Exit as exc:
        rc = exc.exit_code
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except SystemExit as exc:  # typer's --show-completion and --install-completion end this way
        rc = exc.code if isinstance(exc.code, int) else 0
    rc = rc if isinstance(rc, int) else 0
    if rc:
        js.emit_error("failed; see the error on stderr", rc)  # only when the command printed no envelope
    return rc


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
