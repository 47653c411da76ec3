"""JSON Schemas of `--json` output: the one envelope every command prints, and each command's result.

Manifest results are generated from the records of mamba_forge/core/schema.py (their type hints, as the
codec reads them); the small results of the other commands are written here by hand. The shipped files
(`mamba_forge/schemas/*.json`) are what :func:`generate` returns; `mamba-forge schema NAME` prints one and
`python scripts/gen_schemas.py` rewrites them (tests/test_cli_conventions.py checks they are current).
"""

from __future__ import annotations

import dataclasses
import json
import types
from importlib import resources
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

SCHEMA_VERSION = 1
DIALECT = "https://json-schema.org/draft/2020-12/schema"
ERROR = {"type": "object", "required": ["error", "exit_code"], "additionalProperties": False,
         "properties": {"error": {"type": "string"}, "exit_code": {"enum": [1, 2, 130]}}}

_S, _I, _N, _B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
_STRS = {"type": "array", "items": _S}


def _obj(props: dict, required: list[str] | None = None, *, closed: bool = True) -> dict:
    out: dict[str, Any] = {"type": "object", "properties": props, "required": list(props) if required is None else required}
    if closed:
        out["additionalProperties"] = False
    return out


# ---- from the records -----------------------------------------------------------------------------------------


def _of_type(t: Any, defs: dict) -> dict:
    origin = get_origin(t)
    if t is str:
        return dict(_S)
    if t is bool:
        return dict(_B)
    if t is int:
        return dict(_I)
    if t is float:
        return dict(_N)
    if t is Any:
        return {}
    if origin is Literal:
        return {"enum": list(get_args(t))}
    if origin in (list, tuple):
        args = [a for a in get_args(t) if a is not Ellipsis]
        return {"type": "array", "items": _of_type(args[0], defs) if args else {}}
    if origin is dict:
        return {"type": "object", "additionalProperties": _of_type(get_args(t)[1], defs)}
    if origin in (Union, types.UnionType):
        arms = [a for a in get_args(t) if a is not type(None)]
        return _of_type(arms[0], defs) if len(arms) == 1 else {"anyOf": [_of_type(a, defs) for a in arms]}
    if dataclasses.is_dataclass(t):
        return record_schema(t, defs)
    raise TypeError(f"no JSON Schema for {t!r}")


def record_schema(cls: type, defs: dict) -> dict:
    """A `$ref` to the schema of a record class (added to `defs`): its fields as `to_dict` writes them (None
    fields left out), unknown keys refused, fields without a default required."""
    name = cls.__name__
    if name not in defs:
        defs[name] = {}  # placeholder: records may nest
        hints = get_type_hints(cls)
        props, required = {}, []
        for f in dataclasses.fields(cls):
            if f.name.startswith("_"):
                continue
            props[f.name] = _of_type(hints[f.name], defs)
            optional = type(None) in get_args(hints[f.name])
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and not optional:
                required.append(f.name)
        defs[name] = _obj(props, required)
    return {"$ref": f"#/$defs/{name}"}


# ---- the results of each command ------------------------------------------------------------------------------


def _rows(props: dict) -> dict:
    return {"type": "array", "items": _obj(props, closed=False)}


