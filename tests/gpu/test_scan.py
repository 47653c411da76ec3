"""GPU checks for the selective-scan family (kernels/fixed/scan.{cu,toml}); run on the H200.

The scan module is built alone (a one-module catalog over the same kernels/fixed/scan.cu and scan.toml, so a
broken sibling family cannot hide these results), at state capacity 64 unless a test says otherwise.

Per symbol (every symbol of scan.toml, launched from its catalog spec via mamba_forge.qualify.spec):
  * fresh random inputs, outputs poisoned with 0xFF first: every output element written (finite),
    within tolerance of the float64 reference (normwise: f32 outputs 2e-5 of the largest |ref|, bf16/f16 outputs
    1e-2), at the qualification shape and at an odd shape (L and d_state tails, d_state not a multiple of 4);
  * five runs bitwise equal;
  * batch invariance: the leading batch elements of a smaller launch equal the full launch's bit for bit.
Pipelines: parallel forward (save) -> backward -> reductions equal the analytic float64 gradients; the chunked
training path (burn-in save per chunk, backward_local with dh_last chained, reduce_d_a_log_chunks) equals the
whole-sequence gradients; d_state above the capacity is refused before any launch (and the kernels, launched
anyway, write nothing); capacities 16 and 256 build without spills and compute correctly.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import empty_device, from_device, load_cubin, reference_outputs, to_device  # noqa: E402
from gpu_support import launch as gpu_launch  # noqa: E402

from mamba_forge.catalog.model import default_catalog_path, load_catalog  # noqa: E402
from mamba_forge.core.errors import ForgeError  # noqa: E402
from mamba_forge.gpu import driver as cu  # noqa: E402
from mamba_forge.qualify import fills  # noqa: E402
from mamba_forge.qualify import spec as S  # noqa: E402
from mamba_forge.references import scan as ref  # noqa: E402

pytestmark = pytest.mark.gpu

KERNELS = default_catalog_path().parent
TOL = {"f32": 2e-5, "bf16": 1e-2, "f16": 1e-2}

_CATALOG = """[catalog]
schema = 1
name = "scan-only"

[defaults]
options = ["--extra-device-vectorization"]
policy = { max_regs = 255, max_stack = 0, max_spill = 0, min_blocks_per_sm = 1 }

