"""Qualification and the runtime share one launch contract (issue 28, "one contract"); CPU, fake tensors.

The qualifier launches through ``runtime.contract.Contract`` of the record the manifest signs (qualify/spec.py:
``Contract.at`` for geometry, shapes and scalars, ``Contract.bind_at`` for the packed arguments). This file holds
that to the end-to-end fact: for every symbol of the built-in catalog, the launch the worker's own call
(``SymbolRun.spec_at``, at the H200's ABI census and the build's state capacity) packs equals what an engine's keyword
call gets from the record after it went through the manifest writer (``assemble``), signing with its runtime table
and the loader's verified read (``open_verified``): the launch-contract fields of the two records, grid, block,
dynamic shared memory, every packed argument (type, value, alignment, its bytes at its slot), each literal scalar's
qualified value, and each pointer's element count (the engine refuses one element fewer than the qualifier's buffer).
At every dims the worker launches (qualification dims, the batch check's smaller batches, the sanitizer's batch, the
split check's chunk lengths, the equivalence check's GEMM shapes) and two other shapes.

A contract altered after qualification (grid, a shape, a derived or literal scalar, block, dynamic shared memory, a
blob's size) is reported as a disagreement by the launch comparison alone; the runtime's tensorless launch refuses
what bind refuses (a negative case per refusal).
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import struct
import types

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from runtime_fakes import FakeTorchTensor, gemm_wgmma, rmsnorm, softplus, ssm_step

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.catalog.routes import check_m_values
from mamba_forge.core.codec import to_dict
from mamba_forge.core.schema import Artifact, BuildManifest, ModuleBuild, Resources, SymbolBuild, Toolchain, Verdict
from mamba_forge.gpu.driver import PACK_FORMATS, PackedParams
from mamba_forge.manifest.qualified import sign_with_runtime_table
from mamba_forge.qualify import equivalence as E
from mamba_forge.qualify import spec as S
from mamba_forge.qualify import symbol_run as SR
from mamba_forge.qualify.assemble import assemble
from mamba_forge.qualify.events import LiveResources, SymbolResult, WorkerDevice
from mamba_forge.qualify.plan import Group
from mamba_forge.qualify.supervise import Outcome
from mamba_forge.runtime import signing
from mamba_forge.runtime.contract import Contract
from mamba_forge.runtime.contract_memo import _GIVEN
from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.sources import runtime_table_path
from mamba_forge.runtime.verify import open_verified

pytestmark = pytest.mark.usefixtures("fake_tensor_streams")  # tests/conftest.py
TARGET, CAPACITY = "sm_90a", 64
H200_BANK = S.param_bank_base((9, 0))  # the census the H200 reports: a 64-aligned blob at offset 48
LAUNCH_FIELDS = ("block", "grid", "dynamic_smem", "dims", "constants", "state_capacity", "params")


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(default_catalog_path())


def census(cat, name: str) -> list[list[int]]:
    sym = cat.symbols[name]
    return [list(x) for x in S.expected_abi(cat.module(sym.module).family(sym.family).params, H200_BANK)]


def worker_run(cat, name: str) -> SR.SymbolRun:
    """The worker's SymbolRun of `name` after a live admission that read the H200 census (no device touched:
    spec_at needs none)."""
    sym = cat.symbols[name]
    run = SR.SymbolRun(None, cat, None, {"seed": 0, "state_capacity": CAPACITY}, {"name": name},  # type: ignore[arg-type]
                       {"module": sym.module, "target": TARGET})
    run.result.params = census(cat, name)
    return run


@pytest.fixture(scope="module")
def signed(catalog, tmp_path_factory):
    """name -> the RuntimeSymbol an engine loads: every catalog symbol admitted in a manifest written by the
    qualifier's assemble (live census = the H200's), signed with its runtime table and read back by the loader."""
    folder = tmp_path_factory.mktemp("agreement")
    modules, results = [], {}
    for spec in catalog.modules:
        cubin = f"cubin of {spec.kind}".encode()
        (folder / TARGET).mkdir(exist_ok=True)
        (folder / TARGET / f"{spec.kind}.cubin").write_bytes(cubin)
        syms = []
        for s in spec.symbols:
            layout = census(catalog, s.name)
            syms.append(SymbolBuild(
                name=s.name, family=s.family, dtype=s.dtype or "", block=list(s.block), dynamic_smem=s.dynamic_smem,
                deterministic=s.deterministic, verdict=Verdict(status="admitted"),
                resources=Resources(registers=32, static_smem=0, stack_frame=0, spill_stores=0, spill_loads=0,
                                    max_threads=0, barriers=0, param_bytes=sum(x[1] for x in layout),
                                    param_layout=layout)))
            results[s.name] = SymbolResult(s.name, spec.kind, TARGET, "admitted", seed=1, params=layout,
                                           resources=LiveResources(32, 0, 0, 1024, 1))
        modules.append(ModuleBuild(
            kind=spec.kind, target=TARGET, role="qualify", mandatory=False, status="compiled", options=[],
            source_sha256="0" * 64, cache_key="k", symbols=syms,
            artifacts=[Artifact(path=f"{TARGET}/{spec.kind}.cubin", sha256=hashlib.sha256(cubin).hexdigest(),
                                size=len(cubin), code="cubin")]))
    build = BuildManifest(tool_version="0.1.0", catalog=catalog.name, catalog_sha256="0" * 64,
                          state_capacity=CAPACITY, targets=[TARGET], modules=modules,
                          toolchain=Toolchain(nvrtc_version="13.0", library={}, header_sha256={}, base_options=[]))
    req = types.SimpleNamespace(build=build, catalog=catalog, only_modules=None, level="quick", sanitizer="off")
    device = WorkerDevice(name="NVIDIA H200", cc="9.0", sm_count=132, driver_version=13000)
    groups = [Group(m.kind, TARGET, "qualify", None, None, []) for m in modules]
    manifest = assemble(req, {0: Outcome(results=results, device=device)}, groups, 1.0)  # type: ignore[arg-type]
    private = Ed25519PrivateKey.generate()
    doc, table = sign_with_runtime_table(manifest, private)
    path = folder / "h200.toml"
    path.write_bytes(doc)
    runtime_table_path(path).write_bytes(table)
    public = private.public_key()
    loaded = open_verified(path, keys={signing.key_id(public): public}, build=folder, full_body=False)
    return {s.name: s for s in loaded.manifest.symbols}


def launch_dims(cat, name: str) -> list[dict[str, int]]:
    """Every dims the worker launches `name` at, then two other shapes (each dim halved, each dim + 3; d_state
    kept under the capacity)."""
    sym = cat.symbols[name]
    fam = cat.module(sym.module).family(sym.family)
    q = fam.qualify
    base = dict(q.dims)
    out = [base]
    if q.batch_dim:
        out += [{**base, q.batch_dim: b} for b in [*S.batch_sizes(base[q.batch_dim]), SR.SANITIZE_BATCH]
                if b < base[q.batch_dim]]
    if fam.split is not None:
        length = base[fam.split.dim]
        out += [{**base, fam.split.dim: n} for c in fam.split.chunks for n in {c, length % c} if 0 < n < length]
    for _route, cls in E.memberships(cat, name):
        rung = next(r for r in cls.rungs if r.symbol == name)
        n, k = cls.check
        out += [{**base, "M": m, "N": n, "K": k} for m in check_m_values(rung)]
    out.append({d: v if d == "d_state" else v // 2 + 1 for d, v in base.items()})
    out.append({d: v if d == "d_state" else v + 3 for d, v in base.items()})
    return [_kept(fam.requires, d) for d in out]


def _kept(rules, dims: dict[str, int]) -> dict[str, int]:
    """dims moved inside the family's rules (a multiple rounded up, a maximum capped): the shapes a launch serves."""
    out = dict(dims)
    for d, m in rules.multiple_of.items():
        out[d] = -(-out[d] // m) * m
    for d, hi in rules.at_most.items():
        out[d] = min(out[d], hi)
    return out


# ---- the comparison --------------------------------------------------------------------------------------------


def _plain(v):
    """A record field as comparable plain data (Param records as the codec writes them)."""
    if isinstance(v, (list, tuple)):
        return [to_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
    return v


def record_differences(qualified, signed_record) -> list[str]:
    """The launch-contract fields on which the record the qualifier launched through and the signed one differ."""
    out = []
    for f in LAUNCH_FIELDS:
        a, b = _plain(getattr(qualified, f)), _plain(getattr(signed_record, f))
        if a != b:
            out.append(f"record {f}: qualified {a!r}, signed {b!r}")
    return out


def _slot_bytes(packed_address: int, values: list) -> list[bytes]:
    slots = (ctypes.c_void_p * len(values)).from_address(packed_address)
    return [ctypes.string_at(slots[i], len(v) if t == "bytes" else struct.calcsize(PACK_FORMATS[t]))
            for i, (t, v) in enumerate(values)]


def launch_differences(spec: S.LaunchSpec, engine: Contract) -> list[str]:
    """Where the qualifier's launch (spec.bind: the packed arguments it hands cuLaunchKernel) and an engine's keyword
    launch of `engine` with the same tensors, blobs and caller scalars differ; [] when they agree."""
    tensors = {b.name: FakeTorchTensor(b.count, b.dtype) for b in spec.buffers}
    blobs = {bl.name: bytes((i * 7 + len(bl.name)) % 256 for i in range(bl.size)) for bl in spec.blobs}
    qualified = spec.bind({n: t.data_ptr() for n, t in tensors.items()}, blobs)
    out = []
    kwargs: dict = {**tensors, **blobs}
    for pname, how, *_ in engine._plan:  # the caller's scalars: the engine passes what the qualifier launched with
        if how == _GIVEN:
            value = next(s.value for s in spec.scalars if s.name == pname)
            kwargs[pname] = value
            if engine.qualified_literals.get(pname) != value:
                out.append(f"literal {pname}: qualified with {value!r}, the record says "
                           f"{engine.qualified_literals.get(pname)!r}")
    for _, d, _, from_pointer, ask in engine._dim_plan:  # a dim no tensor gives is an argument
        if from_pointer < 0:
            kwargs[ask] = spec.dims[d]
    try:
        bound = engine.bind(kwargs)
    except LaunchRefused as exc:
        return [*out, f"the engine refuses the qualified launch: {exc}"]
    for what, a, b in (("grid", qualified.grid, bound.grid), ("block", qualified.block, bound.block),
                       ("dynamic smem", qualified.shared_mem, bound.shared_mem),
                       ("alignments", qualified.aligns, bound.aligns)):
        if a != b:
            out.append(f"{what}: qualified {a}, engine {b}")
    names = [p.name for p in engine.record.params]
    if len(qualified.values) != len(bound.values):
        return [*out, f"{len(qualified.values)} arguments qualified, {len(bound.values)} bound"]
    for name, a, b in zip(names, qualified.values, bound.values, strict=True):
        if a != b or type(a[1]) is not type(b[1]):
            out.append(f"argument {name}: qualified {a!r}, engine {b!r}")
    if not out:  # the same values at the same slots, byte for byte, through each side's packer
        ours = PackedParams(qualified.values, qualified.aligns)
        theirs = engine.packer.pack(bound.values)
        for name, a, b in zip(names, _slot_bytes(ours.address, qualified.values),
                              _slot_bytes(theirs.address, bound.values), strict=True):
            if a != b:
                out.append(f"argument {name}: packed {a.hex()} qualified, {b.hex()} by the engine")
    explicit = {**kwargs, **{ask: spec.dims[d] for _, d, _, _, ask in engine._dim_plan}}  # no dim from a tensor
    for b in spec.buffers:  # the qualifier's buffer is exactly the least the engine accepts
        try:
            engine.bind({**explicit, b.name: FakeTorchTensor(b.count - 1, b.dtype)})
        except LaunchRefused:
            continue
        out.append(f"{b.name}: the engine takes {b.count - 1} elements, the qualifier allocates {b.count}")
    return out


# ---- every catalog symbol, end to end --------------------------------------------------------------------------


def test_every_catalog_symbol_launches_in_qualification_as_the_signed_record_binds(catalog, signed):
    problems, launches, symbols = [], 0, 0
    for name in catalog.symbols:
        run = worker_run(catalog, name)
        if run.fam.qualify.skip:
            continue
        symbols += 1
        engine = Contract(signed[name])
        for dims in launch_dims(catalog, name):
            spec = run.spec_at(dims)
            diffs = record_differences(spec.contract.record, signed[name]) + launch_differences(spec, engine)
            problems += [f"{name} at {dims}: {d}" for d in diffs]
            launches += 1
    assert not problems, "\n".join(problems[:20])
    assert symbols == len(signed) == len(catalog.symbols) > 300
    assert launches >= 3 * symbols


def test_the_worker_launches_through_the_census_and_capacity_it_records(catalog, signed):
    """The record the worker's spec compiles is the signed one: its live census and the build's state capacity,
    which refuses a d_state past it in the qualifier as in an engine's launch."""
    capped = [n for n, s in catalog.symbols.items() if catalog.module(s.module).module.state_capacity
              and "d_state" in signed[n].dims and not catalog.module(s.module).family(s.family).qualify.skip]
    assert capped
    for name in capped:
        run = worker_run(catalog, name)
        spec = run.spec_at()
        assert spec.contract.record.state_capacity == signed[name].state_capacity == CAPACITY
        assert spec.abi == [tuple(x) for x in census(catalog, name)] == [(p.offset, p.size) for p in signed[name].params]
        over = {**spec.dims, "d_state": CAPACITY + 1}
        with pytest.raises(S.SpecError, match="the state capacity it was built with"):
            run.spec_at(over)
        with pytest.raises(LaunchRefused, match="the state capacity it was built with"):
            Contract(signed[name]).at({d: over[d] for d in spec.contract.dims})


# ---- a contract altered after qualification is a disagreement ----------------------------------------------------


def _altered_cases():
    def grid(r):
        return dataclasses.replace(r, grid=[f"({r.grid[0]}) + 1", *r.grid[1:]])

    def shape(r):  # the first pointer needs one more element than the qualifier allocated
        ps = list(r.params)
        i = next(i for i, p in enumerate(ps) if p.kind == "pointer")
        ps[i] = dataclasses.replace(ps[i], shape=[*ps[i].shape[:-1], f"({ps[i].shape[-1]}) + 1"])
        return dataclasses.replace(r, params=ps)

    def scalar(name, value):
        def alter(r):
            return dataclasses.replace(r, params=[dataclasses.replace(p, value=value) if p.name == name else p
                                                  for p in r.params])
        return alter

    def blob(r):
        return dataclasses.replace(r, params=[dataclasses.replace(p, size=p.size + 64) if p.kind == "blob" else p
                                              for p in r.params])

    return [
        ("softplus_forward_bf16", grid, "grid: qualified"),
        ("softplus_forward_bf16", shape, "the engine refuses the qualified launch: y of"),
        ("softplus_forward_bf16", lambda r: dataclasses.replace(r, block=[128, 1, 1]), "block:"),
        ("softplus_forward_bf16", lambda r: dataclasses.replace(r, dynamic_smem=16), "dynamic smem:"),
        ("ssm_step_forward_fused_f32", scalar("x_dbl_stride", "dt_rank + d_state"),
         "argument x_dbl_stride: qualified"),
        ("rmsnorm_forward", scalar("eps", "1e-06"), "literal eps: qualified with"),
        ("gemm_bi_nn_sm90a_wgmma_wg1_bf16", blob, "the engine refuses the qualified launch: tmA"),
    ]


@pytest.mark.parametrize(("name", "alter", "found"), _altered_cases(),
                         ids=["grid", "shape", "block", "smem", "derived-scalar", "literal", "blob-size"])
def test_an_altered_signed_contract_is_a_disagreement(catalog, signed, name, alter, found):
    spec = worker_run(catalog, name).spec_at()
    assert launch_differences(spec, Contract(signed[name])) == []  # unaltered: they agree
    changed = alter(signed[name])
    launch = launch_differences(spec, Contract(changed))
    assert any(found in d for d in launch), launch
    assert record_differences(spec.contract.record, changed)  # and the records differ


# ---- the tensorless launch refuses what bind refuses ------------------------------------------------------------


def test_at_gives_bind_s_launch_and_scalars():
    c = Contract(ssm_step("f32"))
    dims = {"batch": 3, "d_inner": 40, "d_state": 16, "dt_rank": 5}
    launch = c.at(dims)
    assert launch.grid == (4, 1, 1) and launch.block == (128, 1, 1) and launch.shared_mem == 0
    assert launch.scalars["x_dbl_stride"] == ("i32", 37) and launch.scalars["d_state"] == ("i32", 16)
    assert launch.counts["state"] == 3 * 40 * 16 and launch.shapes["x_dbl"] == (3 * 37,)
    lit = Contract(rmsnorm("bf16")).at({"rows": 4, "dim": 8})
    assert lit.scalars["eps"] == ("f32", 1e-05)  # a literal: the value it was qualified with


@pytest.mark.parametrize(("dims", "match"), [
    ({"batch": 3, "d_inner": 40, "d_state": 16}, "missing dim dt_rank"),
    ({"batch": 3, "d_inner": 40, "d_state": 16, "dt_rank": 5, "L": 2}, "takes no dim L"),
    ({"batch": -1, "d_inner": 40, "d_state": 16, "dt_rank": 5}, "dim batch = -1 is negative"),
    ({"batch": 3, "d_inner": 40, "d_state": 65, "dt_rank": 5}, "must be 1..64, the state capacity"),
    ({"batch": 3, "d_inner": 40, "d_state": 16, "dt_rank": 2.5}, "dim dt_rank of .* is a float"),
    ({"batch": 1 << 20, "d_inner": 1 << 20, "d_state": 16, "dt_rank": 5}, "grid dimension 0 = .* outside"),
    ({"batch": 3, "d_inner": 1 << 31, "d_state": 16, "dt_rank": 5}, "d_inner of .* does not fit i32"),
])
def test_at_refuses(dims, match):
    with pytest.raises(LaunchRefused, match=match):
        Contract(ssm_step("f32")).at(dims)


def test_at_refuses_a_caller_scalar_without_a_recorded_value():
    rec = softplus("f32")
    rec = dataclasses.replace(rec, params=[dataclasses.replace(p, value="") if p.name == "n" else p
                                           for p in rec.params])
    with pytest.raises(LaunchRefused, match="n of softplus_forward_f32: the record gives the scalar no value"):
        Contract(rec).at({"n": 10})


def test_bind_at_packs_what_bind_packs():
    c = Contract(gemm_wgmma("bf16"))
    launch = c.at({"M": 300, "N": 256, "K": 64})
    tensors = {"C": FakeTorchTensor(300 * 256, "bf16"), "A": FakeTorchTensor(300 * 64, "bf16"),
               "B": FakeTorchTensor(64 * 256, "bf16")}
    blobs = {"tmA": bytes(range(128)), "tmB": bytes(128)}
    ours = c.bind_at(launch, {k: t.data_ptr() for k, t in tensors.items()}, blobs)
    theirs = c.bind({**tensors, **blobs, "M": 300, "N": 256, "K": 64})
    assert ours.values == theirs.values and ours.aligns == theirs.aligns
    assert (ours.grid, ours.block, ours.shared_mem) == (theirs.grid, theirs.block, theirs.shared_mem)


@pytest.mark.parametrize(("change", "match"), [
    (lambda a, b: ({k: v for k, v in a.items() if k != "A"}, b),
     "missing argument A \\(a bf16 tensor\\)"),
    (lambda a, b: (a, {"tmA": b["tmA"]}), "missing argument tmB \\(bytes, exactly 128 long\\)"),
    (lambda a, b: (a, dict(b, tmB=bytes(64))), "tmB of .* is 64 bytes; the parameter is exactly 128 bytes"),
    (lambda a, b: (a, dict(b, tmB="maps")), "tmB of .* is a str; the parameter is a 128-byte blob"),
    (lambda a, b: (dict(a, C=0), b), "C of .*: its data pointer is 0"),
    (lambda a, b: (dict(a, C=a["A"] + 2), b), "an output partially overlaps an input"),
])
def test_bind_at_refuses(change, match):
    c = Contract(gemm_wgmma("bf16"))
    launch = c.at({"M": 64, "N": 64, "K": 64})
    addresses = {"C": 0x7000_0000_0000, "A": 0x7100_0000_0000, "B": 0x7200_0000_0000}
    addresses, blobs = change(addresses, {"tmA": bytes(128), "tmB": bytes(128)})
    with pytest.raises(LaunchRefused, match=match):
        c.bind_at(launch, addresses, blobs)
