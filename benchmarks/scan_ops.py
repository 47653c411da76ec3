"""The selective-scan benchmark's kernel side (benchmarks/bench_scan.py's, and bench_decode_step.py's through it): our
scan module launched on torch's current stream (Ours, ours_forward, ours_backward), the inputs, the float64 reference
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
for _path in (ROOT / "tests" / "gpu", ROOT / "tests", ROOT / "benchmarks" / "peers"):  # test_scan, gpu_support, peers
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from timing import capture_graph, median_ms  # noqa: E402  (benchmarks/timing.py)

from mamba_forge.references import scan as ref  # noqa: E402

if TYPE_CHECKING:
    import torch

REPS = 20  # timed launches per figure (median)


def p(t: torch.Tensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.data_ptr())




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
    """The scan module (tests/gpu/test_scan.py's ScanOps), launched through mamba_forge.gpu on torch's current stream."""

    def __init__(self, cap=64):
        from test_scan import ScanOps

        self.ops = ScanOps(cap)
        self.cap = cap

    def bind(self, name, grid, block, args):
        """A zero-argument launcher with the parameters packed once (the timed loop pays only the launch)."""
        import torch
        from gpu_support import bind

        return bind(self.ops.fn(name), grid, block, args, stream=torch.cuda.current_stream)


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


def ours_forward(o: Ours, x, save: bool):
    import torch

    b, d, L = x["u"].shape
    n = x["A_log"].shape[1]
    ref.check_launch("ssm_parallel_scan_fwd", {"batch": b, "d_inner": d, "d_state": n, "L": L}, o.cap)
    out = torch.empty_like(x["u"])
    last = torch.empty(b, d, n, device="cuda")
    saved = torch.empty(b, d, -(-L // 256), n, device="cuda") if save else None
    tail = [p(x["u"]), p(x["delta"]), p(x["A_log"]), p(x["B"]), p(x["C"]), p(x["D"]), p(x["z"]), p(x["delta_bias"]),
            np.int32(b), np.int32(d), np.int32(n), np.int64(L), np.int32(1)]
    grid = (-(-b * d // 4),)
    if save:
        fn = o.bind("ssm_parallel_scan_fwd_bf16", grid, (128,), [p(out), p(last), p(saved)] + tail)
    else:
        fn = o.bind("ssm_parallel_scan_fwd_nosave_bf16", grid, (128,), [p(out), p(last)] + tail)
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
    args = [p(r[k]) for k in ("du", "ddelta", "dz", "dB_part", "dC_part", "dA_part", "dD_part", "dbias_part")]
    args += [p(x["dout"]), p(saved), p(x["u"]), p(x["delta"]), p(x["A_log"]), p(x["B"]), p(x["C"]), p(x["D"]), p(x["z"]),
             p(x["delta_bias"]), np.int32(b), np.int32(d), np.int32(n), np.int64(L), np.int32(1)]
    nl = n * L
    rgrid = (min(-(-b * nl // 256), 4096),)

    launches = [
        o.bind(fam + "_bf16", (b * d // w,), (32 * w,), args),
        o.bind("ssm_reduce_d_BC_groups_bf16", rgrid, (256,), [p(r["dB"]), p(r["dB_part"]), np.int32(b), np.int32(d // w), np.int64(nl)]),
        o.bind("ssm_reduce_d_BC_groups_bf16", rgrid, (256,), [p(r["dC"]), p(r["dC_part"]), np.int32(b), np.int32(d // w), np.int64(nl)]),
        o.bind("ssm_reduce_d_D", (-(-d // 256),), (256,), [p(r["dD"]), p(r["dD_part"]), np.int32(b), np.int32(d)]),
        o.bind("ssm_reduce_d_D", (-(-d // 256),), (256,), [p(r["dbias"]), p(r["dbias_part"]), np.int32(b), np.int32(d)]),
        o.bind("ssm_reduce_d_a_log", (-(-d * n // 256),), (256,),
               [p(r["dA_log"]), p(r["dA_part"]), p(x["A_log"]), np.int32(b), np.int64(d * n)]),
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
           "ours_backward", "ours_forward", "p", "time_graph_ms"]
