"""The output checks of the bandwidth benchmarks (benchmarks/bench_memory_bound.py check_output / output_check, used by
bench_conv1d.py too, and bench_conv_optim.py multi_check), on CPU: fake kernels on CPU torch tensors, the catalog's
own families and float64 references. A right kernel passes; a wrong one, one that leaves its (poisoned) output
unwritten, and one whose output buffer held the right answer before the launch but writes nothing all fail; a
failed check makes the summary record not met (the record keeps summary.FIELDS)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_conv_optim  # noqa: E402
import bench_memory_bound as bm  # noqa: E402
import summary  # noqa: E402

torch = pytest.importorskip("torch")

GPU = "NVIDIA H200"


@pytest.fixture(scope="module")
def fixed():
    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    return load_catalog(default_catalog_path()).module("Fixed")


class FakeKernel:
    """A runtime Kernel's face as check_output sees it: param_specs, dtype, a keyword call (here: `body`)."""

    def __init__(self, specs: list[tuple[str, str, str]], body, dtype: str = "f32"):
        self.param_specs = [SimpleNamespace(name=n, kind="pointer", role=r, dtype=d) for n, r, d in specs]
        self.dtype, self.body, self.calls = dtype, body, 0

    def __call__(self, **kwargs):
        self.calls += 1
        self.body(**kwargs)


MUL_SPECS = [("c", "out", "f32"), ("a", "in", "f32"), ("b", "in", "f32")]


def mul_kwargs(n: int = 1000) -> dict:
    g = torch.Generator().manual_seed(0)
    return {"c": torch.empty(n), "a": torch.rand(n, generator=g) * 8 - 4, "b": torch.rand(n, generator=g) * 8 - 4,
            "n": n}


def right_mul(c, a, b, n):
    c.copy_(a * b)


def test_a_right_kernel_passes(fixed):
    kern = FakeKernel(MUL_SPECS, right_mul)
    ok, what = bm.check_output(kern, fixed.family("elementwise_mul_v"), mul_kwargs(), {"n": 1000})
    assert ok, what
    assert kern.calls == 1 and "c:" in what


