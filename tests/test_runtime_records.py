"""The schema's records construct exactly as the stdlib dataclasses they are (one shared __init__,
schema._RecordInit, no per-class compiled code): same keyword-only signature, defaults, fresh default
factories, refusals."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from mamba_forge.core import schema

RECORDS = [getattr(schema, n) for n in schema.__all__ if dataclasses.is_dataclass(getattr(schema, n, None))]


def _reference(cls: type) -> type:
    """The plain kw_only dataclass with cls's fields: what __init__ must behave like."""
    fields = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
              for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__, fields, kw_only=True)


def _required(cls: type) -> dict:
    return {f.name: f"v-{f.name}" for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_record_init_matches_the_dataclass(cls):
    assert len(RECORDS) >= 20
    ref = _reference(cls)
    kw = _required(cls)
    a, b, want = cls(**kw), cls(**kw), ref(**kw)
    for f in dataclasses.fields(cls):
        assert getattr(a, f.name) == getattr(want, f.name), f.name
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(a, f.name) is not getattr(b, f.name), f"{f.name}: a shared default"
    assert a == b and dataclasses.replace(a) == a and dataclasses.asdict(a) == dataclasses.asdict(want)
    sig, ref_sig = inspect.signature(cls.__init__), inspect.signature(ref.__init__)
    assert [(p.name, p.kind) for p in sig.parameters.values()] == [(p.name, p.kind) for p in ref_sig.parameters.values()]
    with pytest.raises(TypeError):
        cls(**kw, no_such_field=1)
    with pytest.raises(TypeError):
        cls("positional", **kw)
    if kw:
        with pytest.raises(TypeError):
            cls(**dict(list(kw.items())[1:]))
    assert cls.__doc__ and "(" not in cls.__doc__.partition("\n")[0][:len(cls.__name__) + 1]
