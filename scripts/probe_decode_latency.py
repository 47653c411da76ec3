"""Where the decode step's microseconds go at batch 1..16 (issue 23's last goal: at most 1.0x Triton's
selective_state_update). A dev probe, not a benchmark (nothing recorded): it compiles the production step
(mf::ssm_step_v, kernels/include/mf/decode.cuh) beside variants written here, launches each through the driver
(cuLaunchKernelEx, optionally with programmatic dependent launch) on torch's stream, captures `--inner` steps per
CUDA graph and times the graphs in interleaved rounds against an empty kernel and Triton's kernel.

    python scripts/probe_decode_latency.py [--batches 1,4,16] [--inner 20] [--rounds 9]

Variants: `prod` (the production step, mf::ssm_step_v at PDL_BLOCKS 2048: it waits on grids up to that size),
`nopdl` (no PDL instructions), `always` (waiting at every grid size) and `empty` (the floor of a graph node); `+pdl`:
launched with programmatic dependent launch (the step's pdl_wait before its first load, the next grid allowed to
launch at once, so a launch's latency overlaps the step before). Check: every variant's out and state bits equal
prod's.
Measured 2026-12-04 (the session's first call): the variants `trim` (the gate and the output address before the
sum: now production) and PDL at batch 1 / 16 / 64 / 256: plain 1.97 / 2.68 / 4.99 / 15.8 us, with PDL 1.35 / 2.10 /
6.09 / 21.4, Triton 1.75 / 2.67 / 6.32 / 21.5; an SFU softplus saved a further 2% (other bits; not taken).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

SOURCE = r"""
#include "mf/decode.cuh"
#define ARGS __nv_bfloat16* out, float* state, const __nv_bfloat16* u, const __nv_bfloat16* dt, const float* dt_bias, \
  const float* A_log, const __nv_bfloat16* x_dbl, const float* Dp, const __nv_bfloat16* z, int batch, int d_inner, \
  int d_state, int dt_rank, int x_dbl_stride, int z_stride
#define STEP(PDL) mf::ssm_step_v<__nv_bfloat16, 2, 1, true, PDL>(out, state, u, dt, dt_bias, A_log, x_dbl, x_dbl, Dp, \
  z, batch, d_inner, d_state, dt_rank, x_dbl_stride, z_stride)
