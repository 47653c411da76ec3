"""The prefill-decode-consistent scan (ssm_scan_tokens, through torch.ops.mamba_forge.scan_tokens) against
mamba-ssm's forward (selective_scan_cuda.fwd with z, D, delta_bias, softplus) and our parallel scan
(ssm_parallel_scan_fwd_nosave, mamba_forge::selective_scan), each on its own layout, GPU time (CUDA events), one
run. Issue 23's goal: the consistent scan at most 1.0x mamba-ssm's time at B8 D2048 L2048 N16 and B4 D4096 L4096
N16. Per shape also both scans by name, ssm_scan_tokens (four lanes, every thread loads, stages and steps) and
ssm_scan_tokens_ws (producer warps stage a ring for eight-lane scan warps), checked bit-identical (out and final
state): the op picks by grid size (mamba_forge.runtime.torch_ops.scan_tokens_ws_serves). Appends to
benchmarks/results/summary.json.
    python benchmarks/bench_scan_tokens.py --bundle h200.tar.gz --key manifests/keys [--smoke]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))

from common import bench_parser  # noqa: E402  (benchmarks/common.py)

PEER = "mamba-ssm 2.3.2.post1 selective_scan_cuda.fwd"


def parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "one small shape, seconds; nothing recorded", signed=True)
    p.add_argument("--reps", type=int, default=20)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    from common import register_signed
    from mamba_peer import load_selective_scan_cuda
    from summary import append
    from timing import median_ms

    kernels = register_signed(a.bundle, a.key)
    ssc, why = load_selective_scan_cuda()
    ops, bf, gpu = torch.ops.mamba_forge, torch.bfloat16, torch.cuda.get_device_name()
    shapes = [(1, 256, 128, 16)] if a.smoke else [(8, 2048, 2048, 16), (4, 4096, 4096, 16), (1, 2048, 2048, 16),
                                                  (2, 2048, 2048, 16), (4, 2048, 2048, 16), (1, 4096, 2048, 16),
                                                  (2, 4096, 2048, 16), (1, 5120, 2048, 16), (2, 5120, 2048, 16)]
    reps, r = (3 if a.smoke else a.reps), 64
    records, differ = [], []
    for b, d, L, n in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        rnd = lambda *s, lo=-1.0, hi=1.0, g=g: torch.rand(s, generator=g, device="cuda") * (hi - lo) + lo  # noqa: E731
        u, dt = rnd(b, L, d).to(bf), rnd(b, L, d, lo=-4, hi=0).to(bf)
        x_dbl, xz = rnd(b, L, r + 2 * n).to(bf), rnd(b, L, 2 * d, lo=-3, hi=3).to(bf)
        A_log, D, dt_bias, state = rnd(d, n, lo=-1, hi=1.5), rnd(d), rnd(d), torch.zeros(b, d, n, device="cuda")
        ours = median_ms(lambda: ops.scan_tokens(u, dt, dt_bias, A_log, x_dbl, D, xz, state), reps)  # noqa: B023
        by_name = {}
        for fam in ("ssm_scan_tokens", "ssm_scan_tokens_ws"):
            fn, st, out = kernels.fn(fam, "bf16"), state.clone(), torch.empty_like(u)
            call = lambda fn=fn, st=st, out=out: fn(out=out, state=st, u=u, dt=dt, dt_bias=dt_bias, A_log=A_log,  # noqa: E731, B023
                                                     x_dbl=x_dbl, Dp=D, xz=xz, batch=b, d_inner=d, d_state=n,  # noqa: B023
                                                     dt_rank=r, L=L)  # noqa: B023
            call()  # from `state`
            first = (out.clone(), st.clone())
            by_name[fam] = (median_ms(call, reps), *first)  # (the state runs on: the time does not depend on it)
        (t4, o4, s4), (tw, ow, sw) = by_name["ssm_scan_tokens"], by_name["ssm_scan_tokens_ws"]
        same = torch.equal(o4, ow) and torch.equal(s4, sw)
        print(f"B{b} D{d} L{L}: four lanes {t4 * 1e3:.1f} us, warp-specialised {tw * 1e3:.1f} us ({t4 / tw:.2f}x), "
              f"bit-identical: {same}")
        if not same:
            differ.append(f"B{b} D{d} L{L}")
        # the channel-major forms (what mamba-ssm and our parallel scan read)
        uc, dtc, zc = (t.transpose(1, 2).contiguous() for t in (u, dt, xz[..., d:]))
        Bc = x_dbl[..., r:r + n].transpose(1, 2).contiguous()
        Cc = x_dbl[..., r + n:].transpose(1, 2).contiguous()
        par = median_ms(lambda: ops.selective_scan(uc, dtc, A_log, Bc, Cc, D, zc, dt_bias), reps)  # noqa: B023
        peer = None
        if ssc is not None:
            A = -torch.exp(A_log)
            peer = median_ms(lambda: ssc.fwd(uc, dtc, A, Bc.unsqueeze(1), Cc.unsqueeze(1), D, zc, dt_bias, True),  # noqa: B023
                             reps)
        shape = f"B{b} D{d} L{L} N{n}"
        print(f"{shape}: scan_tokens {ours * 1e3:.1f} us, parallel scan {par * 1e3:.1f} us, "
              f"peer {peer * 1e3 if peer else float('nan'):.1f} us" + ("" if peer else f" ({why})"))
        if not a.smoke:
            records += scan_records(shape, ours, peer, t4, tw, same, gpu)
    if records:
        append(records)  # the failing bit-identity rows are recorded too, then the run fails
    if differ:
        print(f"ssm_scan_tokens and ssm_scan_tokens_ws differ at {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


def scan_records(shape: str, ours: float, peer: float | None, t4: float, tw: float, same: bool,
                 gpu: str) -> list[dict]:
    """One shape's rows (times in ms): the op against the peer (not met without a peer time, nor when the two
    kernels the op picks between differ in their bits: a wrong kernel posts no win) and ssm_scan_tokens_ws's bit
    identity with ssm_scan_tokens (met = the comparison itself)."""
    from summary import record

    return [record(family="ssm_scan_tokens", symbol="ssm_scan_tokens_bf16", shape=shape, dtype="bf16", ours=ours,
                   baseline=peer, baseline_name=PEER, unit="ms", gpu=gpu,
                   goal="<= 1.0x peer time (bit-identical kernels)", met=bool(same and peer and ours <= peer)),
            record(family="ssm_scan_tokens_ws", symbol="ssm_scan_tokens_ws_bf16", shape=shape, dtype="bf16", ours=tw,
                   baseline=t4, baseline_name="ssm_scan_tokens_bf16 (four lanes)", unit="ms", gpu=gpu,
                   goal="bit-identical to ssm_scan_tokens", met=bool(same))]


if __name__ == "__main__":
    sys.exit(main())
