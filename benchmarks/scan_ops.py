"""The selective-scan benchmark's kernel side (benchmarks/bench_scan.py's, and bench_decode_step.py's through it): our
scan module built here and launched through the runtime on torch's current stream (Ours, ours_forward,
ours_backward, step_kwargs: each launch a symbol's keyword call, grid and arguments from its contract), the
inputs, the float64 reference
check on a subset of channels, bitwise repeatability, the bandwidth and SFU floors, and the mamba-ssm peers
(benchmarks/peers/mamba_peer.py). bench_scan.py re-exports every name here. torch is imported inside the functions,
so this module imports on a machine without it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "tests" / "gpu", ROOT / "tests", ROOT / "benchmarks" / "peers"):  # test_scan, its imports, peers
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from built import built_kernels  # noqa: E402  (benchmarks/built.py)
from timing import capture_graph, median_ms  # noqa: E402  (benchmarks/timing.py)

from mamba_forge.references import scan as ref  # noqa: E402

if TYPE_CHECKING:
    import torch

REPS = 20  # timed launches per figure (median)


def time_graph_ms(fn, inner=20, reps=20) -> float:
    """Median time per call of `fn` replayed from a CUDA graph holding `inner` calls."""
    return median_ms(capture_graph(fn, inner).replay, reps, warmup=3) / inner


def copy_bandwidth() -> float:
    import torch

    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), REPS)
    return 2 * x.numel() / (ms * 1e-3)


class Ours:
    """The scan module built alone (tests/gpu/test_scan.py's one-module catalog over kernels/fixed/scan.*, with
    `kernels` only those symbols) at state capacity `cap`, served as runtime Kernels (benchmarks/built.py)."""

    def __init__(self, cap=64, kernels=None, on_rejected=None):
        from test_scan import scan_catalog_path

        self.kernels = built_kernels(("Fixed",), kernels=kernels, catalog=scan_catalog_path(), state_capacity=cap,
                                     prefix="mf-bench-scan-", on_rejected=on_rejected)
        self.cap = cap

    def bind(self, name, **kwargs):
        """A zero-argument launcher: `name`'s keyword launch with these arguments (its contract checks them, derives
        the grid and packs them at every call; the stream is torch's current one, a graph capture's included)."""
        kern = self.kernels.function(name)
        return lambda: kern(**kwargs)


def step_kwargs(out, state, u, dt, z, dt_bias, A_log, D, x_dbl) -> dict:
    """The decode step's keyword arguments (ssm_step_forward_fused*) for decode_inputs' tensors."""
    (bsz, d), (n, r) = u.shape, (A_log.shape[1], x_dbl.shape[1] - 2 * A_log.shape[1])
    return dict(out=out, state=state, u=u, dt=dt, dt_bias=dt_bias, A_log=A_log, x_dbl=x_dbl, Dp=D, z=z, batch=bsz,
                d_inner=d, d_state=n, dt_rank=r, x_dbl_stride=r + 2 * n, z_pad=0)  # a dense z


def uniform(seed: int):
    """U(*shape, lo=-1.0, hi=1.0, dtype=bf16): uniform values on the GPU from one generator seeded with `seed`."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)

    def U(*shape, lo=-1.0, hi=1.0, dtype=torch.bfloat16):
        return (torch.rand(*shape, generator=g, device="cuda") * (hi - lo) + lo).to(dtype)

    return U


def make_inputs(b, d, L, n, seed=0):
    import torch

    U = uniform(seed)
    return dict(u=U(b, d, L), delta=U(b, d, L, lo=-4.0, hi=0.0), A_log=U(d, n, lo=-1.0, hi=1.5, dtype=torch.float32),
                B=U(b, n, L), C=U(b, n, L), D=U(d, dtype=torch.float32), z=U(b, d, L, lo=-3.0, hi=3.0),
                delta_bias=U(d, dtype=torch.float32), dout=U(b, d, L))


def decode_inputs(bsz, d, n, r):
    """One decode step's inputs at batch `bsz` (seeded with it): (state, u, dt, z, dt_bias, A_log, D, x_dbl)."""
    import torch

    U, f32 = uniform(bsz), torch.float32
    state = U(bsz, d, n, dtype=f32)
    u, dt, z = U(bsz, d), U(bsz, d, lo=-4.0, hi=0.0), U(bsz, d, lo=-3.0, hi=3.0)
    dt_bias, A_log, D = U(d, dtype=f32), U(d, n, lo=-1.0, hi=1.5, dtype=f32), U(d, dtype=f32)
    return state, u, dt, z, dt_bias, A_log, D, U(bsz, r + 2 * n)


