"""The record machinery of the manifest schema: `record`, the decorator making a keyword-only dataclass that shares
one __init__, __repr__ and __eq__ with every other record (no per-class compiled code). Standard library only."""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass


def _record_repr(self) -> str:
    return f"{type(self).__name__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in dataclasses.fields(self))})"


def _record_eq(self, other) -> bool:
    if type(other) is not type(self):
        return NotImplemented
    return all(getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(self))


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"


class _RecordInit:
    """The one __init__ of every record, no per-class compiled code: keyword-only, defaults and default factories
    as the dataclass declares them, dataclass(init=True)'s TypeErrors for a positional, missing or unknown argument,
    and its signature for inspect (made only when asked). Each class's field plan is made on its first
    construction: most records are never built through __init__ in a process (the codec reads them without it)."""

    __slots__ = ("cls", "plan")
    __name__ = "__init__"

    def __init__(self, cls: type):
        self.cls, self.plan = cls, None

    def __get__(self, obj, owner=None):
        return self if obj is None else types.MethodType(self, obj)

    def _fields(self) -> tuple[tuple[str, object, object], ...]:
        if self.plan is None:
            self.plan = tuple((f.name, f.default, f.default_factory) for f in dataclasses.fields(self.cls) if f.init)
        return self.plan

    def __call__(self, obj, /, **kwargs) -> None:
        missing = []
        absent = dataclasses.MISSING
        for name, default, factory in self.plan or self._fields():
            if name in kwargs:
                value = kwargs.pop(name)
            elif default is not absent:
                value = default
            elif factory is not absent:
                value = factory()
            else:
                missing.append(name)
                continue
            setattr(obj, name, value)
        if missing:
            names = " and ".join(", ".join(repr(n) for n in missing).rsplit(", ", 1))
            raise TypeError(f"{self.cls.__qualname__}.__init__() missing {len(missing)} required keyword-only "
                            f"argument{'s' if len(missing) > 1 else ''}: {names}")
        if kwargs:
            raise TypeError(f"{self.cls.__qualname__}.__init__() got an unexpected keyword argument "
                            f"{next(iter(kwargs))!r}")

    @property
    def __signature__(self):
        import inspect

        kw, empty = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty
        params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        for name, default, factory in self._fields():
            value = (default if default is not dataclasses.MISSING
                     else _Factory() if factory is not dataclasses.MISSING else empty)
            params.append(inspect.Parameter(name, kw, default=value))
        return inspect.Signature(params, return_annotation=None)


def _finish(out: type) -> type:
    out.__repr__, out.__eq__, out.__hash__, out.__init__ = _record_repr, _record_eq, None, _RecordInit(out)
    return out


def record(cls: type) -> type:
    """A keyword-only dataclass sharing one __repr__, one __eq__ and one __init__ (no per-class compiled code), with a
    docstring (dataclass otherwise computes one with inspect.signature): dataclasses compile __init__, __repr__ and
    __eq__ per class, which was most of what this module added to `import mamba_forge.runtime` (20 classes).
    Fields, defaults, dataclasses.fields/replace/asdict and equality are the stdlib dataclass's."""
    if cls.__doc__ is None:
        cls.__doc__ = f"The {cls.__name__} record of the manifest schema."
    return _finish(dataclass(kw_only=True, init=False, repr=False, eq=False)(cls))
