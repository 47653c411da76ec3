"""The one place that converts between manifest records (schema.py) and plain data: the dicts, lists, str, int,
float and bool that tomllib and json read and that tomli-w and json write.

``from_dict`` is the validator for hostile input. Driven by the records' type hints (a conversion plan per
class, built once), it refuses unknown keys, missing required keys, wrong types (bool is not int; int is taken
for float), values outside a Literal set and a record's own ``_check`` rule, raising one SchemaError naming the
path (``symbols[3].params[1].dtype: expected str, got int``). It descends only as deep as the schema, so deep
or huge input is refused at the first level that does not fit, never with a RecursionError.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import threading
import types
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from mamba_forge.core.schema import QualifiedManifest, SchemaError, runtime_table

T = TypeVar("T")

_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector paused while a whole document is decoded or encoded: a tree of millions of
    fresh, acyclic containers (a 20,000-symbol manifest) otherwise triggers collection after collection over
    everything alive, ~40% of the time. Nothing made here forms a cycle, so nothing waits for the collector.
    Re-entrant and thread-safe: the collector comes back, as it was, when the last pause ends."""
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


class _Bad(Exception):
    """A problem on its way up: each container on the way adds its key (innermost first)."""

    def __init__(self, problem: str, part: str | None = None):
        super().__init__(problem)
        self.problem, self.parts = problem, [] if part is None else [part]


def _kind(v: Any) -> str:
    return {dict: "table", list: "list", tuple: "list", type(None): "null"}.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    if type(v) not in (str, int, float, bool):
        return _kind(v)  # never repr a container: it may be deep
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def document_record(data: Any, records: dict[str, type], *, where: str = "the manifest") -> type:
    """The record class a decoded document's `kind` names among `records`; a kind of another type (a list, a
    table: unhashable, or true for 1) or another value is one SchemaError, never a TypeError."""
    kind = data["kind"] if type(data) is dict and "kind" in data else None
    if type(kind) is not str or kind not in records:
        shown = _show(kind) if kind is not None else "none"
        raise SchemaError(where, "kind", f"expected one of {', '.join(map(repr, records))}, got {shown}")
    return records[kind]


def _key(k: str) -> str:
    return "." + k if k.isidentifier() else "[" + json.dumps(k) + "]"


def _exact(t: type):
    def conv(v):
        if type(v) is t:
            return v
        raise _Bad(f"expected {t.__name__}, got {_kind(v)}")
    conv.exact = t  # type: ignore[attr-defined]
    return conv


def _float(v):
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise _Bad(f"expected float, got {_kind(v)}")


_float.exact = float  # type: ignore[attr-defined]  # an int converts, through the slow path


def _list(item):
    exact = getattr(item, "exact", None)

    def conv(v):
        if type(v) is not list and type(v) is not tuple:
            raise _Bad(f"expected list, got {_kind(v)}")
        if exact is not None:
            for x in v:
                if type(x) is not exact:
                    break
            else:
                return list(v)
        else:
            try:
                return [item(x) for x in v]
            except _Bad:
                pass  # find which item, below
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item(x))
            except _Bad as e:
                e.parts.append(f"[{i}]")
                raise
        return out
    return conv


def _dict(item):
    def conv(v):
        if type(v) is not dict:
            raise _Bad(f"expected table, got {_kind(v)}")
        out = {}
        for k, x in v.items():
            if type(k) is not str:
                raise _Bad(f"expected str keys, got {_kind(k)}")
            try:
                out[k] = item(x)
            except _Bad as e:
                e.parts.append(_key(k))
                raise
        return out
    return conv


def _optional(inner):
    return lambda v: None if v is None else inner(v)


def _literal(values: tuple):
    kinds, allowed = {type(x) for x in values}, set(values)
    text = ", ".join(repr(x) for x in values)

    def conv(v):
        if type(v) in kinds and v in allowed:
            return v
        raise _Bad(f"expected one of {text}, got {_show(v)}")
    return conv


def _converter(t):
    if t in (int, str, bool):
        return _exact(t)
    if t is float:
        return _float
    if dataclasses.is_dataclass(t):
        return _READERS.get(t) or _reader(t)  # built eagerly: a record type may not contain itself
    origin, args = get_origin(t), get_args(t)
    if origin is list:
        return _list(_converter(args[0]))
    if origin is dict and args[0] is str:
        return _dict(_converter(args[1]))
    if origin is Literal:
        return _literal(args)
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return _optional(_converter(next(a for a in args if a is not type(None))))
    raise TypeError(f"the manifest codec has no conversion for {t!r}")


_READERS: dict[type, Any] = {}
_MISSING = object()


