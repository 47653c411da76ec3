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
            rung = kernels.gemm_route(b, W.shape[1], d_model, "bf16").symbol
            print(f"d{d_model} x{n_layer} batch{b}: decode step {step * 1e3:8.1f} us; head {t_o * 1e3:6.1f} us against "
                  f"cuBLAS {t_c * 1e3:6.1f} us ({t_c / t_o:.2f}x, {rung}); the rest {(step - t_o) * 1e3:8.1f} us "
                  f"({(step - t_o) * 1e3 / n_layer:.1f} a layer)", flush=True)
        m = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
