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
Before it is timed, each kernel is launched once from NaN-poisoned outputs and every output compared with the
float64 reference its catalog family names (mamba_forge/references/, the qualifier's) within the qualifier's
tolerance (qualify/spec.py TOLERANCES by the output's dtype, or the family's qualify rtol / atol; bit-exact where
the family is exact): a kernel that fails is still timed, printed with a WRONG line, recorded as not met (in the
table its ratio is marked WRONG), and the run exits 1 (check_output and output_check, also bench_conv1d.py's and
bench_conv_optim.py's).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
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


def device_fill(count: int, dtype: str, fill: str | None):
    """A torch CUDA tensor of normal values of `dtype` drawn on the GPU (|x| + 0.5 where the catalog's `fill` is
    positive, its value where it is a constant: AdamW's device lr); counters and steps zero
    (adamw_step_capturable's arrivals must start at 0)."""
    import torch

    from mamba_forge.qualify.spec import Fill

    if dtype in ("i32", "i64", "u32"):
        return device_values(count, dtype)
    if dtype not in ("f32", "bf16", "f16"):
        raise ValueError(f"no device fill for {dtype}")
    kind = Fill.parse(fill) if fill else None
    if kind is not None and kind.kind == "const":
        return torch.full((count,), kind.args[0], device="cuda", dtype=torch_dtype(dtype))
    x = torch.randn(count, device="cuda")
    return (x.abs() + 0.5 if kind is not None and kind.kind == "positive" else x).to(torch_dtype(dtype))


def host_array(t) -> np.ndarray:
    """A tensor's values on the host as the references take them: floats as float64, integers as int64."""
    t = t.detach().cpu()
    return t.double().numpy() if t.is_floating_point() else t.numpy().astype(np.int64)


CHECK_CHUNK = 1 << 22  # elements per qualify/outputs.py compare call: big outputs are compared in chunks on threads


def compare_chunked(got: np.ndarray, ref: np.ndarray, dtype: str, rtol: float, atol: float,
                    exact: bool) -> tuple[bool, str]:
    """qualify/outputs.py compare over CHECK_CHUNK-element chunks, run on threads (numpy lets go of the GIL), so a
    bandwidth benchmark's 256 MB outputs take seconds: (ok, what), what naming the first failing chunk's start."""
    from concurrent.futures import ThreadPoolExecutor

    from mamba_forge.qualify.outputs import compare

    def one(lo: int) -> tuple[bool, str]:
        with np.errstate(divide="ignore", invalid="ignore"):  # compare's scaled-error note at a zero tolerance
            return compare(g[lo:lo + CHECK_CHUNK], r[lo:lo + CHECK_CHUNK], dtype, rtol, atol, exact)

    g, r = np.asarray(got).reshape(-1), np.asarray(ref).reshape(-1)
    if g.size != r.size:
        return compare(g, r, dtype, rtol, atol, exact)  # says so
    if g.size <= CHECK_CHUNK:
        return one(0)
    starts = range(0, g.size, CHECK_CHUNK)
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        results = list(pool.map(one, starts))
    bad = next(((lo, what) for lo, (ok, what) in zip(starts, results, strict=True) if not ok), None)
    if bad is not None:
        return False, f"in the {CHECK_CHUNK} elements from {bad[0]} (of {g.size}): {bad[1]}"
    return True, f"{g.size} elements {'exact' if exact else f'within rtol {rtol:g} atol {atol:g}'}"


def output_check(q, dtypes: dict[str, str], got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> tuple[bool, str]:
    """Every output in `got` (host arrays, name -> values) against the reference's `ref`, as the qualifier compares
    them (qualify/outputs.py compare, by compare_chunked: NaN only where the reference has one, so a poisoned
    element left unwritten fails) within its tolerance for the output's dtype (`dtypes`; qualify/spec.py
    TOLERANCES, or the family's qualify rtol / atol in `q`; bit-exact where q.exact): (ok, what). The reference
    must name every output."""
    from mamba_forge.qualify.spec import TOLERANCES

    if set(ref) != set(got):
        return False, f"the reference returns {sorted(ref)}, the kernel writes {sorted(got)}"
    notes = []
    for name, values in got.items():
        rt, at = TOLERANCES.get(dtypes[name], (0.0, 0.0))
        rtol, atol = (q.rtol if q.rtol is not None else rt), (q.atol if q.atol is not None else at)
        ok, what = compare_chunked(values, ref[name], dtypes[name], rtol, atol, bool(q.exact))
        if not ok:
            return False, f"{name}: {what}"
        notes.append(f"{name}: {what}")
    return True, "; ".join(notes)


def check_output(kern, fam, kwargs: dict, dims: dict[str, int]) -> tuple[bool, str]:
    """One launch of runtime Kernel `kern` on `kwargs` (contract_kwargs': the arguments it is timed on) from poisoned
    outputs (role out: NaN, integers -1; an inout buffer keeps its input), every output then checked by
    output_check against the float64 reference its catalog family `fam` names (fam.qualify.reference) on the
    inputs as they were before the launch: (ok, what). A family without a reference is not checked: not ok."""
    import torch

    from mamba_forge.qualify.outputs import load_callable

    if not fam.qualify.reference:
        return False, f"family {fam.name} names no reference to check against"
    ptrs = [p for p in kern.param_specs if p.kind == "pointer"]
    args = {k: v for k, v in kwargs.items() if k not in {p.name for p in ptrs}}  # the scalars (and dims)
    for p in ptrs:
        t = kwargs[p.name]
        if p.role in ("in", "inout"):
            args[p.name] = host_array(t)
        else:  # what the qualifier's reference sees for a buffer it did not fill
            args[p.name] = np.full(t.numel(), np.nan) if t.is_floating_point() else np.zeros(t.numel(), np.int64)
            t.fill_(float("nan") if t.is_floating_point() else -1)
    kern(**kwargs)
    if any(kwargs[p.name].is_cuda for p in ptrs):
        torch.cuda.synchronize()
    got = {p.name: host_array(kwargs[p.name]) for p in ptrs if p.role in ("out", "inout")}
    ref = load_callable(fam.qualify.reference)(args, dict(dims))
    return output_check(fam.qualify, {p.name: p.dtype for p in ptrs}, got, ref)


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
    """One kernel at `dims` through the runtime (its keyword launch, every argument from its contract), its output
    checked first (check_output: "ok" and "check" in the row), then timed against the copy of the bytes it moves
    (and its torch peer, where TORCH_PEERS has one)."""
    kern = k.function(name)
    fam = fixed.family(kern.family)
    fills = {p.name: p.fill for p in fam.params}
    kwargs = contract_kwargs(kern, dims, lambda p, count: device_fill(count, p.dtype, fills.get(p.name)))
    moved = bytes_moved(kern, kwargs)  # in/out buffers count twice
    ok, check = check_output(kern, fam, kwargs, dims)  # before timing: a fast wrong kernel posts no met figure
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
            "dtype": kern.dtype or "-", "ok": ok, "check": check}  # the casts and the like declare no single dtype


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
    rows, wrong = [], set()
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
        if not r["ok"]:
            wrong.add((r["kernel"], r["shape"]))
            print(f"WRONG: {r['kernel']} {r['shape']}: output differs from the float64 reference: {r['check']}")
    if not a.no_write:
        out = ROOT / "benchmarks" / "results" / "memory_bound.md"
        date = utc_stamp("%Y-%m-%d")

        def line(r: dict) -> str:
            peer = "" if r["peer"] is None else f" torch peer {r['peer']:.2f}x"
            bad = " WRONG (output check failed)" if (r["kernel"], r["shape"]) in wrong else ""
            return (f"| {date} | {gpu} | {r['kernel']} | {r['shape']} | {r['bytes'] / 1e6:.1f} | {r['us']:.1f} | "
                    f"{r['gbs']:.0f} | {r['copy_gbs']:.0f} | {r['ratio']:.2f}{peer}{bad} |\n")

        append_table(out, "# Memory-bound Fixed kernels vs device-to-device copy (same run)\n\n"
                          "Written by benchmarks/bench_memory_bound.py. Bytes = inputs read + outputs written; "
                          "ratio = kernel GB/s / copy GB/s.\n\n"
                          "| date | GPU | kernel | shape | MB moved | us | GB/s | copy GB/s | ratio |\n"
                          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
                     map(line, rows))
        print(f"appended {len(rows)} rows to {out}")
        if rows:
            summary.append(summary_records(rows, gpu, wrong))
            print(f"appended {len(rows)} records to {summary.SUMMARY.relative_to(ROOT)}")
    return 1 if wrong else 0


def summary_records(rows: list[dict], gpu: str, wrong: set = frozenset()) -> list[dict]:
    """summary.json records for bench_one's rows: bandwidth against the copy of the same bytes (speedup = the
    ratio of the two bandwidths). A (kernel, shape) in `wrong` (its output failed check_output) is recorded as not
    met, superseding an older record."""
    return [summary.record(family=r["family"], symbol=r["kernel"], shape=r["shape"], dtype=r["dtype"],
                           ours=round(r["gbs"], 1), baseline=round(r["copy_gbs"], 1),
                           baseline_name="torch device-to-device copy, same bytes", unit="GB/s",
                           goal=f">= {GOAL} of copy bandwidth",
                           met=r["ratio"] >= GOAL and (r["kernel"], r["shape"]) not in wrong, gpu=gpu,
                           speedup=round(r["ratio"], 3))
            for r in rows]


if __name__ == "__main__":
    raise SystemExit(main())
