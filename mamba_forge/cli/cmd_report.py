"""`mamba-forge report`: a manifest's summary, its rejections, its symbols; or a diff of two manifests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mamba_forge import cli_json as js
from mamba_forge.cli.common import JsonOpt, bad_input, stdout
from mamba_forge.core.errors import ForgeError


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


def report(
    manifest: Annotated[Path | None, typer.Argument(metavar="MANIFEST", show_default=False,
                                                    help="A manifest.toml (build or qualified), or an index.")] = None,
    diff_with: Annotated[
        Path | None, typer.Option("--diff", metavar="A", help="`report --diff A B`: what changed from manifest A to "
                                  "B; exit 1 when they differ, as diff does.")
    ] = None,
    kernels: GlobOpt = None,
    module: Annotated[list[str] | None, typer.Option("--module", metavar="KIND", help="With --diff: only this "
                                                     "module kind (repeatable), e.g. Fixed.")] = None,
    target: Annotated[list[str] | None, typer.Option("--target", metavar="TARGET", help="With --diff: only this "
                                                     "target (repeatable), e.g. sm_90a.")] = None,
    symbols: Annotated[list[str] | None, typer.Option("--symbols", metavar="GLOB", help="Also each matching "
                                                      "symbol's resources and checks (repeatable; '*' for all).")] = None,
    digests: Annotated[bool, typer.Option("--digests", help="Also digests: check digests and artifact sha256, and "
                                          "every digest change of a diff.")] = False,
    fmt: Annotated[str, typer.Option("--format", metavar="FORMAT", help="text or markdown (release notes).")] = "text",
    as_json: JsonOpt = False,
) -> None:
    """Render a manifest: a summary per module kind and every rejected symbol with its reason; or a diff of two."""
    import dataclasses

    from mamba_forge.core.codec import to_dict
    from mamba_forge.report import tables as rpt
    from mamba_forge.report.diff import diff, narrow, read_document

    if manifest is None:
        if diff_with is not None:
            raise ForgeError(f"report --diff {diff_with} needs a second manifest to compare it with",
                             hint=f"mamba-forge report --diff {diff_with} NEW.toml")
        raise ForgeError("report needs a MANIFEST", hint="e.g. mamba-forge report build/manifest.toml")
    if (module or target) and diff_with is None:
        raise ForgeError("--module and --target narrow a diff", hint="add --diff OLD.toml, or use --kernels GLOB")
    if fmt not in ("text", "markdown"):
        raise ForgeError(f"unknown --format {fmt!r}", hint="use text or markdown")
    try:  # a file that is not a readable manifest is bad input here (verify is where a check fails)
        doc = read_document(manifest)
        base = read_document(diff_with) if diff_with is not None else None
    except ForgeError as exc:
        raise bad_input(exc) from None
    names = _symbol_names(doc) + (_symbol_names(base) if base else [])
    kernels_t, symbols_t = _globs("--kernels", kernels, names), _globs("--symbols", symbols, names)
    if base is not None:
        d = diff(base.record, doc.record)
        units = _units(doc) | _units(base)
        for what, values, known in (("--module", module, {m for m, _ in units}), ("--target", target,
                                                                                  {t for _, t in units})):
            for v in values or ():
                if v not in known:
                    raise ForgeError(f"{what} {v!r} is in neither manifest",
                                     hint=f"known: {', '.join(sorted(known)) or 'none'}")
        if kernels_t or module or target:
            d = narrow(d, kernels_t, modules=tuple(module or ()), targets=tuple(target or ()))
        if as_json:
            js.emit({"kind": "diff", "a": str(diff_with), "b": str(manifest),
                     "digest_changed_symbols": rpt.digest_symbols(d), **d}, ok=not d["changed"])
        else:
            rpt.render_diff(d, stdout(), str(diff_with), str(manifest), digests=digests)
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
            rpt.render_qualified(doc, stdout(), symbols=symbols_t, digests=digests)
        return
    if doc.kind == "index":
        if as_json:
            js.emit({"kind": "index", "index": to_dict(doc.record), "signature": rpt.index_report(doc)["signature"]})
        else:
            rpt.render_index(doc, stdout(), digests=digests)
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
        rpt.render_build(m, stdout(), symbols=symbols_t, digests=digests)


def _units(doc) -> set[tuple[str, str]]:
    """(module kind, target) pairs of a build or qualified manifest (an index has none)."""
    if doc.kind == "build":
        return {(m.kind, m.target) for m in doc.record.modules}
    return {(s.module, s.target) for s in doc.record.symbols} if doc.kind == "qualified" else set()


def _symbol_names(doc) -> list[str]:
    if doc.kind == "build":
        return [s.name for _, s in doc.record.symbols()]
    return [s.name for s in doc.record.symbols] if doc.kind == "qualified" else []

