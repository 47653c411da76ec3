"""CPU cost per launch of the checked keyword launch against the typed positional one (and, on a GPU, a raw
cuLaunchKernel of the same kernel).

    python benchmarks/bench_launch_overhead.py [--batches 41] [--calls 2000] [--bundle PATH] [--no-write] [--smoke]

--smoke: 3 batches of 50 calls (the GPU part too, with --bundle); seconds, nothing recorded.

CPU part (always): bind + pack per call on fake tensors (tests/runtime_fakes.py) for contracts shaped like
softplus (2 tensors), the fused scan step (9 tensors) and the wgmma GEMM (2 blobs): keyword =
``contract(symbol).bind(kwargs)`` + ``Contract.packer.fill``/``release`` (pooled, as Kernel.__call__);
positional = what ``launch()`` does per call before cuLaunchKernel: ``args.positional_typer`` (typed_params'
checks, compiled per symbol) + the packer's pooled ``fill``/``release``; typed_params + ``pack`` (the generic,
uncompiled path) is printed beside it. Also printed: bind alone, the packer alone, and bind + driver.PackedParams (the general
packer: one ctypes buffer and one struct.pack per value; the loader uses ParamPacker). Figures are CPU microseconds per call (thread CPU time, so a loaded machine's waiting is not
counted): the median over --batches batches of --calls calls each. Goals: keyword <= 15 us, positional <= 5 us.

GPU part (with torch, a GPU and --bundle [--key], a signed bundle holding softplus_forward_f32): the real loader
path on torch tensors: keyword ``kernels.function(name)(y=y, x=x)`` (bind + torch's current stream + pack +
cuLaunchKernel), positional ``launch(fn, grid, block, (y, x, n))`` (typed_params + pack + launch) and raw
cuLaunchKernel of the same function with parameters packed once, CPU microseconds per enqueue, synchronised per
batch. And kernels.gemm at M = 1 (bf16 8192 x 8192) against the keyword call of the rung it routes to, maps
prebuilt (gemm_records): what routing adds per call; on the CPU the same with fakes (cpu_gemm_records).
Records go to benchmarks/results/summary.json (benchmarks/summary.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import summary  # noqa: E402 - benchmarks/summary.py
from common import smoke  # noqa: E402 - benchmarks/common.py
from runtime_fakes import FakeTorchTensor as T  # noqa: E402
from runtime_fakes import gemm_wgmma, softplus, ssm_step  # noqa: E402

from mamba_forge.gpu.driver import PackedParams  # noqa: E402 - pure ctypes; no GPU needed to pack
from mamba_forge.runtime.args import positional_typer, typed_params  # noqa: E402
from mamba_forge.runtime.contract import contract  # noqa: E402

KEYWORD_GOAL_US, POSITIONAL_GOAL_US = 15.0, 5.0
# kernels.gemm: the keyword launch's budget plus 10 us for what it adds (2-D shape checks, the cached route, the
# cached tensor maps); a decode step's M = 1 projection takes ~15-40 us on the GPU, so more would show in eager mode
GEMM_GOAL_US = KEYWORD_GOAL_US + 10.0


def per_call_us(fn, batches: int, calls: int, clock=time.thread_time) -> float:
    for _ in range(calls):  # warm: caches, contract compile, type dispatch
        fn()
    times = []
    for _ in range(batches):
        t0 = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - t0) / calls * 1e6)
    return statistics.median(times)


def cpu_cases():
    n = 1 << 20
    yield "softplus_forward", softplus("f32"), f"n={n}", {"y": T(n), "x": T(n)}
    b, di, ds, r = 8, 2048, 16, 64
    kw = {"out": T(b * di, "bf16"), "state": T(b * di * ds), "u": T(b * di, "bf16"), "dt": T(b * di, "bf16"),
          "dt_bias": T(di), "A_log": T(di * ds), "x_dbl": T(b * (r + 2 * ds), "bf16"), "Dp": T(di),
          "z": T(b * di, "bf16"), "batch": b, "d_state": ds, "dt_rank": r}
    yield "ssm_step_forward_fused", ssm_step("bf16"), f"batch={b},d_inner={di},d_state={ds}", kw
    M, N, K = 4096, 4096, 4096
    kw = {"tmA": bytes(128), "tmB": bytes(128), "C": T(M * N, "bf16"), "A": T(M * K, "bf16"),
          "B": T(K * N, "bf16"), "M": M, "N": N, "K": K}
    yield "gemm_bi_nn_sm90a_wgmma_wg1", gemm_wgmma("bf16"), f"M={M},N={N},K={K}", kw


def cpu_records(batches: int, calls: int) -> list[dict]:
    out = []
    for family, sym, shape, kw in cpu_cases():
        names = [p.name for p in sym.params]
        c = contract(sym)
        full = c.bind(kw)  # the positional path gets every argument, the derived ones filled in
        args = [kw[p.name] if p.name in kw else v for p, (_, v) in zip(sym.params, full.values, strict=True)]
        assert len(args) == len(names)

        def keyword(sym=sym, kw=kw):  # what Kernel.__call__ does before the stream and cuLaunchKernel
            c = contract(sym)
            p = c.packer.fill([v for _, v in c.bind(kw).values])
            c.packer.release(p)

        typer = positional_typer(sym.params)

        def positional(typer=typer, args=args, name=sym.name, packer=c.packer):
            # what launch() does per call before cuLaunchKernel: type and check every argument, fill a buffer
            p = packer.fill(typer(args, name, 0))
            packer.release(p)

        def positional_unpooled(params=sym.params, args=args, name=sym.name, packer=c.packer):
            return packer.pack(typed_params(params, args, name, 0)[0])  # the generic path: typed_params + pack

        def keyword_driver_pack(sym=sym, kw=kw):
            b = contract(sym).bind(kw)
            return PackedParams(b.values, b.aligns)

        def bind_only(sym=sym, kw=kw):
            return contract(sym).bind(kw)

        kw_us, pos_us = per_call_us(keyword, batches, calls), per_call_us(positional, batches, calls)
        generic_us = per_call_us(positional_unpooled, batches, calls)
        bind_us, drv_us = per_call_us(bind_only, batches, calls), per_call_us(keyword_driver_pack, batches, calls)
        pack_us = per_call_us(lambda v=full.values, p=c.packer: p.pack(v), batches, calls)
        print(f"{sym.name:36s} keyword {kw_us:6.2f}  positional {pos_us:6.2f}  | bind {bind_us:6.2f}  "
              f"ParamPacker {pack_us:5.2f}  typed_params+pack {generic_us:6.2f}  bind+driver.PackedParams {drv_us:6.2f}  "
              f"(us/call, CPU) [{shape}]")
        out.append(summary.record(family=family, symbol=f"{sym.name}:keyword-bind+pack(cpu,fake)", shape=shape,
                                  dtype=sym.dtype, ours=round(kw_us, 3), baseline=round(pos_us, 3),
                                  baseline_name="positional typed_params+pack", unit="us/call (CPU)",
                                  goal=f"<= {KEYWORD_GOAL_US} us", met=kw_us <= KEYWORD_GOAL_US))
        out.append(summary.record(family=family, symbol=f"{sym.name}:positional-typed+pack(cpu,fake)", shape=shape,
                                  dtype=sym.dtype, ours=round(pos_us, 3), baseline=round(pack_us, 3),
                                  baseline_name="ParamPacker alone", unit="us/call (CPU)",
                                  goal=f"<= {POSITIONAL_GOAL_US} us", met=pos_us <= POSITIONAL_GOAL_US))
    return out


def cpu_gemm_records(batches: int, calls: int) -> list[dict]:
    """What kernels.gemm adds on the CPU to the keyword launch of its rung (fake tensors and a stand-in for the
    loaded Kernels whose route and tensor maps are cached, as after the first call): the 2-D shape checks, the
    overlap check, the cached route and maps, then the same bind + pack."""
    from types import SimpleNamespace

    from mamba_forge.runtime import gemm as rgemm
    from mamba_forge.runtime.routes import Route

    sym = gemm_wgmma("bf16")
    M, N, K = 1, 8192, 8192
    A, B, C = (T.matrix(r, c, dtype="bf16", ptr=(0x70 + i) << 40) for i, (r, c) in enumerate(((M, K), (K, N), (M, N))))

    def launch(kwargs, stream, null=""):  # Kernel._launch less the stream and cuLaunchKernel
        c = contract(sym)
        p = c.packer.fill([v for _, v in c.bind(kwargs, 0, None, null).values])
        c.packer.release(p)

    kern = SimpleNamespace(name=sym.name, family=sym.family, symbol=sym, _launch=launch)
    route = Route(sym.name, "nn", "bf16", "bf16", "bf16", False, False, "k16")
    kernels = SimpleNamespace(_gemm_routes={(M, N, K, "bf16", "bf16", "nn", False, None): (route, kern, (False, ("tmA", "tmB")))})
    maps = {"tmA": bytes(128), "tmB": bytes(128)}
    # the cache key as rgemm._tensor_maps builds it (C's address only for the maps that describe C; A's row stride,
    # 0 for a dense A): a miss would encode real maps through the driver, which has no context here
    # (CUDA_ERROR_NOT_INITIALIZED on the H200)
    with_c = sym.tensor_maps.endswith("_tmastore")
    rgemm._MAPS[(rgemm.maps_ident(sym), A.data_ptr(), B.data_ptr(), C.data_ptr() if with_c else 0, M, N, K, 0)] = maps
    kw = {"C": C, "A": A, "B": B, "M": M, "N": N, "K": K, **maps}
    gemm_us = per_call_us(lambda: rgemm.gemm(kernels, A, B, C), batches, calls)
    kw_us = per_call_us(lambda: launch(kw, None), batches, calls)
    print(f"kernels.gemm (cached route and maps) {gemm_us:6.2f}  its keyword bind+pack {kw_us:6.2f}  "
          f"(us/call, CPU) [M={M},N={N},K={K} bf16]")
    return [summary.record(family="gemm_route", symbol="nn bf16 route:kernels.gemm(cpu,fake)",
                           shape=f"M{M}xN{N}xK{K}", dtype="bf16", ours=round(gemm_us, 3), baseline=round(kw_us, 3),
                           baseline_name="the rung's keyword bind+pack", unit="us/call (CPU)",
                           goal=f"<= {GEMM_GOAL_US} us", met=gemm_us <= GEMM_GOAL_US)]


def gpu_records(bundle: Path, key: Path | None, batches: int, calls: int) -> list[dict]:
    """The real loader path on the GPU: keyword Kernel.__call__, positional launch(), raw cuLaunchKernel."""
    import torch  # only here: the CPU part runs without it

    from mamba_forge.gpu import core
    from mamba_forge.gpu import driver as cu
    from mamba_forge.runtime import launch, load

    torch.zeros(1, device="cuda")  # torch's primary context first; the driver calls below (maps) run in it
    cu.init()
    cu.Device(torch.cuda.current_device()).make_current()
    name = "softplus_forward_f32"
    kernels = load(bundle, trusted_keys=[key] if key else None)
    fn = kernels.function(name)
    n = 1 << 20
    y, x = torch.empty(n, device="cuda"), torch.randn(n, device="cuda")
    grid = fn.contract.bind({"y": y, "x": x}).grid

    def keyword():
        fn(y=y, x=x)  # bind + torch's current stream + pack + cuLaunchKernel

    def positional():
        launch(fn, grid, fn.block, (y, x, n))

    packed = fn.packer().pack([("ptr", y.data_ptr()), ("ptr", x.data_ptr()), ("i64", n)])  # packed once
    drv, h, stream = core.bindings(), fn.handle.handle, torch.cuda.current_stream().cuda_stream

    def raw():
        drv.cuLaunchKernel(h, grid[0], 1, 1, *fn.block, 0, stream, packed.address, 0)

    def timed(f):
        def batch():
            for _ in range(calls):
                f()
            torch.cuda.synchronize()
        return per_call_us(batch, batches, 1, clock=time.process_time) / calls

    kw_us, pos_us, raw_us = timed(keyword), timed(positional), timed(raw)
    torch.testing.assert_close(y, torch.nn.functional.softplus(x), rtol=1e-5, atol=1e-6)  # every path ran it
    gpu = torch.cuda.get_device_name()
    print(f"{name} on {gpu}: keyword {kw_us:.2f} us  positional {pos_us:.2f} us  raw cuLaunchKernel {raw_us:.2f} us")
    shape = f"n={n}"
    common = {"family": "softplus_forward", "shape": shape, "dtype": "f32", "baseline": round(raw_us, 3),
              "baseline_name": "raw cuLaunchKernel", "unit": "us/call (CPU)", "gpu": gpu}
    return gemm_records(kernels, timed, gpu) + [
        summary.record(symbol=f"{name}:keyword-launch", ours=round(kw_us, 3), goal=f"<= {KEYWORD_GOAL_US} us",
                       met=kw_us <= KEYWORD_GOAL_US, **common),
        summary.record(symbol=f"{name}:positional-launch", ours=round(pos_us, 3), goal=f"<= {POSITIONAL_GOAL_US} us",
                       met=pos_us <= POSITIONAL_GOAL_US, **common),
    ]


def gemm_records(kernels, timed, gpu: str) -> list[dict]:
    """kernels.gemm at M = 1 (bf16, 8192 x 8192: the decode projection) against the keyword call of the rung it
    routes to with its tensor maps built once: what routing, the shape checks and the map cache add per call."""
    import torch

    from mamba_forge.runtime import gemm as rgemm

    M, N, K = 1, 8192, 8192
    A = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    B = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    kern = kernels.function(kernels.gemm_route(M, N, K, "bf16").symbol, follow_fallback=False)
    kw = {"C": C, "A": A, "B": B, "M": M, "N": N, "K": K}
    blobs = [p.name for p in kern.symbol.params if p.kind == "blob"]
    if blobs:
        kw.update(rgemm._tensor_maps(kern, A, B, C, M, N, K, blobs))
    gemm_us, rung_us = timed(lambda: kernels.gemm(A, B, C)), timed(lambda: kern(**kw))
    torch.testing.assert_close(C.float(), (A.double() @ B.double()).float(), rtol=2e-2, atol=0.5)
    print(f"kernels.gemm M={M} N={N} K={K} bf16 ({kern.name}): {gemm_us:.2f} us; its keyword call {rung_us:.2f} us")
    return [summary.record(family="gemm_route", symbol="nn bf16 route:kernels.gemm", shape=f"M{M}xN{N}xK{K}",
                           dtype="bf16", ours=round(gemm_us, 3), baseline=round(rung_us, 3),
                           baseline_name=f"the keyword call of {kern.name}, maps prebuilt", unit="us/call (CPU)",
                           goal=f"<= {GEMM_GOAL_US} us", met=gemm_us <= GEMM_GOAL_US, gpu=gpu)]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=41)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--bundle", type=Path, help="a signed bundle with softplus_forward_f32 (GPU part)")
    ap.add_argument("--key", type=Path, help="the bundle's public key (file or folder), besides the trusted ones")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="3 batches of 50 calls; seconds, nothing recorded")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return smoke(parser().parse_args(argv), batches=3, calls=50, no_write=True)


def main(argv=None) -> int:
    a = parse_args(argv)
    records = cpu_records(a.batches, a.calls) + cpu_gemm_records(a.batches, a.calls)
    if a.bundle is not None:
        records += gpu_records(a.bundle, a.key, a.batches, max(1, a.calls // 10))
    if not a.no_write:
        summary.append(records)
        print(f"{len(records)} records -> {summary.SUMMARY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