def _results(defs: dict) -> dict[str, dict]:
    from mamba_forge.core.schema import BuildManifest, QualifiedManifest, ReleaseIndex

    build_m, qual_m, index_m = (record_schema(c, defs) for c in (BuildManifest, QualifiedManifest, ReleaseIndex))
    build_dry = _obj({"dry_run": {"const": True}, "catalog": _S, "targets": _STRS, "out": _S, "programs": _I,
                      "symbols": _I, "cache": _obj({"where": _S, "hits": _I, "misses": _I}),
                      "jobs": _rows({"module": _S, "target": _S, "role": _S, "symbols": _I, "cached": _B, "why": _S}),
                      "skipped": _rows({"module": _S, "why": _S})})
    qual_dry = _obj({"dry_run": {"const": True}, "device": _S, "cc": _S, "cc_source": _S,
                     "devices": {"type": "array", "items": _I}, "level": {"enum": ["quick", "full"]}, "passes": _I,
                     "jobs_per_gpu": _I, "groups": _rows({"module": _S, "target": _S, "role": _S, "symbols": _I}),
                     "symbols": _I, "launches": _I, "skipped": _rows({"module": _S, "target": _S, "why": _S})})
    rejected = _rows({"module": _S, "target": _S, "symbol": _S, "check": _S, "reason": _S})
    sig = {"type": "object", "properties": {"algorithm": _S, "key_id": _S, "development_key": _B, "value": _S}}
    change = {"type": "array", "items": {"type": "object", "required": ["symbol"]}}
    return {
        "build": {"anyOf": [_obj({"path": _S, "seconds": _N, "failed_mandatory": _STRS, "manifest": build_m}),
                            build_dry]},
        "report": {"anyOf": [
            _obj({"kind": {"const": "build"}, "summary": _rows({"module": _S, "target": _S, "status": _S,
                                                                "admitted": _I, "rejected": _I}),
                  "rejected": rejected}),
            _obj({"kind": {"const": "qualified"}, "manifest": {"type": "object"}, "device": {"type": "object"},
                  "toolchain": {"type": "object"}, "signature": sig,
                  "summary": _rows({"module": _S, "target": _S, "admitted": _I, "rejected": _I, "other": _I}),
                  "rejected_by_class": {"type": "object", "additionalProperties": _I},
                  "rejected": _rows({"module": _S, "target": _S, "symbol": _S, "check": _S, "class": _S, "reason": _S}),
                  "symbols": _rows({"symbol": _S, "module": _S, "target": _S, "status": _S}),
                  "artifacts": _rows({"path": _S, "sha256": _S, "size": _I}), "routes": {"type": "array"}}),
            _obj({"kind": {"const": "index"}, "index": index_m, "signature": sig}),
            _obj({"kind": {"const": "diff"}, "a": _S, "b": _S, "changed": _B, "digest_changed_symbols": _I,
                  **{k: {"type": "array", "items": _S} for k in ("added", "removed", "artifacts_added",
                                                                   "artifacts_removed")},
                  **{k: change for k in ("newly_rejected", "newly_admitted", "status_changed", "resource_changes",
                                         "digest_changes")},
                  "artifact_changes": _rows({"path": _S, "old": _S, "new": _S})}),
        ]},
        "verify": _obj({"path": _S, "kind": _S, "key_id": _S,
                        "development_key": _B, "summary": _S}),
        "merge": _obj({"path": _S, "manifests": _STRS}),
        "bundle": _obj({"path": _S}),
        "qualify": {"anyOf": [_obj({"path": _S, "public_key": _S, "notes": _STRS, "manifest": qual_m}), qual_dry]},
        "keygen": _obj({"private_key": _S, "public_key": _S, "key_id": _S}),
        "env": _obj({k: {} for k in ("mamba_forge", "python", "nvrtc", "cuda_bindings", "driver", "cache",
                                     "trusted_keys", "catalog", "targets", "environment")}),
        "cache-dir": _obj({"path": _S}),
        "cache-size": _obj({"path": _S, "bytes": _I, "entries": _I}),
        "cache-clean": _obj({"path": _S, "removed_bytes": _I, "removed_entries": _I}),
        "cache-prune": _obj({"path": _S, "max_bytes": _I, "removed_bytes": _I, "removed_entries": _I, "bytes": _I,
                             "entries": _I}),
        "schema": {"anyOf": [{"type": "object", "required": ["$schema"]}, _obj({"names": _STRS})]},
    }


def envelope_schema(command: str | None = None, result: dict | None = None) -> dict:
    props = {"schema_version": {"const": SCHEMA_VERSION},
             "command": {"const": command} if command else _S,
             "ok": _B,
             "result": {"anyOf": [result, ERROR]} if result is not None else {}}
    return _obj(props)


def generate() -> dict[str, dict]:
    """Every schema by name: `envelope` and one per command (its envelope, with its result or an error)."""
    out = {"envelope": {"$schema": DIALECT, "title": "mamba-forge --json envelope", **envelope_schema()}}
    defs: dict[str, dict] = {}
    results = _results(defs)
    for name, result in results.items():
        schema = {"$schema": DIALECT, "title": f"mamba-forge {name.replace('-', ' ')} --json",
                  **envelope_schema(name.replace("-", " "), result)}
        text = json.dumps(schema)
        used = {d for d in defs if f'"#/$defs/{d}"' in text}
        while True:  # records used by the records used
            more = {d for d in defs if d not in used and any(f'"#/$defs/{d}"' in json.dumps(defs[u]) for u in used)}
            if not more:
                break
            used |= more
        if used:
            schema["$defs"] = {d: defs[d] for d in sorted(used)}
        out[name] = schema
    return out


def names() -> list[str]:
    return sorted(generate())


def dumps(schema: dict) -> str:
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def shipped(name: str) -> str:
    """The shipped file's text (package data)."""
    return resources.files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8")


def file_name(command: str) -> str:
    """`cache dir` -> `cache-dir`."""
    return command.replace(" ", "-")


__all__ = ["SCHEMA_VERSION", "dumps", "envelope_schema", "file_name", "generate", "names", "record_schema", "shipped"]
