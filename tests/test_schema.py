"""mamba_forge.manifest: typed records and the one plain-data codec (CPU only)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import random
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.core import codec, expr, schema
from mamba_forge.core.codec import from_dict, runtime_table_bytes, to_dict, to_json_bytes
from mamba_forge.core.schema import (
    BuildManifest,
    QualifiedManifest,
    ReleaseIndex,
    RuntimeTable,
    SchemaError,
    runtime_table,
)
from mamba_forge.core.vocab import DTYPES
from mamba_forge.qualify.contract import tensor_map_hook

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "manifests" / "h200.toml"


def _e(v) -> str:
    return v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v)


def _v2_symbol(s: dict, cat, cap: int) -> dict:
    """A manifest_version 1 symbol table with its launch contract filled from the catalog (as the qualifier will)."""
    cs = cat.symbols[s["name"]]
    spec = cat.module(cs.module)
    fam = spec.family(cs.family)
    env = cs.params_env
    constants = {k: v for k, v in env.items() if isinstance(v, int)}
    constants.update({f"sizeof_{k}": DTYPES[v][1] for k, v in env.items() if isinstance(v, str) and v in DTYPES})
    params = []
    for p, (off, size) in zip(fam.params, s["params"], strict=True):
        kind = schema.param_kind(p.type)
        params.append({
            "name": p.name, "kind": kind, "type": p.type,
            "dtype": (p.dtype if p.dtype in DTYPES else env[p.dtype]) if kind == "pointer" else "",
            "role": "" if kind == "scalar" else p.role, **({"in_place_of": p.in_place_of} if p.in_place_of else {}),
            "shape": [_e(x) for x in p.shape],
            "value": "" if p.value is None else _e(p.value), "offset": off, "size": size,
        })
    grid = [_e(g) for g in fam.launch.grid]
    used = set().union(*(expr.names(x) for x in grid + [x for p in params for x in p["shape"]]
                         + [p["value"] for p in params if p["value"] and not p["value"][0].isdigit()]))
    out = {k: v for k, v in s.items() if k != "params"}
    i = list(out).index("dynamic_smem")
    items = list(out.items())
    extra = {"grid": grid, "dynamic_smem": s["dynamic_smem"], "dynamic_smem_expr": _e(fam.launch.dynamic_smem),
             "dims": sorted(used - set(constants)), "constants": constants,
             "state_capacity": cap if spec.module.state_capacity else 0, "params": params,
             "tensor_maps": tensor_map_hook(fam), "dims_multiple_of": dict(fam.requires.multiple_of),
             "dims_at_most": dict(fam.requires.at_most)}
    return dict(items[:i] + list(extra.items()) + items[i + 1:])


@pytest.fixture(scope="module")
def v1_body() -> dict:
    """The committed H200 manifest's body as manifest_version 1 wrote it: params as [offset, size] pairs and no
    launch contract (derived when the committed manifest is already version 2)."""
    body = tomllib.loads(H200.read_text())
    body.pop("signature")
    if body["manifest_version"] == 1:
        return body
    body["manifest_version"] = 1
    body.pop("sanitizer", None)
    for s in body["symbols"]:
        s["params"] = [[p["offset"], p["size"]] for p in s["params"]]
        for k in ("grid", "dynamic_smem_expr", "dims", "constants", "state_capacity"):
            s.pop(k, None)
    return body


@pytest.fixture(scope="module")
def qbody(v1_body) -> dict:
    """The committed H200 manifest as a manifest_version 2 body (288 symbols)."""
    cat = load_catalog(default_catalog_path())
    body = {k: v for k, v in v1_body.items() if k not in schema.RUNTIME_KEYS}
    body["manifest_version"] = 2
    body["symbols"] = [_v2_symbol(s, cat, body["state_capacity"]) for s in v1_body["symbols"]]
    return body


@pytest.fixture(scope="module")
def qm(qbody) -> QualifiedManifest:
    return from_dict(QualifiedManifest, qbody)


def build_body() -> dict:
    res = {"registers": 32, "static_smem": 0, "stack_frame": 0, "spill_stores": 0, "spill_loads": 0,
           "max_threads": 256, "barriers": 1, "param_bytes": 24, "param_layout": [[0, 8], [8, 8], [16, 8]]}
    sym = {"name": "k_f32", "family": "k", "dtype": "f32", "block": [256, 1, 1], "dynamic_smem": 0,
           "deterministic": True, "resources": res, "verdict": {"status": "admitted", "reason": "", "check": ""}}
    mod = {"kind": "Fixed", "target": "sm_90a", "role": "qualify", "built_only": False, "mandatory": True,
           "status": "compiled", "log_head": "", "options": ["-std=c++17"], "source_sha256": "a" * 64,
           "cache_key": "b" * 64, "cached": False, "compile_seconds": 1.5,
           "artifacts": [{"path": "sm_90a/Fixed.cubin", "sha256": "c" * 64, "size": 10, "code": "cubin"}],
           "symbols": [sym, {**sym, "name": "k_bf16", "resources": None}], "foreign_exports": []}
    return {"schema_version": 1, "kind": "build", "tool_version": "0.1.0", "catalog": "mamba-forge",
            "catalog_sha256": "d" * 64, "state_capacity": 64, "targets": ["sm_90a"],
            "toolchain": {"nvrtc_version": "13.0", "library": {"cuda-bindings": "13.3.1"},
                          "header_sha256": {"include/mf/common.cuh": "e" * 64}, "base_options": []},
            "modules": [mod]}


def index_body() -> dict:
    e = {"path": "h200.toml", "sha256": "f" * 64, "size": 100, "device_name": "NVIDIA H200", "cc": "9.0",
         "sm_count": 132, "driver_version": 13000, "level": "full", "key_id": "k" * 16}
    return {"schema_version": 1, "kind": "index", "manifest_version": 1, "created": "2026-11-29T21:11:03Z",
            "expires": "2027-11-29T21:11:03Z", "tool_version": "0.1.0", "development_key": False,
            "entries": [e, {**e, "path": "sub/b200.toml", "device_name": "NVIDIA B200"}]}


# ---- round trips ----------------------------------------------------------------------------------------


def _cases(qbody):
    return [(BuildManifest, build_body()), (ReleaseIndex, index_body()), (QualifiedManifest, qbody)]


def test_round_trip_toml_and_json(qbody):
    for cls, data in _cases(qbody):
        rec = from_dict(cls, data)
        d = to_dict(rec)
        assert from_dict(cls, tomllib.loads(tomli_w.dumps(d))) == rec
        assert from_dict(cls, json.loads(json.dumps(d))) == rec
        assert to_dict(from_dict(cls, d)) == d
        assert list(d) == [f.name for f in dataclasses.fields(cls) if getattr(rec, f.name) is not None]


def test_none_fields_are_left_out_and_defaults_fill_in():
    b = from_dict(BuildManifest, build_body())
    assert b.modules[0].symbols[1].resources is None
    assert "resources" not in to_dict(b)["modules"][0]["symbols"][1]
    d = build_body()
    for k in ("schema_version", "kind"):
        del d[k]
    m = d["modules"][0]
    for k in ("built_only", "log_head", "cached", "compile_seconds", "artifacts", "foreign_exports"):
        del m[k]
    b2 = from_dict(BuildManifest, d)
    assert (b2.schema_version, b2.kind, b2.modules[0].compile_seconds, b2.modules[0].artifacts) == (1, "build", 0.0, [])
    assert [s.name for _, s in b2.symbols()] == ["k_f32", "k_bf16"] and b2.failed_mandatory() == []


def test_int_is_taken_for_float_and_becomes_float():
    d = build_body()
    d["modules"][0]["compile_seconds"] = 3
    v = from_dict(BuildManifest, d).modules[0].compile_seconds
    assert v == 3.0 and type(v) is float


def test_the_qualifier_fills_the_contract_as_this_test_does(qbody):
    """mamba_forge.qualify.contract (what the qualifier writes) agrees with _v2_symbol on every symbol."""
    from mamba_forge.qualify.contract import contract

    cat = load_catalog(default_catalog_path())
    for s in qbody["symbols"]:
        sym = cat.symbols[s["name"]]
        got = contract(sym, cat.module(sym.module), [[p["offset"], p["size"]] for p in s["params"]],
                       qbody["state_capacity"])
        got["params"] = [to_dict(p) for p in got["params"]]
        assert got == {k: s[k] for k in got}, s["name"]
    # without a census that covers the declared parameters, no parameter is placed
    sym = cat.symbols[qbody["symbols"][0]["name"]]
    assert contract(sym, cat.module(sym.module), [], 64)["params"] == []


# ---- the runtime table ------------------------------------------------------------------------------------


def test_runtime_table_drops_checks_toolchain_and_binding(qm):
    qm = copy.deepcopy(qm)
    qm.runtime_table_sha256, qm.runtime_table_size = "0" * 64, 1
    t = runtime_table(qm)
    assert isinstance(t, RuntimeTable)
    d = to_dict(t)
    assert "toolchain" not in d and not set(schema.RUNTIME_KEYS) & set(d)
    assert all("checks" not in s for s in d["symbols"]) and any(s.checks for s in qm.symbols)
    assert len(d["symbols"]) == len(qm.symbols) == len(tomllib.loads(H200.read_text())["symbols"]) > 200
    assert t.symbols[0].params_layout() == qm.symbols[0].params_layout()
    assert t.symbol(qm.symbols[7].name) == runtime_table(qm).symbols[7]


def test_runtime_table_bytes_is_the_verify_projection(qm, v1_body):
    body = tomllib.loads(tomli_w.dumps(to_dict(qm)))
    data = runtime_table_bytes(qm)
    assert data == _projection(body)
    assert from_dict(RuntimeTable, json.loads(data)) == runtime_table(qm)
    # the same canonical form as the committed table, which is the projection of the committed body
    committed = tomllib.loads(H200.read_text())
    assert _projection(committed) == (ROOT / "manifests" / "h200.runtime.json").read_bytes()
    assert to_json_bytes(qm.device) == json.dumps(to_dict(qm.device), sort_keys=True, separators=(",", ":")).encode()


def _projection(body: dict) -> bytes:
    """The runtime table as the v1 qualifier wrote it from a plain body: no toolchain, binding or checks."""
    table = {k: v for k, v in body.items() if k not in ("toolchain", "signature", *schema.RUNTIME_KEYS)}
    table["symbols"] = [{k: v for k, v in s.items() if k != "checks"} for s in body["symbols"]]
    return json.dumps(table, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def test_params_layout_is_the_v1_census(qm, v1_body):
    assert [s.params_layout() for s in qm.symbols] == [s["params"] for s in v1_body["symbols"]]


def test_size_of_the_runtime_table(qm, v1_body):
    """Timing-free: the v2 table stays within a small multiple of the v1 table the loader read before."""
    v1 = len(_projection(v1_body))
    n = len(runtime_table_bytes(qm))
    assert v1 < n < 6 * v1, (v1, n)


def test_from_dict_is_fast_on_the_runtime_table(qm):
    data = json.loads(runtime_table_bytes(qm))
    from_dict(RuntimeTable, data)
    best = min(_timed(lambda: from_dict(RuntimeTable, data)) for _ in range(5))
    print(f"from_dict(RuntimeTable) on {len(data['symbols'])} symbols: {best * 1e3:.2f} ms")
    assert best < 0.1  # generous for loaded CI machines; measured ~6 ms


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ---- refusals ----------------------------------------------------------------------------------------------


def _refused(cls, data, path: str, fragment: str):
    with pytest.raises(SchemaError) as ei:
        from_dict(cls, data, where="m.toml")
    err = ei.value
    assert isinstance(err, ValueError) and "\n" not in str(err)
    assert err.path == path and fragment in err.problem, str(err)
    assert str(err) == (f"m.toml: {path}: {err.problem}" if path else f"m.toml: {err.problem}")
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_the_brief_example(qbody):
    d = copy.deepcopy(qbody)
    d["symbols"][3]["params"][1]["dtype"] = 7
    with pytest.raises(SchemaError, match=r"^the manifest: symbols\[3\]\.params\[1\]\.dtype: expected str, got int$"):
        from_dict(QualifiedManifest, d)


def _tables(node, path=()):
    """(path, table) for every table in a plain document."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _tables(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _tables(v, (*path, i))