// the production instance (kernels/fixed/scan.toml ssm_step_forward_fused: LANES 2, BLOCK 64, ROWS 1, MINB 16,
// PDL_BLOCKS 2048); nopdl: without PDL instructions; always: waiting at every grid size
extern "C" __global__ void __launch_bounds__(64, 16) prod(ARGS) { STEP(2048); }
extern "C" __global__ void __launch_bounds__(64, 16) nopdl(ARGS) { STEP(0); }
extern "C" __global__ void __launch_bounds__(64, 16) always(ARGS) { STEP(1 << 30); }
extern "C" __global__ void empty(ARGS) {
  mf::pdl_wait();
  mf::pdl_launch_dependents();
}
"""
NAMES = ["prod", "prod+pdl", "nopdl", "always", "always+pdl", "empty", "empty+pdl"]  # +pdl: launched with PDL
D, N, R = 2048, 16, 128


def compile_cubin() -> bytes:
    from mamba_forge.build.nvrtc import CUDA_INCLUDE_TOKEN, compile_program

    opts = ["-std=c++17", "--fmad=true", "-DNDEBUG", "--frandom-seed=mamba-forge", "--extra-device-vectorization",
            "-arch=sm_90a", "-DMF_STATE_CAP=64", f"-I{ROOT / 'kernels' / 'include'}", CUDA_INCLUDE_TOKEN]
    res = compile_program(SOURCE, "probe_decode.cu", opts, {}, want_ptx=False)
    if not res.ok:
        raise SystemExit(res.log)
    return res.cubin


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,2,4,8,16,64,256")
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args(argv)
    import torch
    from cuda.bindings import driver as drv
    from scan_ops import _peer_ssu, decode_inputs
    from timing import capture_graph, median_ms

    torch.zeros(1, device="cuda")
    drv.cuInit(0)
    err, mod = drv.cuModuleLoadData(compile_cubin())
    assert err == drv.CUresult.CUDA_SUCCESS, err
    fns = {}
    for n in NAMES:
        err, f = drv.cuModuleGetFunction(mod, n.partition("+")[0].encode())
        assert err == drv.CUresult.CUDA_SUCCESS, (n, err)
        fns[n] = f
    ssu, why = _peer_ssu()
    print(f"Triton: {'ok' if ssu else why}")

    def launcher(name, bufs, bsz):
        lanes, block = 2, 64
        grid = ((D * lanes + block - 1) // block, bsz, 1)
        out, state, u, dt, z, dt_bias, A_log, Dp, x_dbl = bufs
        vals = (out.data_ptr(), state.data_ptr(), u.data_ptr(), dt.data_ptr(), dt_bias.data_ptr(), A_log.data_ptr(),
                x_dbl.data_ptr(), Dp.data_ptr(), z.data_ptr(), bsz, D, N, R, R + 2 * N, D)
        types = (ctypes.c_void_p,) * 9 + (ctypes.c_int,) * 6
        pdl = name.endswith("+pdl")

        def go():
            cfg = drv.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block, 1, 1
            cfg.sharedMemBytes = 0
            cfg.hStream = drv.CUstream(torch.cuda.current_stream().cuda_stream)
            if pdl:
                at = drv.CUlaunchAttribute()
                at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                at.value.programmaticStreamSerializationAllowed = 1
                cfg.attrs = [at]
                cfg.numAttrs = 1
            else:
                cfg.numAttrs = 0
            (e,) = drv.cuLaunchKernelEx(cfg, fns[name], (vals, types), 0)
            assert e == drv.CUresult.CUDA_SUCCESS, (name, e)
        return go

    for bsz in [int(x) for x in a.batches.split(",")]:
        s0, u, dt, z, dt_bias, A_log, Dp, x_dbl = decode_inputs(bsz, D, N, R)
        graphs, outs = {}, {}
        for n in NAMES:
            state = s0.clone()
            out = torch.full((bsz, D), float("nan"), dtype=torch.bfloat16, device="cuda")
            go = launcher(n, (out, state, u, dt, z, dt_bias, A_log, Dp, x_dbl), bsz)
            go()
            torch.cuda.synchronize()
            outs[n] = (out.clone(), state.clone())
            graphs[n] = (capture_graph(go, a.inner), state, out)
        if ssu is not None:
            st = s0.clone()
            A = -torch.exp(A_log)
            Bv, Cv = x_dbl[:, R:R + N], x_dbl[:, R + N:]
            peer = functools.partial(ssu, st, u, dt, A, Bv, Cv, Dp, z, dt_bias, True)  # this batch's tensors
            graphs["triton"] = (capture_graph(peer, a.inner), st)
        same = {n: bool(torch.equal(outs[n][0].view(torch.int16), outs["prod"][0].view(torch.int16))
                        and torch.equal(outs[n][1].view(torch.int32), outs["prod"][1].view(torch.int32)))
                for n in NAMES if not n.startswith("empty")}
        keys = list(graphs)
        per = {k: [] for k in keys}
        for r in range(a.rounds):
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                per[k].append(median_ms(graphs[k][0].replay, 5, warmup=2) / a.inner * 1e3)
        med = {k: statistics.median(v) for k, v in per.items()}
        tri = med.get("triton")
        print(f"\nbatch {bsz}: us per step in graphs of {a.inner} (ratio Triton/ours)")
        for k in keys:
            ratio = f"{tri / med[k]:.3f}x" if tri else "-"
            bits = "" if k not in same else (" bits==prod" if same[k] else " bits DIFFER")
            print(f"  {k:14s} {med[k]:7.3f} us  {ratio}{bits}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