[[module]]
kind = "Fixed"
mandatory = true
arch = ["sm_80+"]
state_capacity = true
deterministic = true
sources = ["fixed/scan.cu", "fixed/tokens.cu"]
families = ["fixed/scan.toml", "fixed/tokens.toml"]
"""


def scan_catalog_path() -> Path:
    """A one-module catalog over copies of the repo's scan sources (copied, not linked: a catalog's paths must
    stay inside its folder, so the same bytes travel instead)."""
    d = Path(tempfile.mkdtemp(prefix="mf-scan-cat-"))
    shutil.copytree(KERNELS / "fixed", d / "fixed")
    shutil.copytree(KERNELS / "include", d / "include")
    (d / "catalog.toml").write_text(_CATALOG)
    return d / "catalog.toml"


class ScanOps:
    """The scan module built for one target and capacity; launches by symbol name through mamba_forge.gpu."""

    _cache: dict = {}

    def __init__(self, state_cap: int = 64, target: str = "sm_90a"):
        from mamba_forge.build.builder import BuildRequest, build
        from mamba_forge.catalog.targets import get_target

        key = (state_cap, target)
        if key not in ScanOps._cache:
            cat = load_catalog(scan_catalog_path())
            out = Path(tempfile.mkdtemp(prefix=f"mf-scan-{target}-{state_cap}-"))
            man = build(BuildRequest(cat, [get_target(target)], out, state_capacity=state_cap))
            ScanOps._cache[key] = (cat, out, man)
        self.catalog, self.out, self.manifest = ScanOps._cache[key]
        self.state_cap = state_cap
        self.fixed = self.catalog.module("Fixed")
        self.families = {f.name: f for f in self.fixed.families}
        self.symbols = {s.name: s for s in self.fixed.symbols}

    def verdicts(self):
        return {s.name: s.verdict for m, s in self.manifest.symbols()}

    def fn(self, name: str) -> cu.Function:
        mod = next(m for m, _ in self.manifest.symbols())
        cubin = next(a for a in mod.artifacts if a.code == "cubin")
        return load_cubin(self.out / cubin.path).function(name)

    def launch(self, name: str, grid, block, args, stream=None, sync: bool = True, smem: int = 0):
        gpu_launch(self.fn(name), grid, block, args, smem=smem, stream=stream, sync=sync)

    # ---- launches from the catalog spec (dims override the qualification dims) ----
    def spec(self, name: str, dims: dict | None = None):
        sym = self.symbols[name]
        return S.evaluate(sym, self.families[sym.family], dims)

    def run_spec(self, spec, host: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Launch with the given host inputs (already in their dtypes); returns every output as float64."""
        ref.check_launch(spec.family, spec.dims, self.state_cap)
        dev, args = {}, [None] * (len(spec.buffers) + len(spec.scalars))
        for b in spec.buffers:
            if b.role == "out":
                dev[b.name] = empty_device(b.count, b.dtype)
            else:
                dev[b.name] = to_device(host[b.name], b.dtype)
            args[b.index] = dev[b.name]
        for s in spec.scalars:
            args[s.index] = {"i32": np.int32, "i64": np.int64, "u32": np.uint32, "u64": np.uint64,
                             "f32": np.float32, "f64": np.float64}[s.type](s.value)
        self.launch(spec.symbol, spec.grid, spec.block, args, smem=spec.dynamic_smem)  # the token-major fold: 64 KiB
        return {b.name: from_device(dev[b.name], b.dtype) for b in spec.outputs}

    def run_bits(self, spec, host) -> dict[str, bytes]:
        got = self.run_spec(spec, host)
        return {k: v.tobytes() for k, v in got.items()}


def _inputs(spec, rng) -> dict[str, np.ndarray]:
    return {b.name: fills.make_input(b, "uniform", rng) for b in spec.buffers if b.needs_fill}


def _close(got: np.ndarray, want: np.ndarray, dtype: str, what: str):
    assert np.all(np.isfinite(got)), f"{what}: unwritten or non-finite elements at {np.flatnonzero(~np.isfinite(got))[:8]}"
    scale = max(float(np.max(np.abs(want))), 1e-30)
    err = float(np.max(np.abs(got - want))) / scale
    assert err <= TOL[dtype], f"{what}: normwise error {err:.3e} > {TOL[dtype]:.0e}"


def _odd_dims(dims: dict, fam) -> dict:
    """Tails everywhere, within the family's catalog dims rules (`requires`: the token-major fold serves at most
    16 states, the backward folds whole channel groups)."""
    d = dict(dims)
    if "L" in d and "d_inner" in d:
        d.update(batch=3, d_inner=24, d_state=35, L=523)  # tails: L % 8, d_state % 4, > 2 chunks
    elif "dt_rank" in d:
        d.update(batch=5, d_inner=40, d_state=35, dt_rank=13)
    elif "d_inner" in d and "d_state" in d:
        d.update(batch=5, d_inner=40, d_state=35)
    elif "groups" in d:
        d.update(batch=2, groups=3, d_state=35, L=77)
    elif "dn" in d:
        d["dn"] = 1001
    elif "d_inner" in d:
        d["d_inner"] = 333
    for k, hi in fam.requires.at_most.items():
        if k in d:
            d[k] = min(d[k], hi)
    for k, m in fam.requires.multiple_of.items():
        if k in d and d[k] % m:
            d[k] += m - d[k] % m
    return d


@pytest.fixture(scope="module")
def ops():
    return ScanOps(64)