def _fmt(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if p.isidentifier() else f"[{json.dumps(p)}]")
    return out.removeprefix(".")


def _record_tables(data):
    """Tables that are records (not dict[str, X] maps)."""
    return [(p, t) for p, t in _tables(data) if not (p and p[-1] in ("library", "header_sha256", "source_sha256",
                                                                       "constants", "needs", "dims_multiple_of",
                                                                       "dims_at_most"))]


def _scalar_leaves(data):
    for p, t in _record_tables(data):
        for k, v in t.items():
            if type(v) in (int, str, bool, float):
                yield (*p, k), v


def _get(data, path):
    for p in path[:-1]:
        data = data[p]
    return data


SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_unknown_key_refused(qbody, seed):
    rng = random.Random(seed)
    for cls, data in _cases(qbody):
        d = copy.deepcopy(data)
        path, t = rng.choice(_record_tables(d))
        t["zz_unknown"] = 1
        _refused(cls, d, _fmt(path), "unknown key 'zz_unknown'")


@pytest.mark.parametrize("seed", SEEDS)
def test_missing_required_key_refused(qbody, seed):
    rng = random.Random(seed)
    for cls, data in _cases(qbody):
        d = copy.deepcopy(data)
        rec = from_dict(cls, d)
        cands = []
        for path, _t in _record_tables(d):
            obj = rec
            for p in path:
                obj = obj[p] if isinstance(p, int) else getattr(obj, p)
            req = [f.name for f in dataclasses.fields(obj) if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
            cands += [(path, k) for k in req]
        path, k = rng.choice(cands)
        del _get(d, (*path, k))[k]
        _refused(cls, d, _fmt((*path, k)), "required key is missing")


WRONG = {int: ["7", 7.5, True, None, [], {}], str: [7, 1.0, False, [], {}], bool: [1, 0, "true", []],
         float: ["1.0", True, [], {}]}


@pytest.mark.parametrize("seed", SEEDS)
def test_wrong_type_at_depth_refused(qbody, seed):
    rng = random.Random(seed)
    for cls, data in _cases(qbody):
        d = copy.deepcopy(data)
        leaves = list(_scalar_leaves(d))
        path, v = rng.choice(leaves)
        bad = rng.choice(WRONG[type(v)])
        if bad is None and _optional_field(from_dict(cls, data), path):  # `seed: int | None`: None is its value
            bad = WRONG[type(v)][0]
        _get(d, path)[path[-1]] = bad
        with pytest.raises(SchemaError) as ei:
            from_dict(cls, d)
        assert ei.value.path == _fmt(path), str(ei.value)
        assert "expected" in ei.value.problem, str(ei.value)


def _optional_field(rec, path) -> bool:
    """Whether the record field at `path` (a key of a record, not an item of a list or dict) takes None."""
    obj = rec
    for p in path[:-1]:
        obj = obj[p] if isinstance(p, int) or isinstance(obj, dict) else getattr(obj, p)
    if not dataclasses.is_dataclass(obj):
        return False
    types = {f.name: str(f.type) for f in dataclasses.fields(obj)}
    return "None" in types.get(path[-1], "")


def test_bool_is_not_int_and_int_is_not_bool(qbody):
    d = copy.deepcopy(qbody)
    d["symbols"][5]["params"][0]["offset"] = True
    _refused(QualifiedManifest, d, "symbols[5].params[0].offset", "expected int, got bool")
    d = copy.deepcopy(qbody)
    d["symbols"][2]["block"][1] = False
    _refused(QualifiedManifest, d, "symbols[2].block[1]", "expected int, got bool")
    d = copy.deepcopy(qbody)
    d["symbols"][0]["checks"][0]["passed"] = 1
    _refused(QualifiedManifest, d, "symbols[0].checks[0].passed", "expected bool, got int")
    d = copy.deepcopy(qbody)
    d["manifest_version"] = 2.0
    _refused(QualifiedManifest, d, "manifest_version", "expected one of 2, got 2.0")
    d2 = index_body()  # True == 1: the Literal must compare types too
    d2["manifest_version"] = True
    _refused(ReleaseIndex, d2, "manifest_version", "expected one of 1, got True")


@pytest.mark.parametrize("path,value,fragment", [
    (("symbols", 0, "status"), "served", "expected one of 'admitted', 'rejected', 'checked', 'built-only'"),
    (("symbols", 4, "params", 0, "role"), "output", "expected one of"),
    (("symbols", 4, "params", 0, "kind"), "pointer ", "expected one of"),
    (("symbols", 4, "params", 0, "type"), "f16", "expected one of 'ptr'"),
    (("artifacts", 0, "code"), "ptx2", "expected one of 'cubin', 'ptx'"),
    (("level",), "slow", "expected one of 'quick', 'full'"),
    (("kind",), "index", "expected one of 'qualified'"),
    (("manifest_version",), 1, "expected one of 2, got 1"),
    (("schema_version",), 2, "expected one of 1, got 2"),
])
def test_bad_literal_refused(qbody, path, value, fragment):
    d = copy.deepcopy(qbody)
    _get(d, path)[path[-1]] = value
    _refused(QualifiedManifest, d, _fmt(path), fragment)


@pytest.mark.parametrize("path,value,fragment", [
    (("device",), [], "expected table, got list"),
    (("device",), "NVIDIA H200", "expected table, got str"),
    (("symbols", 1), 3, "expected table, got int"),
    (("symbols", 1, "resources"), [1, 2], "expected table, got list"),
    (("symbols", 1, "params", 2), None, "expected table, got null"),
    (("toolchain", "library"), ["a"], "expected table, got list"),
    (("symbols",), {"0": {}}, "expected list, got table"),
])
def test_non_table_where_a_table_is_expected(qbody, path, value, fragment):
    d = copy.deepcopy(qbody)
    _get(d, path)[path[-1]] = value
    _refused(QualifiedManifest, d, _fmt(path), fragment)
    with pytest.raises(SchemaError, match="expected table, got list"):
        from_dict(QualifiedManifest, [qbody])


def test_map_values_and_keys_checked(qbody):
    d = copy.deepcopy(qbody)
    d["toolchain"]["header_sha256"]["include/mf/common.cuh"] = 5
    _refused(QualifiedManifest, d, 'toolchain.header_sha256["include/mf/common.cuh"]', "expected str, got int")
    d = copy.deepcopy(qbody)
    d["toolchain"]["library"][3] = "x"  # only json/python can make this; still refused
    _refused(QualifiedManifest, d, "toolchain.library", "expected str keys, got int")


def test_deep_and_huge_nesting_refused_without_recursion(qbody):
    deep: list = []
    for _ in range(200_000):
        deep = [deep]
    nested: dict = {}
    for _ in range(200_000):
        nested = {"a": nested}
    for path, value, fragment in [(("symbols", 0, "params", 0, "shape"), deep, "expected str, got list"),
                                  (("symbols", 0, "block"), deep, "expected int, got list"),
                                  (("toolchain", "library"), nested, "expected str, got table"),
                                  (("device", "name"), deep, "expected str, got list"),
                                  (("symbols", 0, "status"), nested, "expected one of")]:
        d = copy.copy(qbody)
        d["symbols"] = list(qbody["symbols"])
        d["symbols"][0] = copy.deepcopy(qbody["symbols"][0])
        d["toolchain"] = copy.deepcopy(qbody["toolchain"])
        d["device"] = dict(qbody["device"])
        _get(d, path)[path[-1]] = value
        with pytest.raises(SchemaError) as ei:
            from_dict(QualifiedManifest, d)
        assert fragment in ei.value.problem and len(str(ei.value)) < 200, str(ei.value)
    huge = copy.copy(qbody)
    huge["routes"] = [{"layout": "nn", "a": "x", "b": "x", "c": "x", "symbols": ["s"] * 10}] * 50_000 + [7]
    _refused(QualifiedManifest, huge, "routes[50000]", "expected table, got int")


def test_long_strings_are_cut_in_messages(qbody):
    d = copy.deepcopy(qbody)
    d["level"] = "x" * 10_000
    with pytest.raises(SchemaError) as ei:
        from_dict(QualifiedManifest, d)
    assert len(str(ei.value)) < 200


@pytest.mark.parametrize("change,path,fragment", [
    ({"kind": "scalar"}, "symbols[4].params[0]", "is a pointer, not a scalar"),
    ({"dtype": ""}, "symbols[4].params[0]", "needs a dtype, a role and a shape"),
    ({"role": ""}, "symbols[4].params[0]", "needs a dtype, a role and a shape"),
    ({"offset": -8}, "symbols[4].params[0]", "negative offset"),
])
def test_param_rules(qbody, change, path, fragment):
    d = copy.deepcopy(qbody)
    d["symbols"][4]["params"][0].update(change)
    _refused(QualifiedManifest, d, path, fragment)
    scalar = next(i for i, p in enumerate(qbody["symbols"][4]["params"]) if p["kind"] == "scalar")
    d = copy.deepcopy(qbody)
    d["symbols"][4]["params"][scalar]["dtype"] = "f32"
    _refused(QualifiedManifest, d, f"symbols[4].params[{scalar}]", "takes neither dtype, role nor shape")


def _in_place_body(qbody) -> tuple[dict, int]:
    """(a copy of qbody, the index of its softplus_forward_bf16) with that symbol's y declared in place of x (the
    pair the catalog declares for it: kernels/fixed/activation.toml)."""
    d = copy.deepcopy(qbody)
    i = next(i for i, s in enumerate(d["symbols"]) if s["name"] == "softplus_forward_bf16")
    d["symbols"][i]["params"][0]["in_place_of"] = "x"
    return d, i


def test_in_place_of_travels_and_a_manifest_without_it_declares_none(qbody):
    d, i = _in_place_body(qbody)
    s = d["symbols"][i]
    assert [(p["name"], p.get("in_place_of")) for p in s["params"]] == [("y", "x"), ("x", None), ("n", None)]
    qm = from_dict(QualifiedManifest, d)
    rec = qm.symbols[i]
    assert [p.in_place_of for p in rec.params] == ["x", None, None]
    assert to_dict(rec)["params"][0]["in_place_of"] == "x" and "in_place_of" not in to_dict(rec)["params"][1]
    projected = json.loads(runtime_table_bytes(qm))["symbols"][i]["params"]
    assert projected[0]["in_place_of"] == "x" and "in_place_of" not in projected[1]
    old = tomllib.loads(H200.read_text())  # signed before in_place_of: every param reads None, and projects as it was
    assert all("in_place_of" not in p for t in old["symbols"] for p in t["params"])
    old.pop("signature")
    assert all(p.in_place_of is None for t in from_dict(QualifiedManifest, old).symbols for p in t.params)


@pytest.mark.parametrize("param,change,fragment", [
    (2, {"in_place_of": "x"}, "only an output (pointer, role out) may be in_place_of"),  # a scalar
    (1, {"in_place_of": "y"}, "only an output (pointer, role out) may be in_place_of"),  # an input
    (0, {"in_place_of": "n"}, "y.in_place_of 'n' names no input (pointer, role in) of its dtype and shape"),
    (0, {"in_place_of": "q"}, "y.in_place_of 'q' names no input"),
    (0, {"in_place_of": "y"}, "y.in_place_of 'y' names no input"),
    (1, {"dtype": "f32"}, "y.in_place_of 'x' names no input"),  # x of another dtype
    (1, {"shape": ["2*n"]}, "y.in_place_of 'x' names no input"),  # x of another shape
    (1, {"role": "inout"}, "y.in_place_of 'x' names no input"),
])
def test_in_place_of_rules_of_the_record(qbody, param, change, fragment):
    d, i = _in_place_body(qbody)
    d["symbols"][i]["params"][param].update(change)
    where = f"symbols[{i}].params[{param}]" if "only an output" in fragment else f"symbols[{i}]"
    _refused(QualifiedManifest, d, where, fragment)


def test_two_outputs_in_place_of_one_input_refused(qbody):
    d, i = _in_place_body(qbody)
    y = d["symbols"][i]["params"][0]
    d["symbols"][i]["params"].insert(1, {**y, "name": "y2", "offset": y["offset"] + 8})
    _refused(QualifiedManifest, d, f"symbols[{i}]", "y2.in_place_of 'x' names no input (pointer, role in) of its "
             "dtype and shape that no other output names")


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x.cubin", "a/../b", "a\\b", "", "./a", "manifest.toml",
                                 "runtime.json"])
