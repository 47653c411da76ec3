"""The runtime loader on a real GPU: a bundle built and qualified here (the Fixed and TriadSm90a modules), or given
by MF_RUNTIME_BUNDLE and MF_RUNTIME_KEY, loaded with load(); kernels launched through the keyword API on torch
tensors and compared with the float64 references; refusals leave the context usable; streams order with torch;
the torch custom ops under torch.compile and CUDA-graph capture.

    python -m pytest -q tests/gpu/test_runtime_gpu.py            # builds + qualifies Fixed and TriadSm90a first
    MF_RUNTIME_BUNDLE=dist/h200.tar.gz MF_RUNTIME_KEY=manifests/keys python -m pytest -q tests/gpu/test_runtime_gpu.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

N = 1_000_003  # not a multiple of any vector width: the scalar tail runs too
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path]:
    """(bundle, public key): from the environment, else build and qualify Fixed and TriadSm90a on this GPU now."""
    if os.environ.get("MF_RUNTIME_BUNDLE"):
        return Path(os.environ["MF_RUNTIME_BUNDLE"]), Path(os.environ["MF_RUNTIME_KEY"])
    from mamba_forge.manifest.bundle import write_bundle
    from mamba_forge.runtime import signing
    from mamba_forge.runtime.trust import trusted_keys

    root = tmp_path_factory.mktemp("runtime-gpu")
    build = root / "build"
    subprocess.run([sys.executable, "-m", "mamba_forge.cli", "build", "--arch", "sm_90a", "--out", str(build), "-q"],
                   check=True, timeout=900)
    priv, pub, _ = signing.write_keypair(root / "keys", "gpu-test")
    res = subprocess.run(
        [sys.executable, "-m", "mamba_forge.cli", "qualify", "--build", str(build), "--module", "Fixed",
         "--module", "TriadSm90a", "--level", "quick", "--sign-key", str(priv), "--out", str(root / "h200.toml"), "-q"],
        capture_output=True, text=True, timeout=1800,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    out = write_bundle(root / "h200.toml", root / "h200.tar.gz", keys=trusted_keys([pub], defaults=False), build=build)
    return out, pub


@pytest.fixture(scope="module")
def kernels(bundle):
    from mamba_forge.runtime import load

    path, key = bundle
    return load(path, trusted_keys=[key])


def _np(t) -> np.ndarray:
    return t.double().cpu().numpy().ravel()


def _rand(shape, lo, hi, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(shape, dtype=torch.float64, device="cuda", generator=g) * (hi - lo) + lo).to(dtype)


def test_readme_example_runs_as_written(bundle, tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"Loading qualified kernels.*?```python\n(.*?)```", text, re.S).group(1)
    path, key = bundle
    trust = tmp_path / "trust"
    if key.is_dir():
        shutil.copytree(key, trust)
    else:
        trust.mkdir()
        shutil.copy(key, trust / key.name)
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(trust))
    if path.is_file():
        shutil.copy(path, tmp_path / "h200.tar.gz")
    else:
        shutil.copytree(path, tmp_path / "h200.tar.gz")
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)  # noqa: S102 - the README's own example
    torch.cuda.synchronize()
    assert ns["y"].shape == ns["x"].shape and torch.isfinite(ns["y"]).all()


@pytest.mark.parametrize(("dtype", "rtol", "atol"), [("f32", 2e-6, 1e-30), ("bf16", 8e-3, 1e-30), ("f16", 1e-3, 1e-7)])
def test_softplus_keyword_matches_the_reference(kernels, dtype, rtol, atol):
    from mamba_forge.references.activation import softplus_forward
    from mamba_forge.runtime import launch

    tdt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    x = _rand(N, -30, 30, tdt, 7)
    y = torch.full((N,), float("nan"), dtype=tdt, device="cuda")
    f = getattr(kernels.softplus_forward, dtype)
    assert f.name == f"softplus_forward_{dtype}", kernels.summary()
    f(y=y, x=x)  # n and the grid from the contract, torch's current stream
    ref = softplus_forward({"x": _np(x)}, {"n": N})["y"]
    got = _np(y)
    assert np.isfinite(got).all(), "unwritten (NaN) elements remain"
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
    # the positional path (y as a raw address) writes the same bytes
    y2 = torch.full_like(y, float("nan"))
    launch(f, f.contract.bind({"y": y, "x": x}).grid, f.block, (y2.data_ptr(), x, N))
    bits = torch.int32 if dtype == "f32" else torch.int16
    assert torch.equal(y.view(bits), y2.view(bits))


def test_rmsnorm_f32in_bf16_matches_the_reference(kernels):
    from mamba_forge.references.norm import rmsnorm_forward

    rows, dim = 257, 2560
    x = _rand((rows, dim), -2, 2, torch.float32, 1)
    w = _rand(dim, 0.5, 1.5, torch.float32, 2)
    y = torch.empty((rows, dim), dtype=torch.bfloat16, device="cuda")
    rstd = torch.empty(rows, dtype=torch.float32, device="cuda")
    kernels.rmsnorm_forward_f32in.bf16(y=y, rstd=rstd, x=x, w=w, eps=1e-5)  # rows, dim from rstd and w
    ref = rmsnorm_forward({"x": _np(x), "w": _np(w), "rows": rows, "dim": dim, "eps": 1e-5}, {})
    np.testing.assert_allclose(_np(rstd), ref["rstd"], rtol=1e-5)
    np.testing.assert_allclose(_np(y), ref["y"], rtol=8e-3, atol=1e-6)


def test_conv1d_forward_matches_the_reference(kernels):
    from mamba_forge.references.conv1d import forward_nosave_tiled

    batch, d, L, width = 2, 256, 1000, 4
    x = _rand((batch, d, L), -2, 2, torch.bfloat16, 3)
    weight, bias = _rand((d, width), -1, 1, torch.float32, 4), _rand(d, -1, 1, torch.float32, 5)
    out = torch.empty_like(x)
    kernels.conv1d_burnin_forward_nosave_tiled.bf16(out=out, x=x, weight=weight, bias=bias, batch=batch, L=L,
                                                    width=width)  # d from bias
    ref = forward_nosave_tiled({"x": _np(x), "weight": _np(weight), "bias": _np(bias), "batch": batch, "d": d,
                                "L": L, "width": width}, {})["out"]
    np.testing.assert_allclose(_np(out), ref, rtol=1e-2, atol=1e-2)


def test_scan_forward_matches_the_reference(kernels):
    from mamba_forge.references.scan import ssm_burnin_forward_nosave

    b, d, n, L = 2, 64, 16, 301
    f32 = torch.float32
    a = {"u": _rand((b, d, L), -1, 1, f32, 10), "delta": _rand((b, d, L), -4, 0, f32, 11),
         "A_log": _rand((d, n), -1, 1.5, f32, 12), "Bm": _rand((b, n, L), -1, 1, f32, 13),
         "Cm": _rand((b, n, L), -1, 1, f32, 14), "Dp": _rand(d, -1, 1, f32, 15), "z": _rand((b, d, L), -3, 3, f32, 16),
         "delta_bias": _rand(d, -1, 1, f32, 17)}
    state = _rand((b, d, n), -1, 1, f32, 18)
    ref = ssm_burnin_forward_nosave({**{k: _np(v) for k, v in a.items()}, "state": _np(state), "delta_softplus": 1},
                                    {"batch": b, "d_inner": d, "d_state": n, "L": L})
    out = torch.empty((b, d, L), dtype=f32, device="cuda")
    kernels.ssm_burnin_forward_nosave.f32(out=out, state=state, **a, batch=b, d_state=n, L=L, delta_softplus=1)
    np.testing.assert_allclose(_np(out), ref["out"], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(_np(state), ref["state"], rtol=1e-3, atol=1e-4)


def test_wgmma_gemm_with_caller_built_tensor_maps(kernels):
    from mamba_forge.gpu.tma import gemm_tensor_maps
    from mamba_forge.references.gemm import gemm_nn

    M, N_, K = 523, 392, 328
    A, B = _rand((M, K), -1, 1, torch.bfloat16, 20), _rand((K, N_), -1, 1, torch.bfloat16, 21)
    C = torch.empty((M, N_), dtype=torch.bfloat16, device="cuda")
    maps = gemm_tensor_maps("nn", A.data_ptr(), B.data_ptr(), M, N_, K)  # {"tmA": bytes, "tmB": bytes}
    kernels.fn("gemm_bi_nn_sm90a_wgmma_wg1", "bf16")(C=C, A=A, B=B, M=M, N=N_, K=K, **maps)
    ref = gemm_nn({"A": _np(A), "B": _np(B), "M": M, "N": N_, "K": K}, {})["C"]
    np.testing.assert_allclose(_np(C), ref, rtol=8e-3, atol=2e-2)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_kernels_gemm_routes_by_m_and_rows_do_not_depend_on_m(kernels, dtype):
    """kernels.gemm: the route's rung at each M (skinny rungs at small M, their class's other rungs above), its
    tensor maps built as qualified, bias None (null) and a bias; every M's rows are bitwise the M = 1000 rows."""
    from mamba_forge.references.gemm import gemm_nn

    tdt = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    N_, K = 392, 328
    A, B = _rand((1000, K), -1, 1, tdt, 30), _rand((K, N_), -1, 1, tdt, 31)
    bias = _rand((N_,), -1, 1, tdt, 32) if dtype == "f32" else None
    full = kernels.gemm(A, B, bias=bias)
    ref = gemm_nn({"A": _np(A), "B": _np(B), "M": 1000, "N": N_, "K": K}, {})["C"]
    if bias is not None:
        ref = ref + np.tile(_np(bias), 1000)
    np.testing.assert_allclose(_np(full), ref, rtol=8e-3 if dtype == "bf16" else 1e-5, atol=2e-2 if dtype == "bf16" else 1e-4)
    view = torch.int16 if dtype == "bf16" else torch.int32
    served = set()
    for m in (1, 3, 17, 64, 256):
        out = torch.full((m, N_), float("nan"), dtype=tdt, device="cuda")
        assert kernels.gemm(A[:m], B, out, bias=bias) is out
        served.add(kernels.gemm_route(m, N_, K, dtype, bias=bias is not None).symbol)
        assert torch.equal(out.view(view), full[:m].view(view)), f"{dtype} M={m}: rows differ from M=1000's"
    assert len(served) >= 2, served  # more than one rung served: the check compared rungs, not one rung with itself