def _all_names():
    """Every ssm_ symbol of the catalog's Fixed module; the harness builds the files that hold them (a symbol the
    harness lacks fails test_all_admitted, never skips)."""
    cat = load_catalog(default_catalog_path())
    return sorted(s.name for s in cat.module("Fixed").symbols if s.name.startswith("ssm_"))


NAMES = _all_names()


def test_all_admitted(ops):
    v = ops.verdicts()
    bad = {k: x.reason for k, x in v.items() if x.status != "admitted"}
    assert not bad and {k for k in v if k.startswith("ssm_")} == set(NAMES)


@pytest.mark.parametrize("odd", [False, True], ids=["qual", "odd"])
@pytest.mark.parametrize("name", NAMES)
def test_symbol_matches_reference_and_repeats(ops, name, odd):
    seed = int.from_bytes(np.random.bytes(4), "little")
    rng = np.random.default_rng(seed)
    spec = ops.spec(name)
    if odd:
        spec = ops.spec(name, _odd_dims(spec.dims, ops.families[spec.family]))
    host = _inputs(spec, rng)
    got = ops.run_spec(spec, host)
    want = reference_outputs(ops.families[spec.family], spec, host)  # the family's own
    for b in spec.outputs:
        if b.name in want:
            _close(got[b.name], want[b.name], b.dtype, f"{name} {b.name} (seed {seed}, dims {spec.dims})")
        else:
            assert np.all(np.isfinite(got[b.name])), f"{name} {b.name} not fully written"
    first = {k: v.tobytes() for k, v in got.items()}
    for _ in range(4):
        assert ops.run_bits(spec, host) == first, f"{name}: a repeated run differs (seed {seed})"


@pytest.mark.parametrize("name", [n for n in NAMES if "reduce_d_D" not in n and "reduce_d_a_log" not in n])
def test_batch_invariance(ops, name):
    rng = np.random.default_rng(11)
    full = ops.spec(name)
    host = _inputs(full, rng)
    got_full = ops.run_spec(full, host)
    for nb in S.batch_sizes(full.dims["batch"]):
        small = ops.spec(name, {**full.dims, "batch": nb})
        hs = {}
        for fb, sb in zip(full.buffers, small.buffers, strict=True):
            if fb.name in host:
                hs[fb.name] = S.leading_rows(host[fb.name], fb, sb)
        got = ops.run_spec(small, hs)
        for fb, sb in zip(full.buffers, small.buffers, strict=True):
            if fb.is_output:
                lead = S.leading_rows(got_full[fb.name], fb, sb)
                assert lead.tobytes() == got[fb.name].tobytes(), f"{name} {fb.name}: batch {nb} differs from batch {full.dims['batch']}"


def _dev(ops, x, t):
    return to_device(x, t)


