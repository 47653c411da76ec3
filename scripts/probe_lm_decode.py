"""Where a language-model decode step's GPU time goes (a dev probe, nothing recorded): MambaLMHeadModel's captured
decode step (generate(cg=True)'s graph) replayed alone, and its head GEMM (N = 50280, K = d_model, M = batch)
through kernels.gemm against cuBLAS (torch.matmul), each in CUDA graphs, at three published widths.

    python scripts/probe_lm_decode.py --bundle h200.tar.gz --key manifests/keys
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

WIDTHS = ((768, 24), (2048, 48), (2560, 64))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--key", required=True)
    a = p.parse_args(argv)
    import torch
    from common import register_signed
    from timing import capture_graph, median_ms

    import mamba_forge.runtime.torch as mft

    kernels = register_signed(a.bundle, a.key)
    for d_model, n_layer in WIDTHS:
        torch.manual_seed(0)
        m = mft.MambaLMHeadModel(mft.MambaConfig(d_model=d_model, n_layer=n_layer), device="cuda",
                                 dtype=torch.bfloat16).eval()
        for b in (1, 16):
            with torch.inference_mode():
                m.generate(torch.randint(0, 50277, (b, 8), device="cuda"), 10, cg=True)
                step = median_ms(m._graphs[b].graph.replay, 50)
                W = m._head_weight_t()
                h = torch.randn(b, d_model, device="cuda", dtype=torch.bfloat16)
                C = torch.empty(b, W.shape[1], device="cuda", dtype=torch.bfloat16)
                ours = capture_graph(lambda h=h, W=W, C=C: kernels.gemm(h, W, C), 10)
                cublas = capture_graph(lambda h=h, W=W, C=C: torch.matmul(h, W, out=C), 10)
                t_o, t_c = median_ms(ours.replay, 30) / 10, median_ms(cublas.replay, 30) / 10
                t_n, t_pn = _norms(torch, b, d_model, capture_graph, median_ms)
            rung = kernels.gemm_route(b, W.shape[1], d_model, "bf16").symbol
            print(f"d{d_model} x{n_layer} batch{b}: decode step {step * 1e3:8.1f} us; head {t_o * 1e3:6.1f} us against "
                  f"cuBLAS {t_c * 1e3:6.1f} us ({t_c / t_o:.2f}x, {rung}); the rest {(step - t_o) * 1e3:8.1f} us "
                  f"({(step - t_o) * 1e3 / n_layer:.1f} a layer); add + RMSNorm {t_n * 1e3:.2f} us, the peer's "
                  f"Triton layer_norm_fn " + (f"{t_pn * 1e3:.2f} us" if t_pn else "not importable"), flush=True)
        m = None
        torch.cuda.empty_cache()
    return 0


def _norms(torch, b, d_model, capture_graph, median_ms):
    """(ours, peer's) ms of a Block's fused add + RMSNorm on [b, d_model] in CUDA graphs (10 calls a replay): ours
    mamba_forge::rms_norm_add on the float32 weight, the peer's mamba-ssm Triton layer_norm_fn(prenorm=True,
    residual_in_fp32=True, is_rms_norm=True) on the bf16 weight as its Block calls it (None where not importable)."""
    h = torch.randn(b, 1, d_model, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(b, 1, d_model, device="cuda", dtype=torch.float32)
    w = torch.rand(d_model, device="cuda", dtype=torch.bfloat16) + 0.5
    w32 = w.float()
    g = capture_graph(lambda: torch.ops.mamba_forge.rms_norm_add(h, res, w32, 1e-5), 10)
    ours = median_ms(g.replay, 30) / 10
    try:
        from mamba_ssm.ops.triton.layer_norm import layer_norm_fn
    except Exception:  # noqa: BLE001  (the peer absent or not loadable here: ours alone)
        return ours, None
    gp = capture_graph(lambda: layer_norm_fn(h, w, None, residual=res, prenorm=True, residual_in_fp32=True, eps=1e-5,
                                             is_rms_norm=True), 10)
    return ours, median_ms(gp.replay, 30) / 10


if __name__ == "__main__":
    sys.exit(main())