def test_unsafe_paths_refused(qbody, bad):
    d = index_body()
    d["entries"][1]["path"] = bad
    _refused(ReleaseIndex, d, "entries[1]", "unsafe path")
    d = copy.deepcopy(qbody)
    d["artifacts"][0]["path"] = bad
    _refused(QualifiedManifest, d, "artifacts[0]", "unsafe path")


def test_duplicate_artifact_refused(qbody):
    d = copy.deepcopy(qbody)
    d["artifacts"].append(dict(d["artifacts"][0]))
    _refused(QualifiedManifest, d, "", "is named twice")


def test_v1_manifest_is_refused_by_version_first(v1_body):
    _refused(QualifiedManifest, v1_body, "manifest_version", "expected one of 2, got 1")


def test_index_requires_what_verify_requires():
    for k in ("path", "sha256", "size", "device_name", "cc", "sm_count"):
        d = index_body()
        del d["entries"][0][k]
        _refused(ReleaseIndex, d, f"entries[0].{k}", "required key is missing")
    d = index_body()
    for k in ("driver_version", "level", "key_id"):
        del d["entries"][0][k]
    assert from_dict(ReleaseIndex, d).entries[0].level == ""


def test_schema_imports_only_the_standard_library():
    code = ("import sys; import mamba_forge.core.codec, mamba_forge.core.schema; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('pydantic', 'numpy', 'tomli_w', 'cryptography')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert codec.__all__ and schema.__all__


def _typed(v):
    """A record's plain data with each leaf's exact type beside it (1 and 1.0, True and 1 told apart)."""
    import dataclasses

    if dataclasses.is_dataclass(v):
        return {f.name: _typed(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, list):
        return [_typed(x) for x in v]
    if isinstance(v, dict):
        return {k: _typed(x) for k, x in v.items()}
    return (type(v).__name__, v)


def test_trusted_reader_builds_what_from_dict_builds_for_the_committed_runtime_table():
    """The loader's memo-hit path (from_trusted_dict) and the checked path give the same records, leaf types
    included, for the committed table and for one with every defaulted field left out and ints where floats go."""
    import json
    from pathlib import Path

    from mamba_forge.core.codec import from_dict, from_trusted_dict
    from mamba_forge.core.schema import RuntimeTable

    plain = json.loads((Path(__file__).resolve().parent.parent / "manifests" / "h200.runtime.json").read_bytes())
    assert _typed(from_trusted_dict(RuntimeTable, plain)) == _typed(from_dict(RuntimeTable, plain))
    sparse = json.loads(json.dumps(plain))
    sparse["qualification_seconds"] = 100  # an int where a float goes
    for s in sparse["symbols"]:
        for k in ("dtype", "reason", "check", "fallback", "dynamic_smem", "constants", "seed"):
            s.pop(k, None)
        for p in s["params"]:
            p.pop("value", None)
    for key in ("sanitizer", "catalog", "development_key"):
        sparse.pop(key, None)
    checked, trusted = from_dict(RuntimeTable, sparse), from_trusted_dict(RuntimeTable, sparse)
    assert _typed(trusted) == _typed(checked)
    assert type(trusted.qualification_seconds) is float


def test_the_committed_runtime_table_is_the_projection_of_the_committed_manifest():
    """The committed H200 runtime table must be what this code projects from the committed manifest's body, or
    `bundle` and the loader refuse it ("not the projection of its signed body"): a record field added to the
    projection (the dims rules of 2026-12-04) without re-qualifying left a manifest that no longer bundled."""
    body = tomllib.loads(H200.read_text())
    body.pop("signature")
    qm = from_dict(QualifiedManifest, body)
    table = H200.with_name("h200.runtime.json").read_bytes()
    assert runtime_table_bytes(qm) == table
    # negative: a projection field the table does not carry makes the bytes differ
    ruled = next(s for s in qm.symbols if s.dims_multiple_of)
    ruled.dims_multiple_of = {**ruled.dims_multiple_of, "d_inner": 3}
    assert runtime_table_bytes(qm) != table
