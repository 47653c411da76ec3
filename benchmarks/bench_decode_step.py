"""Decode step: the current ssm_step_forward_fused_bf16 and every ssm_step_forward_fused_v candidate against
mamba-ssm 2.3.2.post1's Triton selective_state_update, all inside CUDA graphs, in one run (H200).

    python benchmarks/bench_decode_step.py [--quick] [--no-write] [--smoke]

--smoke: batch 1, 4 steps per graph, one round; seconds, nothing written.

Shape: d_inner 2048, d_state 16, dt_rank 128 (as bench_scan.py's decode rows), batch 1..256 (--quick: 1, 16, 256);
f32 state updated in place, bf16 u/dt/z/x_dbl/out, f32 A_log/dt_bias/D, dt_softplus, D and z. Triton gets
A = -exp(A_log) precomputed and B, C as strided views of x_dbl (what a Mamba decode loop passes it).
Timing: `--inner` steps (default 20) captured in one CUDA graph per contender (ours and Triton), then `--rounds`
interleaved rounds (default 9), each timing every graph (median of 5 replays) in an order rotated per round; the
median over rounds, per step (interleaved_ms: one contender timed in a block let clock drift rank). Checks per symbol
and batch: out and state of one step against the float64 reference, and the step repeated from the same state
bitwise equal. Floor: the bytes one step moves (state read + written, A_log, x_dbl, u/dt/z/out, dt_bias, D) at the
torch device-copy bandwidth measured in the same run. The decode-step symbols are built here (benchmarks/scan_ops.py
Ours, benchmarks/built.py) and each step is the runtime's keyword launch (grid, block and arguments from the
symbol's contract), captured in the graph: a grid within the symbol's pdl_max_blocks (batch 1..32 here) launches
with programmatic dependent launch, as an engine's does, so a step's launch overlaps the step before it (what that
is worth alone: scripts/probe_decode_latency.py, the same kernel launched both ways).
Writes: rows appended to benchmarks/results/scan.md and records in benchmarks/results/summary.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # scan_ops puts tests/gpu, tests and the peers on the path

from common import bench_parser, utc_stamp  # noqa: E402  (benchmarks/common.py)
from scan_ops import Ours, _peer_ssu, copy_bandwidth, decode_inputs, step_checks, step_kwargs  # noqa: E402
from summary import append as summary_append  # noqa: E402
from summary import record  # noqa: E402
from timing import capture_graph, median_ms  # noqa: E402  (benchmarks/timing.py)

from mamba_forge.references import scan as ref  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "scan.md"
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
D, N, R = 2048, 16, 128
CURRENT = "ssm_step_forward_fused_bf16"
FAMILY = "ssm_step_forward_fused_v"
BASELINE = "mamba-ssm Triton selective_state_update (graphs)"


def step_bytes(b: int) -> int:
    return (b * D * N * 4 * 2 + D * N * 4 + b * (R + 2 * N) * 2 + 4 * b * D * 2 + 2 * D * 4)


def decode_batch(o: Ours, ssu, names: list[str], bsz: int, inner: int, rounds: int):
    import torch

    s0, u, dt, z, dt_bias, A_log, Dp, x_dbl = decode_inputs(bsz, D, N, R)
    dims = {"batch": bsz, "d_inner": D, "d_state": N, "dt_rank": R, "z_pad": 0}  # step_kwargs: a dense z
    ref.check_launch("ssm_step_forward_fused", dims, o.cap)
    res, graphs = {}, {}
    for name in names:
        state = s0.clone()
        out = torch.empty(bsz, D, dtype=torch.bfloat16, device="cuda")
        fn = o.bind(name, **step_kwargs(out, state, u, dt, z, dt_bias, A_log, Dp, x_dbl))
        (err_out, err_state), rep = step_checks(fn, out, state, s0, u, dt, z, dt_bias, A_log, Dp, x_dbl)
        graphs[name] = (capture_graph(fn, inner), (state, out))  # the buffers live as long as the graph
        ok = rep and err_out <= 1e-2 and err_state <= 2e-5  # bf16 out, f32 state (tests/gpu/test_scan.py's bounds)
        at = o.kernels.function(name).contract.at(dims)  # the launch geometry its contract gives here
        res[name] = dict(ok=ok, err_out=err_out, err_state=err_state, grid=at.grid, block=at.block)
    if ssu is not None:
        state = s0.clone()
        A = -torch.exp(A_log)
        Bv, Cv = x_dbl[:, R:R + N], x_dbl[:, R + N:]
        graphs[PEER] = (capture_graph(lambda: ssu(state, u, dt, A, Bv, Cv, Dp, z, dt_bias, True), inner), (state,))
    times = interleaved_ms({k: g for k, (g, _) in graphs.items()}, inner, rounds)
    for name in names:
        res[name]["ms"] = times[name]
    return res, times.get(PEER)


PEER = "triton"


def interleaved_ms(graphs: dict, inner: int, rounds: int, reps: int = 5) -> dict[str, float]:
    """ms per step of each graph: `rounds` rounds, each timing every graph (median of `reps` replays) in an order
    rotated by one per round; the median over rounds. Timing each contender in one block, as before, let the
    GPU's clock and the order decide the ranking: the same kernel under two names measured 1.75 and 1.94 us at
    batch 1 in one run (2026-12-01), more than the gaps it had to rank."""
    keys = list(graphs)
    per: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            per[k].append(median_ms(graphs[k].replay, reps, warmup=2) / inner)
    return {k: statistics.median(v) for k, v in per.items()}


def parser() -> argparse.ArgumentParser:
    ap = bench_parser(__doc__, "batch 1, 4 steps per graph, one round; nothing written",
                      no_write="print only: no scan.md rows, no summary records", inner=4, rounds=1)
    ap.add_argument("--quick", action="store_true", help="batches 1, 16, 256 only")
    ap.add_argument("--inner", type=int, default=20, help="steps captured per CUDA graph")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds (median over rounds)")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch

    dev = torch.cuda.get_device_properties(0)
    gpu = dev.name
    bad = {}  # the decode-step symbols of the scan module only (the build's --kernels glob): seconds to build
    o = Ours(64, kernels=("ssm_step_forward_fused*",), on_rejected=bad.__setitem__)
    candidates = sorted(n for n in o.kernels.admitted() if o.kernels.symbol(n).family == FAMILY
                        and o.kernels.symbol(n).dtype == "bf16")
    names = [n for n in [CURRENT] + candidates if n not in bad]
    ssu, why = _peer_ssu()
    bw = copy_bandwidth()
    torch.cuda.empty_cache()
    print(f"{gpu}: {dev.multi_processor_count} SMs, copy bandwidth {bw / 1e12:.2f} TB/s; Triton peer: "
          f"{'ok' if ssu else why}; rejected: {bad or 'none'}")
    batches = [1] if a.smoke else [1, 16, 256] if a.quick else BATCHES
    rows = []
    for bsz in batches:
        res, tp = decode_batch(o, ssu, names, bsz, a.inner, a.rounds)
        rows.append((bsz, res, tp, step_bytes(bsz) / bw * 1e3))
    _print(rows, names)
    if not a.no_write:
        _write(rows, names, gpu)
    return 0 if all(r["ok"] for _, res, _, _ in rows for r in res.values()) else 1


def _short(name: str) -> str:
    return "current" if name == CURRENT else name.replace("ssm_step_forward_fused_", "").replace("_bf16", "")


def _print(rows, names):
    head = f"{'batch':>5} {'triton us':>9} {'floor us':>8} " + " ".join(f"{_short(n):>18}" for n in names)
    print("\nus per step (ratio to Triton); * = failed a check\n" + head)
    for bsz, res, tp, floor in rows:
        cells = []
        for n in names:
            r = res[n]
            ratio = f"{r['ms'] / tp:.2f}x" if tp else "-"
            cells.append(f"{r['ms'] * 1e3:9.2f} ({ratio}){'' if r['ok'] else '*'}".rjust(18))
        print(f"{bsz:>5} {(tp or float('nan')) * 1e3:9.2f} {floor * 1e3:8.2f} " + " ".join(cells))
    print("\nworst normwise errors (out <= 1e-2, state <= 2e-5): " + "; ".join(
        f"{_short(n)} {max(res[n]['err_out'] for _, res, _, _ in rows):.1e} / "
        f"{max(res[n]['err_state'] for _, res, _, _ in rows):.1e}" for n in names))
    for n in names:
        ratios = [res[n]["ms"] / tp for _, res, tp, _ in rows if tp]
        if ratios:
            print(f"  {_short(n):<12} worst {max(ratios):.3f}x, best {min(ratios):.3f}x Triton; "
                  f"grid at B=1 {rows[0][1][n]['grid']}, block {rows[0][1][n]['block']}")


def _write(rows, names, gpu):
    date = utc_stamp()
    recs = []
    with RESULTS.open("a") as f:
        for bsz, res, tp, floor in rows:
            for n in names:
                r = res[n]
                ratio = "-" if tp is None else f"{r['ms'] / tp:.3f}"
                f.write(f"| {date} | {gpu} | decode step {_short(n)} (graph) | B{bsz} D{D} N{N} | {r['ms']:.4f} | "
                        f"{'-' if tp is None else f'{tp:.4f}'} | {ratio} | {'yes' if r['ok'] else 'NO'} | io {floor:.4f} |\n")
                if tp is not None:
                    recs.append(record(family="ssm_step_forward_fused" if n == CURRENT else FAMILY, symbol=n,
                                       shape=f"B{bsz}xD{D}xN{N}", dtype="bf16", ours=r["ms"], baseline=tp,
                                       baseline_name=BASELINE, unit="ms", goal="<=1.0x Triton time",
                                       met=bool(r["ok"] and r["ms"] <= tp), gpu=gpu))
    if recs:
        summary_append(recs)


if __name__ == "__main__":
    sys.exit(main())
