"""Loading the kernel catalog: read the root and family TOML files, validate them against the entries
(:mod:`mamba_forge.catalog.entries`), expand every family into symbols and check every rule about an entry
(names, layouts, launch expressions at the qualification dims, sources inside the catalog's folder) before
anything is compiled. Any problem raises one CatalogError naming file, entry and problem.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from mamba_forge.catalog import limits, split_rules, wrappers
from mamba_forge.catalog.compile_rules import option_problem
from mamba_forge.catalog.entries import (  # noqa: F401 - re-exported: the catalog's public records
    FILL_SPEC,
    LAYOUT_KEY,
    SCALAR_TYPES,
    SCHEMA_VERSION,
    SYMBOL_NAME,
    CatalogHeader,
    Defaults,
    Family,
    FamilyFile,
    Launch,
    Module,
    Param,
    Policy,
    PolicyOverride,
    QualifySpec,
    RootFile,
    state_capacity,
    template_problem,
)
from mamba_forge.catalog.expanded import Catalog, ModuleSpec, Symbol  # noqa: F401 - re-exported: the expanded records
from mamba_forge.catalog.sources import read_headers, read_source
from mamba_forge.catalog.targets import TARGETS
from mamba_forge.core import expr
from mamba_forge.core.errors import CatalogError, ForgeError, printable
from mamba_forge.core.safety import MAX_CATALOG_BYTES, PathRefused, parse_toml, read_bounded
from mamba_forge.core.vocab import DTYPES

if TYPE_CHECKING:
    from mamba_forge.catalog.memo import Inputs


def _fmt_loc(loc: tuple[Any, ...], data: Any) -> str:
    """Name the entry a pydantic error points at: 'module[2] (kind=Fixed).families' etc."""
    parts, node = [], data
    for item in loc:
        if isinstance(item, int) and isinstance(node, list) and 0 <= item < len(node):
            node = node[item]
            label = ""
            if isinstance(node, dict):
                for key in ("kind", "name"):
                    if key in node:
                        label = f" ({key}={printable(node[key], limit=60)})"  # hostile: escaped, bounded
                        break
            parts[-1] = f"{parts[-1]}[{item}]{label}" if parts else f"[{item}]{label}"
        else:
            parts.append(str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return ".".join(parts) or "(top level)"


def _validate(model: type[BaseModel], data: Any, path: Path) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise CatalogError(f"{path}: {_fmt_loc(err['loc'], data)}: {msg}{more}") from None


def _read_toml(path: Path, inputs: Inputs | None = None, raw: bytes | None = None) -> dict[str, Any]:
    if raw is None:
        raw = _read_raw(path)
    if inputs is not None:
        inputs.file(path, raw)
    try:
        return parse_toml(raw.decode("utf-8"), what=str(path))
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise CatalogError(f"{path}: not UTF-8 text") from None


def _read_raw(path: Path) -> bytes:
    if not (path.exists() or path.is_symlink()):
        raise CatalogError(f"catalog file not found: {path}", hint="pass --catalog PATH to an existing catalog")
    if path.is_dir():
        raise CatalogError(f"{path} is a folder, not a catalog file", hint="pass the catalog's .toml file")
    try:
        return read_bounded(path, MAX_CATALOG_BYTES, what="catalog file")
    except PathRefused as exc:
        raise CatalogError(str(exc)) from None


def _expand_family(fam: Family, module: Module, policy: Policy, where: str) -> list[Symbol]:
    dtypes: list[tuple[str | None, str | None]] = [(d, None) for d in fam.variants]  # (dtype, name override)
    if fam.bare:
        dtypes.insert(0, (fam.bare, fam.name))
    if not dtypes:
        dtypes = [(None, None)]
    instances = fam.instances or [{}]
    if fam.symbol is not None:
        template = fam.symbol
    elif fam.variants:
        template = "{name}_{dtype}"
    else:
        template = "{name}"
    # a macro's arguments after the symbol; a generated wrapper takes none (its body names its own)
    args = fam.args if fam.args is not None else (["T"] if dtypes[0][0] is not None and fam.body is None else [])
    fam_policy = fam.policy.apply(module.policy.apply(policy))
    out = []
    for (dtype, override), inst in itertools.product(dtypes, instances):
        env: dict[str, int | str] = dict(inst)
        if dtype is not None:
            env.setdefault("T", dtype)
        fmt = {"name": fam.name, "dtype": dtype or "", **env}
        try:
            name = override if override and not fam.instances else template.format(**fmt)
        except (KeyError, IndexError) as exc:
            raise CatalogError(f"{where}: symbol template {template!r} names unknown key {exc}") from None
        if not SYMBOL_NAME.match(name):
            raise CatalogError(f"{where}: symbol {name!r} is not a C identifier")
        macro_args = []
        for a in args:
            if a not in env:
                raise CatalogError(f"{where}: macro argument {a!r} is not an instance key (have {sorted(env)})")
            v = env[a]
            macro_args.append(wrappers.c_token(a, v))
        num_env = {k: v for k, v in env.items() if isinstance(v, int)}
        num_env.update({f"sizeof_{k}": DTYPES[v][1] for k, v in env.items() if isinstance(v, str) and v in DTYPES})
        try:
            blk = fam.launch.block if isinstance(fam.launch.block, list) else [fam.launch.block]
            block = tuple(int(expr.evaluate(b, num_env)) for b in blk) + (1,) * (3 - len(blk))
            smem = int(expr.evaluate(fam.launch.dynamic_smem, num_env))
            pdl_blocks = int(expr.evaluate(fam.launch.pdl_max_blocks, num_env))
        except expr.ExprError as exc:
            raise CatalogError(f"{where}: symbol {name}: {exc}") from None
        if not 0 <= pdl_blocks <= 2**31 - 1:
            raise CatalogError(f"{where}: symbol {name}: launch.pdl_max_blocks is {pdl_blocks}; it must be 0 (never) "
                               "to 2^31-1 blocks")
        limits.check_block(block, f"{where}: symbol {name}")
        if fam.body is not None:  # the wrapper is written at compose time; here, everything it needs resolves
            try:
                wrappers.wrapper_text(fam, name, env, block[0] * block[1] * block[2])
            except wrappers.WrapperError as exc:
                raise CatalogError(f"{where}: symbol {name}: {exc}") from None
        limits.check_smem(smem, module.arch + module.check_arch + module.build_only, f"{where}: symbol {name}")
        _check_launch_expressions(fam, num_env, f"{where}: symbol {name}")
        limits.check_grid(fam.launch.grid, {**num_env, **fam.qualify.dims},
                          bool(fam.qualify.dims) and not fam.qualify.skip, f"{where}: symbol {name}")
        deterministic = module.deterministic if fam.deterministic is None else fam.deterministic
        if fam.split is not None:
            problem = split_rules.symbol_problem(fam, num_env, deterministic)
            if problem:
                raise CatalogError(f"{where}: symbol {name}: {problem}")
        try:
            fallback = [f.format(**fmt) for f in fam.fallback]
        except (KeyError, IndexError) as exc:
            raise CatalogError(f"{where}: fallback template names unknown key {exc} "
                               f"(known: {sorted(fmt)})") from None
        out.append(
            Symbol(
                name=name,
                module=module.kind,
                family=fam.name,
                dtype=dtype,
                params_env=env,
                macro_args=macro_args,
                block=block,  # type: ignore[arg-type]
                dynamic_smem=smem,
                policy=fam_policy,
                pdl_max_blocks=pdl_blocks,
                deterministic=deterministic,
                fallback=fallback,
            )
        )
    return out


def _check_launch_expressions(fam: Family, num_env: dict[str, int], where: str) -> None:
    """Grid, shape and scalar-value expressions parse within the language's bounds and name only the
    qualification dims, the instance's integers and sizeof_*: a bad one is a catalog error at load, not a
    failure on the GPU later. Families without qualification dims, or skipped, are only parsed."""
    known = set(num_env) | set(fam.qualify.dims)
    exprs = [("grid", g) for g in fam.launch.grid]
    for prm in fam.params:
        exprs += [(f"shape of {prm.name!r}", e) for e in prm.shape]
        if isinstance(prm.value, str):
            exprs.append((f"value of {prm.name!r}", prm.value))
    env = {**num_env, **fam.qualify.dims}
    qualified = bool(fam.qualify.dims) and not fam.qualify.skip  # families without dims are build-only fixtures
    for what, e in exprs:
        try:
            unknown = expr.names(e) - known
            if not unknown and qualified:
                expr.evaluate(e, env)  # at the qualification dims: zero divisors, overflow, log2(0)...
        except expr.ExprError as exc:
            raise CatalogError(f"{where}: {what}: {exc}") from None
        if unknown and qualified:
            raise CatalogError(f"{where}: {what} {e!r} names {sorted(unknown)}, which are neither qualification "
                               f"dims nor instance parameters (known: {sorted(known)})")
    # requires: dims of the launch contract (names its expressions use, less the instance's), kept by the
    # qualification shape (else the qualifier would launch what the runtime refuses)
    ruled = set(fam.requires.multiple_of) | set(fam.requires.at_most)
    dims = set().union(*(expr.names(e) for _, e in exprs)) - set(num_env) if exprs else set()
    if ruled - dims:
        raise CatalogError(f"{where}: requires names {sorted(ruled - dims)}, which are not dims of its launch "
                           f"contract (its grid, shape and value expressions use {sorted(dims)})")
    problem = fam.requires.problem(fam.qualify.dims) if qualified else None
    if problem:
        raise CatalogError(f"{where}: its qualification dims break its own requires: {problem}")


def _check_options(options: list[str], where: str) -> None:
    for opt in options:
        problem = option_problem(opt)
        if problem:
            raise CatalogError(f"{where}: {problem}", hint="headers come only from the catalog's include folders")


def inside_catalog(base: Path, rel: str, what: str, inputs: Inputs | None = None) -> Path:
    """The one rule for every path a catalog names: relative, no '..', and inside the catalog's folder once
    symlinks are resolved (a link that stays inside is fine; one that leads out is refused)."""
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or "\\" in rel or ".." in p.parts or "\0" in rel:
        raise CatalogError(f"{what} {rel!r} is not a relative path inside the catalog's folder",
                           hint="name files relative to the catalog file, without '..'")
    root = base.resolve()
    resolved = (root / p).resolve()
    if not resolved.is_relative_to(root):
        raise CatalogError(f"{what} {rel!r} leads out of the catalog's folder {root} (to {resolved})",
                           hint="keep sources, headers and family files inside the catalog's folder")
    if inputs is not None:
        inputs.path(base, rel, resolved)
    return resolved


def load_catalog(path: str | Path) -> Catalog:
    """Load, validate and expand a catalog. Any problem raises one CatalogError naming file, entry and problem.
    A catalog whose every file reads as when it last loaded here comes from the loaded-catalog memo (memo.py)."""
    from mamba_forge.catalog import memo

    path = Path(path).expanduser().resolve()
    if path.is_dir():
        path = path / "catalog.toml"
    raw = _read_raw(path)
    remembered = memo.lookup(path, raw)
    if remembered is not None:
        return remembered
    inputs = memo.Inputs()
    catalog = _load(path, raw, inputs)
    memo.store(path, raw, inputs, catalog)
    return catalog


def _load(path: Path, raw: bytes, inputs: Inputs) -> Catalog:
    """The full load of the catalog at `path` (whose root file holds `raw`), every read recorded in `inputs`."""
    root_data = _read_toml(path, inputs, raw)
    limits.check_root_size(root_data, path)
    budget = limits.SizeBudget()  # families and symbols, counted before anything is expanded
    root: RootFile = _validate(RootFile, root_data, path)
    if root.catalog.schema_ != SCHEMA_VERSION:
        raise CatalogError(f"{path}: catalog.schema is {root.catalog.schema_}; this tool reads schema {SCHEMA_VERSION}")
    base = path.parent
    _check_options(root.defaults.options, f"{path}: defaults")
    scanned: set[Path] = set()  # include folders whose headers passed the include rule (folders are shared)
    modules, seen_kinds, seen_symbols = [], set(), {}
    seen_sources: dict[Path, str] = {}  # source file -> the module kind that owns it
    for mi, mod in enumerate(root.module):
        where = f"{path}: module[{mi}] (kind={mod.kind})"
        if mod.kind in seen_kinds:
            raise CatalogError(f"{where}: module kind declared twice")
        seen_kinds.add(mod.kind)
        _check_options(mod.options, where)
        for rel in mod.sources:
            src = inside_catalog(base, rel, f"{where}: source", inputs)
            if not src.is_file():
                raise CatalogError(f"{where}: source {rel!r} not found under {base}")
            # shared device code lives in headers (include folders); a source file belongs to one module only
            if src in seen_sources:
                raise CatalogError(
                    f"{where}: source {rel!r} is already a source of module {seen_sources[src]}",
                    hint="move the shared code into a header under kernels/include/mf/ and #include it",
                )
            seen_sources[src] = mod.kind
            inputs.source(src, read_source(src, f"{where}: source"))  # bounded, its includes plain
        for rel in mod.include:
            folder = inside_catalog(base, rel, f"{where}: include folder", inputs)
            if not folder.is_dir():
                raise CatalogError(f"{where}: include folder {rel!r} not found under {base}")
            if folder not in scanned:
                inputs.headers(folder, read_headers(folder))
                scanned.add(folder)
        families: list[Family] = []
        family_names: set[str] = set()
        symbols: list[Symbol] = []
        for rel in mod.families:
            fpath = inside_catalog(base, rel, f"{where}: family file", inputs)
            fdata = _read_toml(fpath, inputs)
            budget.check_family_file(fdata, fpath)
            ff: FamilyFile = _validate(FamilyFile, fdata, fpath)
            for fi, fam in enumerate(ff.family):
                fwhere = f"{fpath}: family[{fi}] (name={fam.name})"
                if fam.name in family_names:
                    raise CatalogError(f"{fwhere}: family declared twice in module {mod.kind}")
                family_names.add(fam.name)
                families.append(fam)
                limits.check_dims(fam.qualify.dims, fwhere)
                problem = wrappers.family_problem(fam, mod)
                if problem:
                    raise CatalogError(f"{fwhere}: {problem}")
                if fam.split is not None:
                    problem = split_rules.family_problem(fam)
                    if problem:
                        raise CatalogError(f"{fwhere}: {problem}")
                for sym in _expand_family(fam, mod, root.defaults.policy, fwhere):
                    if sym.name in seen_symbols:
                        raise CatalogError(f"{fwhere}: symbol {sym.name} already declared by {seen_symbols[sym.name]}")
                    seen_symbols[sym.name] = fwhere
                    symbols.append(sym)
        modules.append(
            ModuleSpec(
                module=mod,
                root=base,
                families=tuple(families),
                symbols=tuple(symbols),
                options=tuple(root.defaults.options) + tuple(mod.options),
            )
        )
    catalog = Catalog(path=path, name=root.catalog.name, modules=tuple(modules))
    if not root.catalog.routes and not root.catalog.route_tuning:
        return catalog
    from mamba_forge.catalog.route_tuning import apply_tuning
    from mamba_forge.catalog.routes import expand_routes

    routes = []
    for rel in root.catalog.routes:
        rpath = inside_catalog(base, rel, f"{path}: routes file", inputs)
        routes += expand_routes(_read_toml(rpath, inputs), rpath, catalog)
    keys = [r.key for r in routes]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup:
        raise CatalogError(f"{path}: GEMM key {' '.join(dup)} is routed by two route files")
    routes = tuple(routes)
    for rel in root.catalog.route_tuning:
        tpath = inside_catalog(base, rel, f"{path}: route tuning file", inputs)
        routes = apply_tuning(_read_toml(tpath, inputs), tpath, routes, catalog)
    files = tuple(root.catalog.routes) + tuple(root.catalog.route_tuning)  # both in the catalog's digest
    return catalog.model_copy(update={"route_files": files, "routes": routes})


def default_catalog_path() -> Path:
    """The built-in catalog: the package data of a wheel install, or kernels/catalog.toml of a source checkout."""
    from mamba_forge.core.resources import KERNELS, data_folder

    path = data_folder(KERNELS) / "catalog.toml"
    if not path.is_file():
        raise ForgeError(f"the built-in catalog {path} is missing", hint="reinstall mamba-forge, or pass --catalog")
    return path


__all__ = [
    "Catalog", "Family", "Module", "ModuleSpec", "Param", "Policy", "Symbol", "TARGETS",
    "load_catalog", "state_capacity", "default_catalog_path",
]