def test_a_float_for_an_int_is_refused_and_the_context_stays_usable(kernels):
    from mamba_forge.runtime import LaunchRefused, launch

    f = kernels.softplus_forward.f32
    x, y = torch.linspace(-3, 3, 4096, device="cuda"), torch.zeros(4096, device="cuda")
    with pytest.raises(LaunchRefused, match="n of softplus_forward_f32 is a float"):
        f(y=y, x=x, n=4096.0)
    with pytest.raises(LaunchRefused, match=r"argument 2 \(n\) of softplus_forward_f32 is a float"):
        launch(f, (2,), f.block, (y, x, 4096.0))
    with pytest.raises(LaunchRefused, match="lives in cpu memory"):
        f(y=y, x=torch.zeros(4096))
    with pytest.raises(LaunchRefused, match="dynamic shared memory"):
        launch(f, (1,), f.block, (y, x, 4096), shared_mem=4096)
    f(y=y, x=x)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.nn.functional.softplus(x), rtol=1e-5, atol=1e-6)


def test_side_stream_orders_with_torch_work(kernels):
    f = kernels.softplus_forward.f32
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # the default: torch's current stream, here s
        x = torch.randn(1 << 24, device="cuda") * 4  # a long producer on s just before the launch
        y = torch.empty_like(x)
        f(y=y, x=x)
        z = y * 2
    s.synchronize()
    torch.testing.assert_close(z, 2 * torch.nn.functional.softplus(x), rtol=1e-5, atol=1e-6)
    x2 = torch.empty(1 << 22, device="cuda")
    with torch.cuda.stream(s):
        x2.copy_(torch.linspace(-5, 5, 1 << 22, device="cuda"))
    y2 = torch.empty_like(x2)
    f(y=y2, x=x2, stream=s)  # explicit: ordered after the copy on s, not on the current (default) stream
    s.synchronize()
    torch.testing.assert_close(y2, torch.nn.functional.softplus(x2), rtol=1e-5, atol=1e-6)