def _reader(cls: type):
    """Once per class: a function reading that record from a dict, generated from its fields so that a field of
    the right exact type costs one check (the loader reads ~2,500 records at cold start)."""
    hints, names = get_type_hints(cls), [f.name for f in dataclasses.fields(cls)]
    ns = {"_Bad": _Bad, "_kind": _kind, "_show": _show, "M": _MISSING, "new": object.__new__, "cls": cls,
          "names": frozenset(names), "check": getattr(cls, "_check", None)}
    src = ["def read(v):",
           " if type(v) is not dict: raise _Bad('expected table, got ' + _kind(v))",
           " if not names.issuperset(v): raise _Bad('unknown key ' + _show(next(k for k in v if k not in names)))",
           " g, d = v.get, {}"]
    for i, f in enumerate(dataclasses.fields(cls)):
        t = hints[f.name]
        opt = get_origin(t) in (Union, types.UnionType)
        ns[f"C{i}"], ns[f"E{i}"] = _converter(t), getattr(_converter(get_args(t)[0] if opt else t), "exact", None)
        ns[f"D{i}"] = f.default if f.default is not dataclasses.MISSING else f.default_factory
        if f.default is not dataclasses.MISSING:
            absent = f"d[{f.name!r}] = D{i}"
        elif f.default_factory is not dataclasses.MISSING:
            absent = f"d[{f.name!r}] = D{i}()"
        else:
            absent = f"raise _Bad('required key is missing', {'.' + f.name!r})"
        src += [f" x = g({f.name!r}, M)", f" if type(x) is E{i}: d[{f.name!r}] = x", f" elif x is M: {absent}",
                " else:", f"  try: d[{f.name!r}] = C{i}(x)",
                f"  except _Bad as e: e.parts.append({'.' + f.name!r}); raise"]
    src += [" o = new(cls)", " o.__dict__ = d", " if check is not None and (m := check(o)): raise _Bad(m)",
            " return o"]
    exec("\n".join(src), ns)  # our own text: field names and slots
    reader = _READERS[cls] = ns["read"]
    return reader


def from_dict(cls: type[T], data: Any, *, where: str = "the manifest") -> T:
    """The record of class `cls` that plain `data` spells; SchemaError (a ValueError) when it does not fit."""
    try:
        with gc_paused():
            return (_READERS.get(cls) or _reader(cls))(data)
    except _Bad as e:
        raise SchemaError(where, "".join(reversed(e.parts)).removeprefix("."), e.problem) from None


_TRUSTED: dict[type, Any] = {}


def _trusted_reader(cls: type):
    """Once per class: a reader that builds the record from data already proven to fit (no type checks), as
    from_dict would build it: defaults filled in, nested records built, an int where a float goes made a float."""
    hints, nested, defaults, floats = get_type_hints(cls), [], [], []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        inner = [a for a in get_args(t) if a is not type(None)] if get_origin(t) in (Union, types.UnionType) else [t]
        t = inner[0] if len(inner) == 1 else t
        if dataclasses.is_dataclass(t):
            nested.append((f.name, False, t))
        elif get_origin(t) is list and dataclasses.is_dataclass(get_args(t)[0]):
            nested.append((f.name, True, get_args(t)[0]))
        elif t is float:
            floats.append(f.name)
        if f.default is not dataclasses.MISSING:
            defaults.append((f.name, False, f.default))
        elif f.default_factory is not dataclasses.MISSING:
            defaults.append((f.name, True, f.default_factory))
    new = object.__new__

    def read(v: dict):
        d = dict(v)
        for name, factory, default in defaults:
            if name not in d:
                d[name] = default() if factory else default
        for name, many, t in nested:
            x = d[name]
            if x is not None:
                r = _TRUSTED.get(t) or _trusted_reader(t)
                d[name] = [r(y) for y in x] if many else r(x)
        for name in floats:
            if type(d[name]) is int:
                d[name] = float(d[name])
        o = new(cls)
        o.__dict__ = d
        return o
    _TRUSTED[cls] = read
    return read


def from_trusted_dict(cls: type[T], data: dict) -> T:
    """from_dict's record for data that from_dict already accepted, without checking it again (the loader, for
    a runtime table whose exact bytes passed full verification on this machine: runtime/memo.py)."""
    with gc_paused():
        return (_TRUSTED.get(cls) or _trusted_reader(cls))(data)


_LEAF = frozenset({str, int, float, bool, type(None)})  # returned as they are


def _plain(v: Any) -> Any:
    t = type(v)
    if t in _LEAF:
        return v
    if t is list or t is tuple:
        for x in v:
            if type(x) not in _LEAF:
                return [_plain(x) for x in v]
        return list(v)  # a list of leaves (shapes, blocks, layouts' rows): copied, nothing to convert
    if t is dict:
        return {k: _plain(x) for k, x in v.items() if x is not None}
    if t in _NAMES or dataclasses.is_dataclass(v):
        return to_dict(v)
    return v


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def to_dict(record: Any) -> dict:
    """Plain data of a record in declared (on-disk) field order; None fields are left out (TOML has no null)."""
    out, fields = {}, getattr(record, "__dict__", None) or {}
    for name in _NAMES.get(type(record)) or _names(type(record)):
        v = fields.get(name, _MISSING)
        if v is _MISSING:
            v = getattr(record, name)
        if v is not None:
            out[name] = v if type(v) in _LEAF else _plain(v)
    return out


def to_json_bytes(record: Any) -> bytes:
    """Canonical JSON, as runtime.verify.runtime_table_bytes writes it: sorted keys, no spaces, ASCII."""
    with gc_paused():
        return json.dumps(to_dict(record), sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def runtime_table_bytes(m: QualifiedManifest) -> bytes:
    """The canonical runtime table of a qualified manifest (X.runtime.json; its size and sha256 go in the body)."""
    with gc_paused():
        return to_json_bytes(runtime_table(m))


__all__ = ["SchemaError", "from_dict", "from_trusted_dict", "gc_paused", "runtime_table_bytes", "to_dict", "to_json_bytes"]
