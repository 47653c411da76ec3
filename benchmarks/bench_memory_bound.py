"""Achieved bandwidth of the memory-bound Fixed kernels against a device-to-device copy measured in the same run.

    python benchmarks/bench_memory_bound.py [--reps 25] [--only SUBSTRING] [--no-write] [--smoke]

--smoke: every kernel at a small shape (SMOKE_ROWS, SMOKE_FLAT; the catalog's at their qualification dims), 5
launches per figure; seconds, nothing recorded.

Each kernel is built here (benchmarks/built.py) and launched through the runtime (its keyword call: grid, block
and every argument from its contract) at a shape whose tensors are well above the H200's 50 MB L2. Bytes moved = inputs read + outputs written (in/out
buffers count twice). Baseline: torch's device-to-device copy of half those bytes (a copy reads and writes
each byte, so it moves the same total). Timing: CUDA events around each launch, warm-up first, median of
--reps. The ratio is the kernel's GB/s over the copy's GB/s. Kernels whose reads and writes differ in width
(a widening cast, an f32 += bf16) move a traffic mix a copy does not; for those the same operation in torch on
the same sizes is timed too (`peer`: torch time / ours, > 1 = we are faster), to tell a kernel's shortfall from
the memory system's. Rows are appended to benchmarks/results/memory_bound.md (date, GPU, kernel, shape, GB/s,
ratio, peer) and records to benchmarks/results/summary.json (benchmarks/summary.py, as bench_conv1d.py writes
them: ours = GB/s, baseline = copy GB/s, speedup = the ratio, goal >= 0.85 of the copy; the torch peer stays in
the table).
Conv1d forward and AdamW kernels, where the catalog has them, run at their own qualification shapes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import summary  # benchmarks/summary.py
from built import built_kernels, bytes_moved, contract_kwargs  # benchmarks/built.py
from common import append_table, bandwidth_parser, cuda_device, device_values, torch_dtype, utc_stamp
from timing import copy_seconds, time_events  # benchmarks/timing.py

ROOT = Path(__file__).resolve().parent.parent

M = 1 << 20
ROWS = {"rows": 16384, "dim": 4096}  # f32 [rows, dim] = 256 MB
FLAT = {"n": 64 * M}  # 128 MB in bf16, 256 MB in f32
SMOKE_ROWS, SMOKE_FLAT, SMOKE_REPS = {"rows": 64, "dim": 4096}, {"n": M}, 5
BENCH = [
    ("rmsnorm_forward", ROWS),
    ("rmsnorm_forward_f32in_bf16", ROWS),
    ("rmsnorm_forward_resadd_f32in_bf16", ROWS),
    ("gate_mul_silu_v_bf16", FLAT),
    ("gate_mul_silu_v_f32", FLAT),
    ("elementwise_mul_v_bf16", FLAT),
    ("elementwise_mul_v_f32", FLAT),
    ("cast_f32_to_bf16", FLAT),
    ("cast_bf16_to_f32", FLAT),
    ("residual_add_bf16", FLAT),
    ("residual_add_f32", FLAT),
    ("residual_add_f32_bf16", FLAT),
]
# torch doing the same operation on the same sizes: kernel -> (tensor method, dtype of self, dtype of the other)
TORCH_PEERS = {
    "cast_bf16_to_f32": ("copy_", "float32", "bfloat16"),
    "cast_f32_to_bf16": ("copy_", "bfloat16", "float32"),
    "residual_add_f32_bf16": ("add_", "float32", "bfloat16"),
}
# Every kernel here, the catalog's conv1d forwards and AdamW included: >= 0.85 of the copy's bandwidth
# (benchmarks/results/README.md; bench_conv1d.py and bench_conv_optim.py hold those two families to the same).
GOAL = 0.85


def device_fill(count: int, dtype: str, positive: bool):
    """A torch CUDA tensor of normal values of `dtype` drawn on the GPU (|x| + 0.5 where `positive`); counters and
    steps zero (adamw_step_capturable's arrivals must start at 0)."""
    import torch

    if dtype in ("i32", "i64", "u32"):
        return device_values(count, dtype)
    if dtype not in ("f32", "bf16", "f16"):
        raise ValueError(f"no device fill for {dtype}")
    x = torch.randn(count, device="cuda")
    return (x.abs() + 0.5 if positive else x).to(torch_dtype(dtype))


MIN_BYTES = 256 * M  # well above the 50 MB L2
SCALABLE = ("n", "batch", "rows")  # dims along which work is independent: grown to reach MIN_BYTES


def catalog_extras(fixed, min_bytes: int = MIN_BYTES) -> list[tuple[str, dict[str, int]]]:
    """Conv1d forward and AdamW symbols the catalog declares by now, at their qualification dims with the
    batch-like dim grown until the buffers total at least MIN_BYTES (qualification shapes fit in L2)."""
    from mamba_forge.qualify import spec as S

    out = []
    for sym in fixed.symbols:
        fam = fixed.family(sym.family)
        if fam.qualify.skip or fam.qualify.prepare or not fam.params:
            continue
        n = sym.name
        if not ((n.startswith("conv1d") and "forward" in n and "step" not in n) or n.startswith("adamw")):
            continue
        dims = dict(fam.qualify.dims)
        total = S.evaluate(sym, fam, dims).total_bytes
        grow = next((d for d in SCALABLE if d in dims), None)
        if grow is not None and total < min_bytes:
            dims[grow] *= -(-min_bytes // total)
        out.append((n, dims))
    return out


def bench_one(k, fixed, name: str, dims: dict[str, int], reps: int) -> dict:
    """One kernel at `dims` through the runtime (its keyword launch, every argument from its contract), timed
    against the copy of the bytes it moves (and its torch peer, where TORCH_PEERS has one)."""
    from mamba_forge.qualify.spec import Fill

    kern = k.function(name)
    positive = {p.name for p in fixed.family(kern.family).params if p.fill and Fill.parse(p.fill).kind == "positive"}
    kwargs = contract_kwargs(kern, dims, lambda p, count: device_fill(count, p.dtype, p.name in positive))
    moved = bytes_moved(kern, kwargs)  # in/out buffers count twice
    t = time_events(lambda: kern(**kwargs), reps)
    kwargs.clear()
    tc = copy_seconds(moved // 2, reps)
    peer = None
    if name in TORCH_PEERS:
        import torch

        method, self_dt, other_dt = TORCH_PEERS[name]
        a = torch.zeros(dims["n"], dtype=getattr(torch, self_dt), device="cuda")
        b = torch.zeros(dims["n"], dtype=getattr(torch, other_dt), device="cuda")
        tp = time_events(lambda: getattr(a, method)(b), reps)
        del a, b
        torch.cuda.empty_cache()
        peer = tp / t
    shape = " ".join(f"{k_}={v}" for k_, v in dims.items())
    return {"kernel": name, "shape": shape, "bytes": moved, "us": t * 1e6, "gbs": moved / t / 1e9,
            "copy_gbs": moved / tc / 1e9, "ratio": tc / t, "peer": peer, "family": kern.family,
            "dtype": kern.dtype or "-"}  # the casts and the like declare no single dtype


def parser() -> argparse.ArgumentParser:
    return bandwidth_parser(__doc__, "small shapes, 5 launches; seconds, nothing recorded",
                            "benchmarks/results/memory_bound.md or summary.json", reps=SMOKE_REPS)


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)

    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    gpu = cuda_device().name
    fixed = load_catalog(default_catalog_path()).module("Fixed")
    ours = {n for n, _ in BENCH}
    bench = [(n, SMOKE_ROWS if d is ROWS else SMOKE_FLAT) for n, d in BENCH] if a.smoke else BENCH
    todo = [(n, d) for n, d in bench + catalog_extras(fixed, 0 if a.smoke else MIN_BYTES) if a.only in n]
    k = built_kernels(("Fixed",), kernels=[n for n, _ in todo], prefix="mf-bench-memory-")
    rows = []
    print(f"{'kernel':40} {'shape':28} {'MB':>8} {'us':>9} {'GB/s':>8} {'copy GB/s':>10} {'ratio':>6} {'peer':>6}")
    for name, dims in todo:
        try:
            r = bench_one(k, fixed, name, dims, a.reps)
        except Exception as exc:  # noqa: BLE001 - another family's kernel must not stop this table
            if name in ours:
                raise
            print(f"{name:40} skipped: {type(exc).__name__}: {exc}")
            continue
        rows.append(r)
        peer = "" if r["peer"] is None else f"{r['peer']:.2f}"
        print(f"{r['kernel']:40} {r['shape']:28} {r['bytes'] / 1e6:8.1f} {r['us']:9.1f} {r['gbs']:8.0f} "
              f"{r['copy_gbs']:10.0f} {r['ratio']:6.2f} {peer:>6}")
    if not a.no_write:
        out = ROOT / "benchmarks" / "results" / "memory_bound.md"
        date = utc_stamp("%Y-%m-%d")

        def line(r: dict) -> str:
            peer = "" if r["peer"] is None else f" torch peer {r['peer']:.2f}x"
            return (f"| {date} | {gpu} | {r['kernel']} | {r['shape']} | {r['bytes'] / 1e6:.1f} | {r['us']:.1f} | "
                    f"{r['gbs']:.0f} | {r['copy_gbs']:.0f} | {r['ratio']:.2f}{peer} |\n")

        append_table(out, "# Memory-bound Fixed kernels vs device-to-device copy (same run)\n\n"
                          "Written by benchmarks/bench_memory_bound.py. Bytes = inputs read + outputs written; "
                          "ratio = kernel GB/s / copy GB/s.\n\n"
                          "| date | GPU | kernel | shape | MB moved | us | GB/s | copy GB/s | ratio |\n"
                          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
                     map(line, rows))
        print(f"appended {len(rows)} rows to {out}")
        if rows:
            summary.append(summary_records(rows, gpu))
            print(f"appended {len(rows)} records to {summary.SUMMARY.relative_to(ROOT)}")
    return 0


def summary_records(rows: list[dict], gpu: str) -> list[dict]:
    """summary.json records for bench_one's rows: bandwidth against the copy of the same bytes (speedup = the
    ratio of the two bandwidths)."""
    return [summary.record(family=r["family"], symbol=r["kernel"], shape=r["shape"], dtype=r["dtype"],
                           ours=round(r["gbs"], 1), baseline=round(r["copy_gbs"], 1),
                           baseline_name="torch device-to-device copy, same bytes", unit="GB/s",
                           goal=f">= {GOAL} of copy bandwidth", met=r["ratio"] >= GOAL, gpu=gpu,
                           speedup=round(r["ratio"], 3))
            for r in rows]


if __name__ == "__main__":
    raise SystemExit(main())