def _fwd_bwd(ops, t, x, dout, b, d, n, L, fold=False):
    """Parallel forward (save) then backward and reductions; returns float64 host arrays."""
    spec = ops.spec(f"ssm_parallel_scan_fwd_{t}" if t != "f32" else "ssm_parallel_scan_fwd",
                    {"batch": b, "d_inner": d, "d_state": n, "L": L})
    host = {"u": x["u"], "delta": x["delta"], "A_log": x["A_log"], "Bm": x["B"], "Cm": x["C"], "Dp": x["D"], "z": x["z"],
            "delta_bias": x["delta_bias"]}
    host = {k: np.asarray(v).ravel().astype(S.NP_DTYPES[bb.dtype]) for bb in spec.buffers for k, v in host.items() if bb.name == k}
    fw = ops.run_spec(spec, host)
    bname = ("ssm_parallel_scan_bwd_fold_" if fold else "ssm_parallel_scan_bwd_") + t
    bspec = ops.spec(bname, {"batch": b, "d_inner": d, "d_state": n, "L": L})
    bh = dict(host)
    bh["saved"] = fw["saved"].astype(np.float32)
    bh["dout"] = np.asarray(dout).ravel().astype(S.NP_DTYPES[t])
    bw = ops.run_spec(bspec, bh)
    w = ref.BWD_GROUP[bspec.family]
    red = ops.spec(f"ssm_reduce_d_BC_groups_{t}", {"batch": b, "groups": d // w, "d_state": n, "L": L})
    dB = ops.run_spec(red, {"part": bw["dB_part"].astype(np.float32)})["out"]
    dC = ops.run_spec(red, {"part": bw["dC_part"].astype(np.float32)})["out"]
    redt = ops.spec(f"ssm_reduce_d_BC_groups_tmajor_{t}", {"batch": b, "groups": d // w, "d_state": n, "L": L})
    dBt = ops.run_spec(redt, {"part": bw["dB_part"].astype(np.float32)})["out"]
    rd = ops.spec("ssm_reduce_d_D", {"batch": b, "d_inner": d})
    dD = ops.run_spec(rd, {"part": bw["dD_part"].astype(np.float32)})["out"]
    dbias = ops.run_spec(rd, {"part": bw["dbias_part"].astype(np.float32)})["out"]
    ra = ops.spec("ssm_reduce_d_a_log", {"batch": b, "dn": d * n})
    dAl = ops.run_spec(ra, {"part": bw["dA_part"].astype(np.float32), "A_log": host["A_log"]})["out"]
    rounded = {k: S.as_f64(v, bb.dtype) for bb in spec.buffers for k, v in host.items() if bb.name == k}
    return fw, bw, dict(dB=dB, dC=dC, dBt=dBt, dD=dD, dbias=dbias, dA_log=dAl), rounded


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("t", ["f32", "bf16", "f16"])
def test_forward_backward_pipeline_matches_analytic_gradients(ops, t, fold):
    b, d, n, L = 2, 16, 16, 700
    rng = np.random.default_rng(21)
    x = {"u": rng.uniform(-1, 1, (b, d, L)), "delta": rng.uniform(-4, 0, (b, d, L)), "A_log": rng.uniform(-1, 1.5, (d, n)),
         "B": rng.uniform(-1, 1, (b, n, L)), "C": rng.uniform(-1, 1, (b, n, L)), "D": rng.uniform(-1, 1, d),
         "z": rng.uniform(-3, 3, (b, d, L)), "delta_bias": rng.uniform(-1, 1, d)}
    dout = rng.uniform(-1, 1, (b, d, L))
    fw, bw, red, r = _fwd_bwd(ops, t, x, dout, b, d, n, L, fold)
    xr = dict(u=r["u"].reshape(b, d, L), delta=r["delta"].reshape(b, d, L), A_log=r["A_log"].reshape(d, n),
              B=r["Bm"].reshape(b, n, L), C=r["Cm"].reshape(b, n, L), D=r["Dp"], z=r["z"].reshape(b, d, L),
              delta_bias=r["delta_bias"])
    out, _, last = ref.scan_forward(**xr)
    _close(fw["out"], out.ravel(), t, "forward out")
    _close(fw["last_state"], last.ravel(), "f32", "last_state")
    gr = ref.scan_backward(S.as_f64(np.asarray(dout).astype(S.NP_DTYPES[t]), t), **xr)
    tol_t = t if t != "f32" else "f32"
    _close(bw["du"], gr["du"].ravel(), tol_t, "du")
    _close(bw["ddelta"], gr["ddelta"].ravel(), tol_t, "ddelta")
    _close(bw["dz"], gr["dz"].ravel(), tol_t, "dz")
    _close(red["dB"], gr["dB_bd"].sum(axis=1).ravel(), tol_t, "dB")
    _close(red["dC"], gr["dC_bd"].sum(axis=1).ravel(), tol_t, "dC")
    _close(red["dBt"], gr["dB_bd"].sum(axis=1).transpose(0, 2, 1).ravel(), tol_t, "dB tmajor")
    # bf16/f16 inputs: the saved states pass through f32 exactly, so f32-level sums hold for the f32 outputs
    _close(red["dD"], gr["dD"].sum(axis=0), "bf16" if t != "f32" else "f32", "dD")
    _close(red["dbias"], gr["dbias"].sum(axis=0), "bf16" if t != "f32" else "f32", "d delta_bias")
    _close(red["dA_log"], (gr["dA"].sum(axis=0) * -np.exp(xr["A_log"])).ravel(), "bf16" if t != "f32" else "f32", "dA_log")


def test_nosave_and_burnin_agree_with_the_saved_forward(ops):
    rng = np.random.default_rng(31)
    dims = {"batch": 2, "d_inner": 8, "d_state": 16, "L": 1100}
    sp = ops.spec("ssm_parallel_scan_fwd", dims)
    host = _inputs(sp, rng)
    a = ops.run_spec(sp, host)
    b = ops.run_spec(ops.spec("ssm_parallel_scan_fwd_nosave", dims), host)
    bi = ops.spec("ssm_burnin_forward", dims)
    hb = dict(host)
    hb["state"] = np.zeros(dims["batch"] * dims["d_inner"] * dims["d_state"], np.float32)
    c = ops.run_spec(bi, hb)
    _close(b["out"], a["out"], "f32", "nosave vs save out")
    _close(c["out"], a["out"], "f32", "burn-in vs parallel out")
    _close(c["saved"], a["saved"], "f32", "burn-in vs parallel saved states")
    _close(c["state"], a["last_state"], "f32", "burn-in vs parallel final state")


def test_chunked_training_path_equals_whole_sequence(ops):
    """Burn-in (save) over two chunks of a sequence, backward_local on the second then the first with dh_last
    chained from dh0, dA partials reduced over chunks: equals the whole-sequence gradients."""
    bsz, d, n, L1, L2 = 2, 8, 16, 300, 290
    L = L1 + L2
    rng = np.random.default_rng(41)
    f = {"u": rng.uniform(-1, 1, (bsz, d, L)), "delta": rng.uniform(-4, 0, (bsz, d, L)), "B": rng.uniform(-1, 1, (bsz, n, L)),
         "C": rng.uniform(-1, 1, (bsz, n, L)), "z": rng.uniform(-3, 3, (bsz, d, L))}
    A_log, D, bias = rng.uniform(-1, 1.5, (d, n)), rng.uniform(-1, 1, d), rng.uniform(-1, 1, d)
    dout = rng.uniform(-1, 1, (bsz, d, L))
    f32 = np.float32
    pieces = [(0, L1), (L1, L2)]

    def host(lo, ln):
        hh = {k: np.ascontiguousarray(v[..., lo:lo + ln]).ravel().astype(f32) for k, v in f.items()}
        return {"u": hh["u"], "delta": hh["delta"], "Bm": hh["B"], "Cm": hh["C"], "z": hh["z"], "A_log": A_log.ravel().astype(f32),
                "Dp": D.astype(f32), "delta_bias": bias.astype(f32)}

    state = np.zeros(bsz * d * n, f32)
    saved = []
    for lo, ln in pieces:
        hs = host(lo, ln)
        hs["state"] = state
        r = ops.run_spec(ops.spec("ssm_burnin_forward", {"batch": bsz, "d_inner": d, "d_state": n, "L": ln}), hs)
        saved.append(r["saved"].astype(f32))
        state = r["state"].astype(f32)
    dh = np.zeros(bsz * d * n, f32)
    du = [None, None]
    dA_parts = [None, None]
    for k in (1, 0):
        lo, ln = pieces[k]
        hs = host(lo, ln)
        hs.update(saved=saved[k], dh_last=dh, dout=np.ascontiguousarray(dout[..., lo:lo + ln]).ravel().astype(f32))
        r = ops.run_spec(ops.spec("ssm_backward_local", {"batch": bsz, "d_inner": d, "d_state": n, "L": ln}), hs)
        dh = r["dh0"].astype(f32)
        du[k] = r["du"].reshape(bsz, d, ln)
        dA_parts[k] = r["dA_part"].astype(f32)
    part = np.concatenate(dA_parts)
    rc = ops.spec("ssm_reduce_d_a_log_chunks", {"nchunks": 2, "batch": bsz, "dn": d * n})
    dAl = ops.run_spec(rc, {"part": part, "A_log": A_log.ravel().astype(f32)})["out"]
    xr = {k: np.asarray(v, dtype=f32).astype(np.float64) for k, v in f.items()}
    gr = ref.scan_backward(dout.astype(f32).astype(np.float64), xr["u"], xr["delta"], A_log.astype(f32).astype(np.float64),
                           xr["B"], xr["C"], D.astype(f32).astype(np.float64), xr["z"], bias.astype(f32).astype(np.float64))
    _close(np.concatenate(du, axis=2).ravel(), gr["du"].ravel(), "f32", "du over chunks")
    want = gr["dA"].sum(axis=0) * -np.exp(A_log.astype(f32).astype(np.float64))
    _close(dAl, want.ravel(), "f32", "dA_log over chunks")
    _close(dh, gr["dh0"].ravel(), "f32", "dh0 (zero h0: the gradient still exists)")


def test_d_state_above_capacity_is_refused_before_launch(ops):
    dims = {"batch": 1, "d_inner": 8, "d_state": 80, "L": 64}
    spec = ops.spec("ssm_parallel_scan_fwd_bf16", dims)
    host = _inputs(spec, np.random.default_rng(5))
    with pytest.raises(ForgeError, match="above the built state capacity 64"):
        ops.run_spec(spec, host)
    # and the kernel itself, launched anyway, writes nothing (no out-of-bounds shared-memory carry)
    out = empty_device(spec.buffers[0].count, "bf16")
    args = [out] + [to_device(host[b.name], b.dtype) if b.name in host else empty_device(b.count, b.dtype)
                    for b in spec.buffers[1:]]
    args += [np.int32(1), np.int32(8), np.int32(80), np.int64(64), np.int32(1)]
    ops.launch(spec.symbol, spec.grid, spec.block, args)
    assert not np.any(np.isfinite(from_device(out, "bf16")))
    # positive control: within capacity the same launch writes everything
    ok = ops.spec("ssm_parallel_scan_fwd_bf16", {**dims, "d_state": 64})
    got = ops.run_spec(ok, _inputs(ok, np.random.default_rng(5)))
    assert np.all(np.isfinite(got["out"]))


@pytest.mark.parametrize("cap", [16, 256])
def test_other_capacities_admitted_and_correct(cap):
    o = ScanOps(cap)
    bad = {k: x.reason for k, x in o.verdicts().items() if x.status != "admitted"}
    assert not bad
    rng = np.random.default_rng(cap)
    for name, dims in [("ssm_step_forward_fused_bf16", {"batch": 3, "d_inner": 64, "d_state": cap, "dt_rank": 8,
                                                         "z_pad": 64}),
                       ("ssm_burnin_forward_nosave_bf16", {"batch": 2, "d_inner": 8, "d_state": cap, "L": 300}),
                       ("ssm_parallel_scan_fwd_bf16", {"batch": 2, "d_inner": 8, "d_state": cap, "L": 300}),
                       ("ssm_parallel_scan_bwd_bf16", {"batch": 1, "d_inner": 8, "d_state": cap, "L": 300})]:
        spec = o.spec(name, dims)
        host = _inputs(spec, rng)
        got = o.run_spec(spec, host)
        want = reference_outputs(o.families[spec.family], spec, host)
        for b in spec.outputs:
            _close(got[b.name], want[b.name], b.dtype, f"cap {cap} {name} {b.name}")