def _scan_inputs(x) -> dict:
    """The scan kernels' shared inputs and dims (forward and backward name them alike) from make_inputs' tensors."""
    b, d, L = x["u"].shape
    return dict(u=x["u"], delta=x["delta"], A_log=x["A_log"], Bm=x["B"], Cm=x["C"], Dp=x["D"], z=x["z"],
                delta_bias=x["delta_bias"], batch=b, d_inner=d, d_state=x["A_log"].shape[1], L=L, delta_softplus=1)


def ours_forward(o: Ours, x, save: bool):
    import torch

    b, d, L = x["u"].shape
    n = x["A_log"].shape[1]
    ref.check_launch("ssm_parallel_scan_fwd", {"batch": b, "d_inner": d, "d_state": n, "L": L}, o.cap)
    out = torch.empty_like(x["u"])
    last = torch.empty(b, d, n, device="cuda")
    saved = torch.empty(b, d, -(-L // 256), n, device="cuda") if save else None
    if save:
        fn = o.bind("ssm_parallel_scan_fwd_bf16", out=out, last_state=last, saved=saved, **_scan_inputs(x))
    else:
        fn = o.bind("ssm_parallel_scan_fwd_nosave_bf16", out=out, last_state=last, **_scan_inputs(x))
    return fn, dict(out=out, last=last, saved=saved)


def ours_backward(o: Ours, x, saved, fold: bool):
    import torch

    b, d, L = x["u"].shape
    n = x["A_log"].shape[1]
    w = 8 if fold else 4
    fam = "ssm_parallel_scan_bwd_fold" if fold else "ssm_parallel_scan_bwd"
    ref.check_launch(fam, {"batch": b, "d_inner": d, "d_state": n, "L": L}, o.cap)
    r = dict(du=torch.empty_like(x["u"]), ddelta=torch.empty_like(x["u"]), dz=torch.empty_like(x["u"]),
             dB_part=torch.empty(b, d // w, n, L, device="cuda"), dC_part=torch.empty(b, d // w, n, L, device="cuda"),
             dA_part=torch.empty(b, d, n, device="cuda"), dD_part=torch.empty(b, d, device="cuda"),
             dbias_part=torch.empty(b, d, device="cuda"), dB=torch.empty_like(x["B"]), dC=torch.empty_like(x["C"]),
             dD=torch.empty(d, device="cuda"), dbias=torch.empty(d, device="cuda"), dA_log=torch.empty(d, n, device="cuda"))
    parts = {k: r[k] for k in ("du", "ddelta", "dz", "dB_part", "dC_part", "dA_part", "dD_part", "dbias_part")}
    launches = [
        o.bind(fam + "_bf16", **parts, dout=x["dout"], saved=saved, **_scan_inputs(x)),
        *(o.bind("ssm_reduce_d_BC_groups_bf16", out=r[g], part=r[g + "_part"], batch=b, groups=d // w, d_state=n, L=L)
          for g in ("dB", "dC")),
        *(o.bind("ssm_reduce_d_D", out=r[g], part=r[g + "_part"], batch=b, d_inner=d) for g in ("dD", "dbias")),
        o.bind("ssm_reduce_d_a_log", out=r["dA_log"], part=r["dA_part"], A_log=x["A_log"], batch=b, dn=d * n),
    ]

    def fn():
        for launch in launches:
            launch()

    return fn, r


def f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def check_subset(x, fw, bw, nb=1, nd=16):
    """Ours vs the float64 reference on batch elements [0, nb) and channels [0, nd)."""
    sub = {k: f64(v[:nb, :nd]) for k, v in x.items() if k in ("u", "delta", "z", "dout")}
    sub.update(A_log=f64(x["A_log"][:nd]), B=f64(x["B"][:nb]), C=f64(x["C"][:nb]), D=f64(x["D"][:nd]),
               delta_bias=f64(x["delta_bias"][:nd]))
    dout = sub.pop("dout")
    out, _, last = ref.scan_forward(**sub)
    errs = {"out": _nerr(f64(fw["out"][:nb, :nd]), out), "last_state": _nerr(f64(fw["last"][:nb, :nd]), last)}
    if bw is not None:
        gr = ref.scan_backward(dout, **sub)
        for k, g in (("du", "du"), ("ddelta", "ddelta"), ("dz", "dz")):
            errs[k] = _nerr(f64(bw[k][:nb, :nd]), gr[g])
        w = x["u"].shape[1] // bw["dB_part"].shape[1]  # channels per dB/dC group
        errs["dB_part"] = _nerr(f64(bw["dB_part"][:nb, : nd // w]), ref.group_sum(gr["dB_bd"], w))
        errs["dC_part"] = _nerr(f64(bw["dC_part"][:nb, : nd // w]), ref.group_sum(gr["dC_bd"], w))
        errs["dA_part"] = _nerr(f64(bw["dA_part"][:nb, :nd]), gr["dA"])
        errs["dD_part"] = _nerr(f64(bw["dD_part"][:nb, :nd]), gr["dD"])
        errs["dbias_part"] = _nerr(f64(bw["dbias_part"][:nb, :nd]), gr["dbias"])
    return errs


def step_checks(fn, out, state, s0, u, dt, z, dt_bias, A_log, D, x_dbl) -> tuple[tuple[float, float], bool]:
    """One decode step `fn` (writing out and state in place) from state s0 against the float64 reference, then
    repeated from s0 four times: ((normwise error of out, of state), every repeat bitwise equal to the first)."""
    import torch

    state.copy_(s0)
    fn()
    torch.cuda.synchronize()
    (bsz, d), n = u.shape, A_log.shape[1]
    want = ref.ssm_step_forward_fused(
        {"state": f64(s0).ravel(), "u": f64(u).ravel(), "dt": f64(dt).ravel(), "dt_bias": f64(dt_bias),
         "A_log": f64(A_log).ravel(), "x_dbl": f64(x_dbl).ravel(), "Dp": f64(D), "z": f64(z).ravel()},
        {"batch": bsz, "d_inner": d, "d_state": n, "dt_rank": x_dbl.shape[1] - 2 * n})
    errs = (_nerr(f64(out).ravel(), want["out"]), _nerr(f64(state).ravel(), want["state"]))
    o1, st1 = out.clone(), state.clone()
    rep = True
    for _ in range(4):
        state.copy_(s0)
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        rep = rep and torch.equal(out.view(torch.int16), o1.view(torch.int16)) and \
            torch.equal(state.view(torch.int32), st1.view(torch.int32))
    return errs, rep


def _nerr(got, want) -> float:
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def bitwise_repeat(fn, outs: dict, runs=5) -> bool:
    import torch

    fn()
    torch.cuda.synchronize()
    first = {k: v.clone() for k, v in outs.items() if v is not None}
    for _ in range(runs - 1):
        for v in outs.values():
            if v is not None:
                v.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        for k, v in first.items():
            if not torch.equal(outs[k].view(torch.uint8) if outs[k].dtype != torch.float32 else outs[k].view(torch.int32),
                               v.view(torch.uint8) if v.dtype != torch.float32 else v.view(torch.int32)):
                return False
    return True


def floors_ms(b, d, L, n, bw_bytes, sms):
    io = (4 * b * d * L + 2 * b * n * L) * 2  # u, delta, z, out + B, C (bf16)
    exps = b * d * L * n
    sfu = sms * 16 * 1.98e9  # ex2 per second: 16 per SM per clock (sm_90), ~1.98 GHz boost
    return io / bw_bytes * 1e3, exps / sfu * 1e3


def _peer_scan():
    try:
        from mamba_peer import load_selective_scan_cuda
    except Exception as exc:  # noqa: BLE001
        return None, str(exc)
    return load_selective_scan_cuda()


def _peer_ssu():
    try:
        from mamba_peer import load_selective_state_update
    except Exception as exc:  # noqa: BLE001
        return None, str(exc)
    return load_selective_state_update()


__all__ = ["REPS", "Ours", "bitwise_repeat", "check_subset", "copy_bandwidth", "f64", "floors_ms", "make_inputs",
           "ours_backward", "ours_forward", "step_checks", "step_kwargs", "time_graph_ms"]