def test_torch_ops_compile_and_capture(kernels):
    import mamba_forge.runtime.torch as mft
    from mamba_forge.runtime.torch_ops import SCHEMAS, TRAIN_SCHEMAS

    names = mft.register(kernels)
    assert names[:5] == ["mamba_forge::softplus_forward", "mamba_forge::rms_norm",
                         "mamba_forge::causal_conv1d", "mamba_forge::selective_scan", "mamba_forge::gemm"]
    assert sorted(names) == sorted(f"mamba_forge::{n}" for n in (*SCHEMAS, *TRAIN_SCHEMAS))
    x = torch.randn(3, 4096, device="cuda")
    torch.testing.assert_close(torch.ops.mamba_forge.softplus_forward(x), torch.nn.functional.softplus(x),
                               rtol=1e-5, atol=1e-6)
    w = torch.rand(4096, device="cuda") + 0.5
    y, rstd = torch.ops.mamba_forge.rms_norm(x, w, 1e-5, torch.bfloat16)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    assert y.dtype == torch.bfloat16 and rstd.shape == (3,)
    torch.testing.assert_close(y.float(), want, rtol=8e-3, atol=1e-5)
    compiled = torch.compile(lambda t: torch.ops.mamba_forge.softplus_forward(t) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(x), 2 * torch.nn.functional.softplus(x), rtol=1e-5, atol=1e-6)
    static_x = torch.zeros(1 << 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.mamba_forge.softplus_forward(static_x)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = torch.ops.mamba_forge.softplus_forward(static_x)
    static_x.copy_(torch.linspace(-8, 8, 1 << 16, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_y, torch.nn.functional.softplus(static_x), rtol=1e-5, atol=1e-6)


def test_torch_gemm_op_is_kernels_gemm_under_compile_and_capture(kernels):
    """mamba_forge::gemm: the bits of kernels.gemm (the route's rung), eager, under torch.compile (fake impl gives
    the shape) and replayed from a CUDA graph (register() loaded every rung first)."""
    import mamba_forge.runtime.torch as mft

    mft.register(kernels)
    A, B = _rand((17, 328), -1, 1, torch.bfloat16, 40), _rand((328, 392), -1, 1, torch.bfloat16, 41)
    want = kernels.gemm(A, B)
    got = torch.ops.mamba_forge.gemm(A, B)
    assert got.shape == (17, 392) and torch.equal(got.view(torch.int16), want.view(torch.int16))
    compiled = torch.compile(lambda a, b: torch.ops.mamba_forge.gemm(a, b) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(A, B), want * 2)
    static_a = torch.zeros_like(A)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.mamba_forge.gemm(static_a, B)  # warm-up outside the capture (route and tensor maps cached)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_c = torch.ops.mamba_forge.gemm(static_a, B)
    static_a.copy_(A)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_c.view(torch.int16), want.view(torch.int16))
    with pytest.raises(Exception, match="K differs"):
        torch.ops.mamba_forge.gemm(A, B[:-8])


def test_torch_sequence_ops_match_the_references(kernels):
    """causal_conv1d and selective_scan as torch ops (outputs allocated by the op) against the float64
    references; a wrong shape is refused before any launch."""
    import mamba_forge.runtime.torch as mft
    from mamba_forge.references.conv1d import forward_nosave_tiled
    from mamba_forge.references.scan import ssm_parallel_scan_fwd_nosave

    mft.register(kernels)
    batch, d, L, width = 2, 128, 777, 4
    x = _rand((batch, d, L), -2, 2, torch.bfloat16, 21)
    weight, bias = _rand((d, width), -1, 1, torch.float32, 22), _rand(d, -1, 1, torch.float32, 23)
    out = torch.ops.mamba_forge.causal_conv1d(x, weight, bias)
    ref = forward_nosave_tiled({"x": _np(x), "weight": _np(weight), "bias": _np(bias), "batch": batch, "d": d,
                                "L": L, "width": width}, {})["out"]
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    np.testing.assert_allclose(_np(out), ref, rtol=1e-2, atol=1e-2)
    n = 16
    f32 = torch.float32
    a = {"u": _rand((batch, d, L), -1, 1, f32, 24), "delta": _rand((batch, d, L), -4, 0, f32, 25),
         "A_log": _rand((d, n), -1, 1.5, f32, 26), "Bm": _rand((batch, n, L), -1, 1, f32, 27),
         "Cm": _rand((batch, n, L), -1, 1, f32, 28), "Dp": _rand(d, -1, 1, f32, 29),
         "z": _rand((batch, d, L), -3, 3, f32, 30), "delta_bias": _rand(d, -1, 1, f32, 31)}
    y, last = torch.ops.mamba_forge.selective_scan(a["u"], a["delta"], a["A_log"], a["Bm"], a["Cm"], a["Dp"], a["z"],
                                                   a["delta_bias"])
    want = ssm_parallel_scan_fwd_nosave({**{k: _np(v) for k, v in a.items()}, "delta_softplus": 1},
                                        {"batch": batch, "d_inner": d, "d_state": n, "L": L})
    np.testing.assert_allclose(_np(y), want["out"], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(_np(last), want["last_state"], rtol=1e-3, atol=1e-4)
    from mamba_forge.runtime import LaunchRefused

    with pytest.raises((LaunchRefused, RuntimeError), match="B is"):  # torch may wrap an op's exception
        torch.ops.mamba_forge.selective_scan(a["u"], a["delta"], a["A_log"], a["Bm"][:, :, :-1], a["Cm"], a["Dp"],
                                             a["z"], a["delta_bias"])


def test_loaded_device_matches_torch(kernels):
    assert kernels.device.name == torch.cuda.get_device_name(0)
    major, minor = torch.cuda.get_device_capability(0)
    assert kernels.device.cc == (major, minor)


def test_every_admitted_symbol_loads_quickly(bundle):
    from mamba_forge.runtime import load

    path, key = bundle
    t0 = time.perf_counter()
    k = load(path, trusted_keys=[key])
    modules = k.load_all()
    seconds = time.perf_counter() - t0
    assert modules >= 1 and len(k.admitted()) >= 3
    assert seconds < 2.0, f"verify + load of {modules} modules took {seconds:.3f}s"


class SpyBackend:
    """Forwards launches (and everything else) to the real backend, recording whether each launch asked for
    programmatic dependent launch (`pdl`) and its (grid, that flag) (`launches`)."""

    def __init__(self, real):
        self.real, self.pdl, self.launches = real, [], []

    def launch(self, fn, grid, block, params, shared_mem, stream, pdl=False):
        self.pdl.append(pdl)
        self.launches.append((tuple(grid), pdl))
        self.real.launch(fn, grid, block, params, shared_mem, stream, pdl=pdl)

    def __getattr__(self, name):  # load() through it: device_info, load_module, ...
        return getattr(self.real, name)


def captured(fn):
    """A CUDA graph of fn(), captured after one warm-up run on a side stream (outside the capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def test_the_decode_step_under_programmatic_dependent_launch_equals_plain_launches(kernels):
    """ssm_step_forward_fused declares pdl_max_blocks (kernels/fixed/scan.toml): on sm_90+ a grid of at most that
    many blocks launches with programmatic dependent launch, so it may start before the kernel before it has
    finished and must wait (mf::pdl_wait) before it reads. Each of 24 steps here follows a torch kernel that writes
    its u and the step before it that wrote its state: eager and in a CUDA graph with PDL, the out of every step and
    the final state equal, bit for bit, the same steps launched plainly; a grid over the bound launches plainly."""
    import dataclasses

    fn = kernels.function("ssm_step_forward_fused_bf16")
    if torch.cuda.get_device_capability() < (9, 0):
        assert fn.pdl_max_blocks == 0
        pytest.skip("programmatic dependent launch needs sm_90+")
    assert fn.pdl_max_blocks == 2048
    bf, f32, dev = torch.bfloat16, torch.float32, "cuda"
    T, D, N, R = 24, 2048, 16, 64

    def run(kernel, batch, graph=False):
        g = torch.Generator(device=dev).manual_seed(batch)
        U = torch.randn(T, batch, D, device=dev, generator=g).to(bf)
        dt = (torch.rand(batch, D, device=dev, generator=g) * -4).to(bf)
        z = torch.randn(batch, D, device=dev, generator=g).to(bf)
        x_dbl = torch.randn(batch, R + 2 * N, device=dev, generator=g).to(bf)
        dt_bias, A_log = torch.rand(D, device=dev, generator=g), torch.rand(D, N, device=dev, generator=g)
        Dp = torch.randn(D, device=dev, generator=g)
        state0 = torch.randn(batch, D, N, device=dev, generator=g, dtype=f32)
        state, u = state0.clone(), torch.empty(batch, D, device=dev, dtype=bf)
        outs = torch.empty(T, batch, D, device=dev, dtype=bf)

        def steps():
            for i in range(T):
                u.copy_(U[i])  # a torch kernel right before the step writes what it reads
                kernel(out=outs[i], state=state, u=u, dt=dt, dt_bias=dt_bias, A_log=A_log, x_dbl=x_dbl, Dp=Dp, z=z,
                       batch=batch, d_inner=D, d_state=N, dt_rank=R, x_dbl_stride=R + 2 * N, z_pad=0)

        if graph:
            gr = captured(steps)
            state.copy_(state0)
            outs.fill_(float("nan"))
            gr.replay()
        else:
            steps()
        torch.cuda.synchronize()
        return outs.view(torch.int16).clone(), state.view(torch.int32).clone()

    spy = SpyBackend(fn.backend)
    with_pdl = dataclasses.replace(fn, backend=spy)
    plain = dataclasses.replace(fn, pdl_max_blocks=0)
    for batch in (1, 4, 32):  # 64 to 2048 blocks of 64 threads: every launch with PDL
        want = run(plain, batch)
        spy.pdl.clear()
        got = run(with_pdl, batch)
        assert spy.pdl and all(spy.pdl), spy.pdl[:4]
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"batch {batch}: eager PDL differs"
        graphed = run(with_pdl, batch, graph=True)
        assert torch.equal(graphed[0], want[0]) and torch.equal(graphed[1], want[1]), f"batch {batch}: graph differs"
    spy.pdl.clear()
    run(with_pdl, 64)  # 4096 blocks: over the bound, launched plainly
    assert spy.pdl and not any(spy.pdl)
