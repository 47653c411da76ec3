"""Selective-scan benchmark: ours (kernels/fixed/scan.cu) against mamba-ssm 2.3.2.post1 in the same run (H200).

    bash benchmarks/peers/build_mamba_ssm.sh      # once per machine (~2.5 min); optional
    python benchmarks/bench_scan.py [--quick] [--no-write]  # table; rows to results/scan.md, records to summary.json
    python benchmarks/bench_scan.py --smoke   # SMOKE_SHAPE and decode batch 1: seconds, nothing written

Cases (bf16 in, f32 state, delta_softplus, D, z, delta_bias):
  * forward: ours ssm_parallel_scan_fwd_nosave_bf16 (and the saving training forward) vs selective_scan_cuda.fwd;
  * forward+backward: ours fwd(save) + bwd (plain and fold) + the fixed-order reductions vs selective_scan_cuda fwd+bwd;
  * decode step: ours ssm_step_forward_fused_bf16 vs the Triton selective_state_update, both inside CUDA graphs.
Timing: CUDA events, warm-up, median of repeats. Checks: ours against the float64 reference on a subset of
channels (the kernels are per-channel, so any subset checks the full launch), and bitwise repeatability of every
output. Floors: bytes moved at the measured copy bandwidth, and one exp per (b, d, l, n) on the SFUs.
The kernel side (launches, inputs, reference check, repeatability, floors, peers) is benchmarks/scan_ops.py: the scan
module built here and every kernel launched through the runtime (keyword calls of the symbols' contracts).
Records (benchmarks/summary.py, summary_records below): ms against the peer; goals <= 1.0x mamba-ssm forward time
(both forwards), <= 0.9x its fwd+bwd time (the fold), <= 1.0x Triton time (decode step).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

from common import smoke  # noqa: E402  (benchmarks/common.py)
from scan_ops import (  # noqa: E402, F401  (benchmarks/scan_ops.py: the kernel side, re-exported)
    REPS,
    Ours,
    _nerr,
    _peer_scan,
    _peer_ssu,
    bitwise_repeat,
    check_subset,
    copy_bandwidth,
    decode_inputs,
    f64,
    floors_ms,
    make_inputs,
    ours_backward,
    ours_forward,
    step_checks,
    step_kwargs,
    time_graph_ms,
)
from summary import append as summary_append  # noqa: E402  (benchmarks/summary.py)
from summary import record  # noqa: E402
from timing import median_ms  # noqa: E402  (benchmarks/timing.py)

from mamba_forge.references import scan as ref  # noqa: E402

# torch is imported by the functions that use it, not here: tests/test_benchmark_records.py imports this module
# (summary_records) on a machine without torch.

RESULTS = ROOT / "benchmarks" / "results" / "scan.md"
FWD_SHAPES = [(8, 2048, 2048, 16), (4, 4096, 4096, 16)]
SMOKE_SHAPE = (1, 256, 512, 16)  # --smoke: (batch, d_inner, L, d_state)
PEER_ANCHOR = {(8, 2048, 2048, 16): (0.585, 3.042), (4, 4096, 4096, 16): (1.151, 6.048)}  # anchors.md (ms)
DECODE_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]

PEER_FWD = "mamba-ssm 2.3.2.post1 selective_scan_cuda.fwd"
PEER_FWD_BWD = "mamba-ssm 2.3.2.post1 selective_scan_cuda fwd + bwd"
PEER_DECODE = "mamba-ssm Triton selective_state_update (graphs)"  # bench_decode_step.BASELINE: the same records
# case -> (family, launched symbol, goal, most ours / peer time that meets it, baseline name). The fwd+bwd cases
# time our saving forward + the backward + the fixed-order reductions against the peer's fwd + bwd; they are keyed
# by their backward symbol, the launch that tells the two apart. The plain (W=4) backward has no goal of its own
# (the fold is the training path): goal "" and met = parity with mamba-ssm (ours <= peer), so its record still
# says whether it keeps up. The decode rows are the records bench_decode_step.py writes for its current symbol
# (same symbol, shape, dtype, baseline and goal): whichever script ran last holds them.
SUMMARY_CASES = {
    "fwd nosave": ("ssm_parallel_scan_fwd_nosave", "ssm_parallel_scan_fwd_nosave_bf16",
                   "<=1.0x mamba-ssm forward time", 1.0, PEER_FWD),
    "fwd save": ("ssm_parallel_scan_fwd", "ssm_parallel_scan_fwd_bf16", "<=1.0x mamba-ssm forward time", 1.0, PEER_FWD),
    "fwd+bwd": ("ssm_parallel_scan_bwd", "ssm_parallel_scan_bwd_bf16", "", 1.0, PEER_FWD_BWD),
    "fwd+bwd fold": ("ssm_parallel_scan_bwd_fold", "ssm_parallel_scan_bwd_fold_bf16", "<=0.9x mamba-ssm fwd+bwd time",
                     0.9, PEER_FWD_BWD),
    "decode step (graph)": ("ssm_step_forward_fused", "ssm_step_forward_fused_bf16", "<=1.0x Triton time", 1.0,
                            PEER_DECODE),
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="first forward shape and 3 decode batches only")
    ap.add_argument("--no-write", action="store_true", help="print only: no scan.md rows, no summary records")
    ap.add_argument("--smoke", action="store_true",
                    help=f"forward and backward at {SMOKE_SHAPE}, decode at batch 1; seconds, nothing written")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return smoke(parser().parse_args(argv), no_write=True)


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.cuda.get_device_properties(0)
    gpu, sms = dev.name, dev.multi_processor_count
    o = Ours(64)
    ssc, why_scan = _peer_scan()
    ssu, why_ssu = _peer_ssu()
    bw = copy_bandwidth()
    print(f"{gpu}: {sms} SMs, copy bandwidth {bw / 1e12:.2f} TB/s; peer scan: {'ok' if ssc else why_scan}; "
          f"peer decode: {'ok' if ssu else why_ssu}")
    rows = []
    shapes = [SMOKE_SHAPE] if a.smoke else FWD_SHAPES[:1] if a.quick else FWD_SHAPES
    for shape in shapes:
        rows += _seq_case(o, ssc, shape, bw, sms)
        torch.cuda.empty_cache()
    batches = [1] if a.smoke else [1, 16, 256] if a.quick else DECODE_BATCHES
    for bsz in batches:
        rows.append(_decode_case(o, ssu, bsz, bw))
    _print(rows, gpu)
    if not a.no_write:
        _write(rows, gpu)
        summary_append(summary_records(rows, gpu))
    return 0 if all(r[4] for r in rows) else 1


def _seq_case(o: Ours, ssc, shape_t, bw, sms):
    """Forward and forward+backward rows for one (batch, d_inner, L, d_state)."""
    import torch

    b, d, L, n = shape_t
    rows = []
    x = make_inputs(b, d, L, n)
    io_ms, exp_ms = floors_ms(b, d, L, n, bw, sms)
    fwd_ns, fw_ns = ours_forward(o, x, save=False)
    fwd_s, fw_s = ours_forward(o, x, save=True)
    t_ns, t_s = median_ms(fwd_ns, REPS), median_ms(fwd_s, REPS)
    rep_ns = bitwise_repeat(fwd_ns, fw_ns)
    rep_s = bitwise_repeat(fwd_s, fw_s)
    fwd_s()
    torch.cuda.synchronize()
    bwd_fns = {}
    for fold in (False, True):
        bfn, bo = ours_backward(o, x, fw_s["saved"], fold)
        bwd_fns[fold] = (bfn, bo)
    errs = check_subset(x, fw_s, None)
    errs_ns = check_subset(x, fw_ns, None)
    peer_f = peer_fb = None
    if ssc is not None:
        A = -torch.exp(x["A_log"])
        # the extension takes B and C as (batch, groups, dstate, seqlen), as selective_scan_fn rearranges them
        Bg, Cg = x["B"].unsqueeze(1), x["C"].unsqueeze(1)
        peer_f = median_ms(lambda: ssc.fwd(x["u"], x["delta"], A, Bg, Cg, x["D"], x["z"], x["delta_bias"], True), REPS)

        def peer_fwd_bwd():
            out, xs, *rest = ssc.fwd(x["u"], x["delta"], A, Bg, Cg, x["D"], x["z"], x["delta_bias"], True)
            ssc.bwd(x["u"], x["delta"], A, Bg, Cg, x["D"], x["z"], x["delta_bias"], x["dout"], xs, out, None, True, False)

        peer_fb = median_ms(peer_fwd_bwd, REPS)
    shape = f"B{b} D{d} L{L} N{n}"
    floor = f"io {io_ms:.3f} / exp {exp_ms:.3f}"
    ok = max(errs.values()) <= 1e-2 and max(errs_ns.values()) <= 1e-2
    rows.append(("fwd nosave", shape, t_ns, peer_f, rep_ns and ok, floor, PEER_ANCHOR.get((b, d, L, n), (None,))[0]))
    rows.append(("fwd save", shape, t_s, peer_f, rep_s and ok, floor, PEER_ANCHOR.get((b, d, L, n), (None,))[0]))
    for fold, (bfn, bo) in bwd_fns.items():
        t_fb = median_ms(lambda bfn=bfn, fwd=fwd_s: (fwd(), bfn()), REPS)
        torch.cuda.synchronize()
        be = check_subset(x, fw_s, bo)
        rep = bitwise_repeat(bfn, bo)
        ok_b = max(be.values()) <= 1e-2
        print(f"  {shape} bwd{' fold' if fold else ''} errors: " + ", ".join(f"{k} {v:.1e}" for k, v in be.items()))
        rows.append((f"fwd+bwd{' fold' if fold else ''}", shape, t_fb, peer_fb, rep and ok_b, floor,
                     PEER_ANCHOR.get((b, d, L, n), (None, None))[1]))
    print(f"  {shape} fwd errors: " + ", ".join(f"{k} {v:.1e}" for k, v in {**errs, **errs_ns}.items()))
    return rows


def _decode_case(o: Ours, ssu, bsz, bw, d=2048, n=16, r=128):
    import torch

    bf = torch.bfloat16
    state, u, dt, z, dt_bias, A_log, D, x_dbl = decode_inputs(bsz, d, n, r)
    out = torch.empty(bsz, d, dtype=bf, device="cuda")
    ref.check_launch("ssm_step_forward_fused", {"batch": bsz, "d_inner": d, "d_state": n, "dt_rank": r}, o.cap)
    # grid and block from the symbol's contract (kernels/fixed/scan.toml: BLOCK and LANES of the chosen instance):
    # a hard-coded (128,) block went stale when the instance changed (CUDA_ERROR_INVALID_VALUE)
    fn = o.bind("ssm_step_forward_fused_bf16", **step_kwargs(out, state, u, dt, z, dt_bias, A_log, D, x_dbl))
    s0 = state.clone()
    err, rep = step_checks(fn, out, state, s0, u, dt, z, dt_bias, A_log, D, x_dbl)
    t_ours = time_graph_ms(fn)
    t_peer = None
    if ssu is not None:
        A = -torch.exp(A_log)
        Bv, Cv = x_dbl[:, r:r + n], x_dbl[:, r + n:]
        t_peer = time_graph_ms(lambda: ssu(state, u, dt, A, Bv, Cv, D, z, dt_bias, True))
    io = bsz * d * n * 4 * 2 + d * n * 4 + bsz * d * 2 * 4
    return ("decode step (graph)", f"B{bsz} D{d} N{n}", t_ours, t_peer, rep and max(err) <= 1e-2,
            f"io {io / bw * 1e3:.4f}", None)


def _fmt(v):
    return "-" if v is None else f"{v:.4f}"


def _print(rows, gpu):
    print(f"\n{'case':<20} {'shape':<24} {'ours ms':>9} {'peer ms':>9} {'ratio':>7} {'anchor':>7}  ok    floors ms")
    for case, shape, t, tp, ok, floor, anchor in rows:
        ratio = "-" if tp is None else f"{t / tp:.3f}"
        print(f"{case:<20} {shape:<24} {t:9.4f} {_fmt(tp):>9} {ratio:>7} {_fmt(anchor):>7}  {'yes' if ok else 'NO':<5} {floor}")


def summary_records(rows, gpu: str) -> list[dict]:
    """benchmarks/results/summary.json records for the rows main() builds (case, shape, ours ms, peer ms or None,
    ok, floors, anchor): ms, bf16, met only with the peer timed in this run and every check passed."""
    recs = []
    for case, shape, t, tp, ok, _floor, _anchor in rows:
        family, symbol, goal, most, peer = SUMMARY_CASES[case]
        recs.append(record(family=family, symbol=symbol, shape=shape.replace(" ", "x"), dtype="bf16", ours=t,
                           baseline=tp, baseline_name=peer, unit="ms", goal=goal,
                           met=tp is not None and ok and t <= most * tp, gpu=gpu))
    return recs


def _write(rows, gpu):
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    new = not RESULTS.exists()
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M")
    with RESULTS.open("a") as f:
        if new:
            f.write("# Selective scan: ours vs mamba-ssm 2.3.2.post1 (benchmarks/bench_scan.py)\n\n"
                    "ratio = ours / peer (same run); ok = matches the float64 reference and is bitwise repeatable.\n\n"
                    "| date (UTC) | GPU | case | shape | ours ms | peer ms | ratio | ok | floors ms |\n"
                    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
        for case, shape, t, tp, ok, floor, _anchor in rows:
            ratio = "-" if tp is None else f"{t / tp:.3f}"
            f.write(f"| {date} | {gpu} | {case} | {shape} | {t:.4f} | {_fmt(tp)} | {ratio} | {'yes' if ok else 'NO'} | {floor} |\n")


if __name__ == "__main__":
    sys.exit(main())