@pytest.mark.parametrize("body, says", [
    (lambda c, a, b, n: c.copy_(a * b * (1 + 1e-3)), "outside rtol"),  # off by 0.1 %: f32's tolerance is 1e-5
    (lambda c, a, b, n: c.copy_(a + b), "outside rtol"),
    (lambda c, a, b, n: c[: n // 2].copy_((a * b)[: n // 2]), "NaN mismatch"),  # half left as poisoned
])
def test_a_wrong_kernel_is_reported(fixed, body, says):
    ok, what = bm.check_output(FakeKernel(MUL_SPECS, body), fixed.family("elementwise_mul_v"), mul_kwargs(),
                               {"n": 1000})
    assert not ok and what.startswith("c: ") and says in what, what


def test_the_output_is_poisoned_before_the_launch(fixed):
    """A kernel that writes nothing fails even where its output buffer already held the right values."""
    kw = mul_kwargs()
    kw["c"].copy_(kw["a"] * kw["b"])
    ok, what = bm.check_output(FakeKernel(MUL_SPECS, lambda **_: None), fixed.family("elementwise_mul_v"), kw,
                               {"n": 1000})
    assert not ok and "NaN mismatch" in what


def test_inout_buffers_are_checked_against_their_values_before_the_launch(fixed):
    specs = [("residual", "inout", "f32"), ("x", "in", "f32")]
    n = 257
    kw = {"residual": torch.rand(n) * 8 - 4, "x": torch.rand(n) * 8 - 4, "n": n}
    good = bm.check_output(FakeKernel(specs, lambda residual, x, n: residual.add_(x)), fixed.family("residual_add"),
                           {k: (v.clone() if torch.is_tensor(v) else v) for k, v in kw.items()}, {"n": n})
    twice = bm.check_output(FakeKernel(specs, lambda residual, x, n: residual.add_(2 * x)),
                            fixed.family("residual_add"), kw, {"n": n})
    assert good[0], good[1]
    assert not twice[0] and twice[1].startswith("residual: ")


def test_the_conv1d_forward_against_references_conv1d(fixed):
    """The tiled forward's reference (mamba_forge/references/conv1d.py) at bf16's tolerance: the kernels' own walk
    passes; the taps reversed fail."""
    from mamba_forge.references.conv1d import conv1d_pre_kernel_walk, silu

    b, d, L, w = 2, 8, 64, 4
    specs = [("out", "out", "bf16"), ("pre", "out", "bf16"), ("x", "in", "bf16"), ("weight", "in", "f32"),
             ("bias", "in", "f32")]

    def conv(flip):
        def body(out, pre, x, weight, bias, batch, d, L, width):
            wt = weight.numpy().reshape(d, width)
            p = conv1d_pre_kernel_walk(x.float().numpy().reshape(batch, d, L), wt[:, ::-1] if flip else wt,
                                       bias.numpy(), width)
            pre.copy_(torch.from_numpy(p.ravel()))
            out.copy_(torch.from_numpy(silu(p.astype(np.float64)).ravel()))
        return body

    def kwargs():
        g = torch.Generator().manual_seed(1)
        return {"out": torch.empty(b * d * L, dtype=torch.bfloat16), "pre": torch.empty(b * d * L, dtype=torch.bfloat16),
                "x": (torch.rand(b * d * L, generator=g) * 4 - 2).to(torch.bfloat16),
                "weight": torch.rand(d * w, generator=g) * 2 - 1, "bias": torch.rand(d, generator=g) * 2 - 1,
                "batch": b, "d": d, "L": L, "width": w}

    dims = {"batch": b, "d": d, "L": L, "width": w}
    fam = fixed.family("conv1d_burnin_forward_tiled")
    ok, what = bm.check_output(FakeKernel(specs, conv(False), "bf16"), fam, kwargs(), dims)
    assert ok, what
    ok, what = bm.check_output(FakeKernel(specs, conv(True), "bf16"), fam, kwargs(), dims)
    assert not ok and what.split(":")[0] in ("out", "pre"), what


def test_output_check_exact_family_and_reference_names(fixed):
    cast = fixed.family("cast")  # exact: the reference rounded to bf16, bit for bit
    ref = {"out": np.array([1.0 / 3.0, 2.5])}
    rounded = ref["out"].astype(np.float32).astype(np.float64)  # not bf16's rounding
    assert not bm.output_check(cast.qualify, {"out": "bf16"}, {"out": rounded}, ref)[0]
    import ml_dtypes

    as_bf16 = ref["out"].astype(ml_dtypes.bfloat16).astype(np.float64)
    assert bm.output_check(cast.qualify, {"out": "bf16"}, {"out": as_bf16}, ref)[0]
    ok, what = bm.output_check(cast.qualify, {"out": "bf16"}, {"out": as_bf16}, {"y": ref["out"]})
    assert not ok and "reference returns" in what


def test_big_outputs_are_compared_in_chunks(fixed, monkeypatch):
    """compare_chunked: chunks on threads, the same verdicts as one compare; the failing chunk is named."""
    monkeypatch.setattr(bm, "CHECK_CHUNK", 100)
    q = fixed.family("elementwise_mul_v").qualify
    ref = np.random.default_rng(3).uniform(-4, 4, 1050)
    got = ref.astype(np.float32).astype(np.float64)
    ok, what = bm.output_check(q, {"c": "f32"}, {"c": got}, {"c": ref})
    assert ok and what == "c: 1050 elements within rtol 1e-05 atol 1e-06", what
    got[1049] = np.nan  # the last, partial chunk
    ok, what = bm.output_check(q, {"c": "f32"}, {"c": got}, {"c": ref})
    assert not ok and what.startswith("c: in the 100 elements from 1000 (of 1050): NaN mismatch at 49"), what
    got[1049], got[250] = ref[1049], ref[250] * 1.001
    ok, what = bm.output_check(q, {"c": "f32"}, {"c": got}, {"c": ref})
    assert not ok and "from 200 " in what and "outside rtol" in what, what
    ok, what = bm.output_check(q, {"c": "f32"}, {"c": got[:-1]}, {"c": ref})
    assert not ok and "1050 elements" in what


def test_a_family_without_a_reference_is_not_ok():
    fam = SimpleNamespace(name="nameless", qualify=SimpleNamespace(reference=None))
    kern = FakeKernel(MUL_SPECS, right_mul)
    ok, what = bm.check_output(kern, fam, mul_kwargs(), {"n": 1000})
    assert not ok and "no reference" in what and kern.calls == 0


def test_multi_tensor_adamw_check(fixed, monkeypatch):
    """bench_conv_optim.multi_check: every tensor against references/optim.py adamw with its own weight decay; a
    kernel that skips one tensor, or applies another weight decay, fails naming the tensor."""
    from mamba_forge.references.optim import adamw

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    scal = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "step": 10, "num_tensors": 3}
    decays = [0.0, 0.1, 0.1]

    def tensors():
        g = torch.Generator().manual_seed(2)
        return [(torch.rand(s, generator=g) * 2 - 1, torch.rand(s, generator=g) * 2 - 1,
                 torch.rand(s, generator=g) * 0.2 - 0.1, torch.rand(s, generator=g) * 0.01 + 1e-6)
                for s in (33, 100, 7)]

    def body(keep, skip=None, wd=None):
        def run(**kw):
            for j, (p, g, m, v) in enumerate(keep):
                if j == skip:
                    continue
                new = adamw(p.numpy(), g.numpy(), m.numpy(), v.numpy(), lr=kw["lr"], beta1=kw["beta1"],
                            beta2=kw["beta2"], eps=kw["eps"], weight_decay=decays[j] if wd is None else wd,
                            step=kw["step"])
                for t, x in zip((p, m, v), new, strict=True):
                    t.copy_(torch.from_numpy(x.astype(np.float32)))
        return run

    fam = fixed.family("adamw_step_multi")
    keep = tensors()
    assert bench_conv_optim.multi_check(FakeKernel([], body(keep), "f32"), fam, scal, keep, decays) == \
        (True, "3 tensors within tolerance")
    keep = tensors()
    ok, what = bench_conv_optim.multi_check(FakeKernel([], body(keep, skip=1), "f32"), fam, scal, keep, decays)
    assert not ok and what.startswith("tensor 1 of 3"), what
    keep = tensors()
    ok, what = bench_conv_optim.multi_check(FakeKernel([], body(keep, wd=0.1), "f32"), fam, scal, keep, decays)
    assert not ok and what.startswith("tensor 0 of 3") and "param" in what, what


def bw_row(kernel, family, dtype, shape, ratio):
    t, moved = 100e-6, 256e6
    return {"kernel": kernel, "shape": shape, "us": t * 1e6, "gbs": moved / t / 1e9, "copy_gbs": moved / (ratio * t) / 1e9,
            "ratio": ratio, "family": family, "dtype": dtype, "peer": None, "bytes": int(moved), "ok": True, "check": ""}


@pytest.mark.parametrize("module, kernel, family", [
    (bm, "rmsnorm_forward", "rmsnorm_forward"),
    (bench_conv_optim, "conv1d_bwd_tiled_f16", "conv1d_bwd_tiled"),
    (bench_conv_optim, "grad_sumsq_partial_f32", "grad_sumsq_partial"),
])
def test_a_wrong_output_is_recorded_not_met(module, kernel, family):
    """A fast kernel (ratio 1.5, every goal met) whose output check failed: its record is not met, the other's is;
    both keep exactly summary.FIELDS."""
    rows = [bw_row(kernel, family, "f32", "n=1", 1.5), bw_row(kernel, family, "f32", "n=2", 1.5)]
    good, bad = module.summary_records(rows, GPU, {(kernel, "n=2")})
    assert good["met"] is True and bad["met"] is False
    assert good["speedup"] == bad["speedup"] == 1.5
    for r in (good, bad):
        assert set(r) == set(summary.FIELDS)
