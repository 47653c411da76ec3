"""The decode conv (one token: conv_tokens at L = 1) by kernel: conv1d_tokens_silu (the tiled token conv, one
channel a thread) and conv1d_tokens_silu_vec (four channels a thread, vector loads; the same bits, checked here),
against causal-conv1d 1.7.0's causal_conv1d_update (the peer's decode conv, built by
benchmarks/peers/build_mamba_ssm.sh), GPU time per call in CUDA graphs, bf16, width 4, at d_inner 2048 and 5120
(d_model 1024 and 2560) and batch 1..256. The op serves L <= CONV_TOKENS_VEC_MAX_L from the vectorised kernel
(runtime/torch_ops.py conv_tokens_vec_serves); these figures are why. --prefill: the prefill conv instead, the tiled
conv over (b1, L2048), (b8, L2048) and (b4, L4096) from a zero state against causal-conv1d's causal_conv1d_fn (the
peer's fast-path prefill conv, on its own [b, d, L] layout), goal <= 1.0x its time. Appends to
benchmarks/results/summary.json.
    python benchmarks/bench_conv_tokens.py --bundle h200.tar.gz --key manifests/keys [--prefill] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import bench_parser  # noqa: E402  (benchmarks/common.py)

PEER = "causal-conv1d 1.7.0 causal_conv1d_update"
PEER_PREFILL = "causal-conv1d 1.7.0 causal_conv1d_fn"
PREFILL_SHAPES = ((1, 2048), (8, 2048), (4, 4096))
FAMILIES = ("conv1d_tokens_silu", "conv1d_tokens_silu_vec")


def parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "one small shape, seconds; nothing recorded", signed=True)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--batches", default="1,4,16,64,256")
    p.add_argument("--dims", default="2048,5120", help="d_inner values")
    p.add_argument("--prefill", action="store_true", help="the prefill conv against causal_conv1d_fn instead")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def peer_conv(name: str = "causal_conv1d_update"):
    """(causal-conv1d's function `name` or None, reason)."""
    from bench_mamba_block import PEER_ROOT

    if (PEER_ROOT / "causal_conv1d-1.7.0").is_dir():
        sys.path.insert(0, str(PEER_ROOT / "causal_conv1d-1.7.0"))
    try:
        import causal_conv1d
    except Exception as exc:  # noqa: BLE001 - ours still runs
        return None, f"causal-conv1d not importable: {exc}"
    return getattr(causal_conv1d, name), ""


def graph_us(fn, reps: int, inner: int = 20) -> float:
    from timing import capture_graph, median_ms

    g = capture_graph(fn, inner)
    return median_ms(g.replay, reps) / inner * 1e3


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    from common import register_signed
    from summary import append

    kernels = register_signed(a.bundle, a.key)
    if a.prefill:
        return prefill(a, kernels)
    update, why = peer_conv()
    bf, gpu, w = torch.bfloat16, torch.cuda.get_device_name(), 4
    batches = [1] if a.smoke else [int(x) for x in a.batches.split(",")]
    dims = [256] if a.smoke else [int(x) for x in a.dims.split(",")]
    reps = 3 if a.smoke else a.reps
    records, differ = [], []
    for d in dims:
        for b in batches:
            g = torch.Generator(device="cuda").manual_seed(b)
            xz = (torch.rand(b, 1, 2 * d, generator=g, device="cuda") * 4 - 2).to(bf)
            st0 = (torch.rand(b, d, w - 1, generator=g, device="cuda") * 4 - 2).to(bf)
            weight = torch.rand(d, w, generator=g, device="cuda") * 2 - 1
            bias = torch.rand(d, generator=g, device="cuda") * 2 - 1
            times, firsts = {}, {}
            for fam in FAMILIES:
                fn, st, out = kernels.fn(fam, "bf16"), st0.clone(), torch.empty(b, 1, d, dtype=bf, device="cuda")
                call = lambda fn=fn, st=st, out=out: fn(out=out, conv_state=st, xz=xz, weight=weight, bias=bias,  # noqa: E731, B023
                                                         batch=b, d=d, L=1, width=w)  # noqa: B023
                call()  # one step from st0: the bits compared below
                firsts[fam] = (out.clone(), st.clone())
                times[fam] = graph_us(call, reps)
            (o1, s1), (o2, s2) = firsts[FAMILIES[0]], firsts[FAMILIES[1]]
            same = torch.equal(o1, o2) and torch.equal(s1, s2)
            if not same:
                differ.append(f"batch {b} d {d}")
            peer = None
            if update is not None:
                # the peer's own layout: x [b, d], state [b, d, width] (it keeps width inputs), weight [d, width]
                x, pst = xz[:, 0, :d], torch.zeros(b, d, w, dtype=bf, device="cuda")
                wb = weight.to(bf)
                peer = graph_us(lambda x=x, pst=pst, wb=wb: update(x, pst, wb, bias.to(bf), "silu"), reps)  # noqa: B023
            tiled, vec = times[FAMILIES[0]], times[FAMILIES[1]]
            peer_txt = f"{peer:.2f} us" if peer is not None else f"n/a ({why})"
            print(f"d {d} batch {b}: tiled {tiled:.2f} us, vec {vec:.2f} us ({tiled / vec:.2f}x), peer {peer_txt}, "
                  f"bit-identical: {same}", flush=True)
            if not a.smoke:
                records += decode_records(f"b{b} d{d} L1 w{w}", tiled, vec, peer, same, gpu)
    if records:
        append(records)  # the failing bit-identity rows are recorded too, then the run fails
    if differ:
        print(f"conv1d_tokens_silu and conv1d_tokens_silu_vec differ at {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


def decode_records(shape: str, tiled: float, vec: float, peer: float | None, same: bool, gpu: str) -> list[dict]:
    """The decode conv's rows at one shape (times in us): the vectorised kernel's bit identity with the tiled one
    (':vs-tiled', met = the comparison itself) and the faster of the two against the peer (':vs-peer', only with a
    peer time; not met when the two kernels' bits differ: a wrong kernel posts no win)."""
    from summary import record

    sym = "conv1d_tokens_silu_vec_bf16"
    recs = [record(family="conv1d_tokens_silu_vec", symbol=f"{sym}:vs-tiled", shape=shape, dtype="bf16",
                   ours=vec / 1e3, baseline=tiled / 1e3, baseline_name="conv1d_tokens_silu_bf16 (tiled)", unit="ms",
                   gpu=gpu, goal="bit-identical to the tiled conv", met=bool(same))]
    if peer is not None:
        best = min(tiled, vec)
        recs.append(record(family="conv1d_tokens_silu_vec", symbol=f"{sym}:vs-peer", shape=shape, dtype="bf16",
                           ours=best / 1e3, baseline=peer / 1e3, baseline_name=PEER, unit="ms", gpu=gpu,
                           goal="<= 1.0x peer time (bit-identical kernels)", met=bool(same and best <= peer)))
    return recs


def prefill(a, kernels) -> int:
    """The tiled conv over whole prompts from a zero state against causal_conv1d_fn, GPU time in CUDA graphs."""
    import torch
    from summary import append, record

    fn_peer, why = peer_conv("causal_conv1d_fn")
    bf, gpu, w = torch.bfloat16, torch.cuda.get_device_name(), 4
    shapes = [(1, 64)] if a.smoke else list(PREFILL_SHAPES)
    dims = [256] if a.smoke else [int(x) for x in a.dims.split(",")]
    reps = 3 if a.smoke else a.reps
    fn = kernels.fn(FAMILIES[0], "bf16")
    records = []
    for d in dims:
        for b, L in shapes:
            g = torch.Generator(device="cuda").manual_seed(b * L + d)
            xz = (torch.rand(b, L, 2 * d, generator=g, device="cuda") * 4 - 2).to(bf)
            weight = torch.rand(d, w, generator=g, device="cuda") * 2 - 1
            bias = torch.rand(d, generator=g, device="cuda") * 2 - 1
            st = torch.zeros(b, d, w - 1, dtype=bf, device="cuda")
            out = torch.empty(b, L, d, dtype=bf, device="cuda")

            def ours(st=st, out=out, xz=xz, weight=weight, bias=bias, b=b, d=d, L=L):
                st.zero_()  # a prompt starts from a zero state: the zeroing is timed with the conv
                fn(out=out, conv_state=st, xz=xz, weight=weight, bias=bias, batch=b, d=d, L=L, width=w)

            t_ours = graph_us(ours, reps, inner=5)
            t_peer = None
            if fn_peer is not None:
                x = xz[..., :d].transpose(1, 2).contiguous()  # the peer's layout [b, d, L]
                wb, bb = weight.to(bf), bias.to(bf)
                t_peer = graph_us(lambda x=x, wb=wb, bb=bb: fn_peer(x, wb, bb, activation="silu"), reps, inner=5)
            peer_txt = f"{t_peer:.1f} us ({t_peer / t_ours:.2f}x)" if t_peer else f"n/a ({why})"
            print(f"prefill conv d {d} b{b} L{L}: ours {t_ours:.1f} us, peer {peer_txt}", flush=True)
            if not a.smoke and t_peer is not None:
                records.append(record(family="conv1d_tokens_silu", symbol="conv1d_tokens_silu_bf16",
                                      shape=f"b{b} d{d} L{L} w{w}", dtype="bf16", ours=t_ours / 1e3,
                                      baseline=t_peer / 1e3, baseline_name=PEER_PREFILL, unit="ms", gpu=gpu,
                                      goal="<= 1.0x peer time", met=t_ours <= t_peer))
    if records:
        append(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
