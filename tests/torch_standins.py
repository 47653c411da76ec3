"""The kernels stood in for on CPU tensors (torch installed; a CPU build is enough), for tests/test_torch_layer.py
and tests/test_torch_autograd.py.

Every family the torch ops launch is served by a RefKernel: its keyword arguments first pass the family's real
launch contract (the catalog's record, runtime.contract, bound on fake device tensors of the same element counts,
dtypes and density), so a wrong name, a missing scalar, a short buffer or a wrong dtype fails here as it would on
the GPU; then the family's catalog reference (its `qualify.reference`, float64) computes the outputs, rounded into
the output tensors' dtypes. ssm_scan_tokens walks one timestep per reference call with the f32 state in between, as
the kernel does, so it is split-invariant like the kernel (chunked == whole, bit for bit). GEMMs are float64
products rounded to C's dtype, served for the layouts a RefKernels is told its routes serve.
"""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace

import numpy as np
import torch

from mamba_forge.runtime.contract import contract
from mamba_forge.runtime.errors import SymbolUnavailable
from mamba_forge.runtime.families import index_families
from mamba_forge.runtime.gemm import gemm_dims
from mamba_forge.runtime.routes import NoRoute
from mamba_forge.runtime.tensors import torch_dtype

F = torch.nn.functional


@functools.lru_cache(maxsize=1)
def catalog():
    """(record by symbol name, family -> dtype -> tile -> name, family -> reference function)."""
    from runtime_fakes import catalog_records

    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    records = {r.name: r for r, _ in catalog_records()}
    cat = load_catalog(default_catalog_path())
    refs = {}
    for cs in cat.symbols.values():
        ref = cat.module(cs.module).family(cs.family).qualify.reference
        if ref:
            refs[cs.family] = ref
    return records, index_families(records.values()), refs


def _resolve(ref: str):
    mod, _, fn = ref.partition(":")
    return getattr(importlib.import_module(mod), fn)


def _fake(t: torch.Tensor):
    from runtime_fakes import FakeTorchTensor

    return FakeTorchTensor(t.numel(), torch_dtype(t.dtype), contiguous=t.is_contiguous())


class RefKernel:
    """One symbol: contract-checked keyword call, computed by its family's float64 reference."""

    def __init__(self, record, reference, calls: list):
        self.name, self.family, self.symbol = record.name, record.family, record
        self._ref, self._calls = reference, calls

    def __call__(self, **kw):
        bound = contract(self.symbol).bind({k: _fake(v) if torch.is_tensor(v) else v for k, v in kw.items()}, 0,
                                           None, "")
        # the scalars as the contract bound them (derived ones too: rows and dim of a norm, n of a map)
        kw = {**{p.name: v for p, (_, v) in zip(self.symbol.params, bound.values, strict=True)
                 if p.kind == "scalar"}, **kw}
        for k, v in kw.items():
            assert not torch.is_tensor(v) or v.is_contiguous(), f"{self.name}: {k} is not dense"
        self._calls.append(self.name)
        if self.family in ("ssm_scan_tokens", "ssm_scan_tokens_ws", "ssm_scan_tokens_save"):
            self._steps(kw)
        else:
            self._run(kw)

    def _run(self, kw) -> None:
        args = {k: v.detach().double().numpy().ravel() if torch.is_tensor(v) else v for k, v in kw.items()}
        dims = {k: v for k, v in kw.items() if isinstance(v, int) and not isinstance(v, bool)}
        for name, value in self._ref(args, dims).items():
            t, v = kw[name], torch.from_numpy(np.asarray(value, dtype=np.float64).ravel())
            if v.numel() < t.numel():  # a flat view past what the launch touches (the kernel writes [0, count))
                t.view(-1)[:v.numel()].copy_(v)
            else:
                t.copy_(v.reshape(t.shape))

    def _steps(self, kw) -> None:
        b, length, d, n, r = (kw[k] for k in ("batch", "L", "d_inner", "d_state", "dt_rank"))
        rows = lambda k, c: kw[k].view(b, length, c)  # noqa: E731
        out = kw["out"].view(b, length, d)
        saved = kw.get("saved")  # ssm_scan_tokens_save: the state before every 256th step, as the kernel saves it
        nc = -(-length // 256)
        for t in range(length):
            s = slice(t, t + 1)
            if saved is not None:
                if t % 256 == 0:
                    saved.view(b, d, nc, n)[:, :, t // 256].copy_(kw["state"].view(b, d, n))
                kw = dict(kw, saved=torch.empty(b * d * n, dtype=saved.dtype))  # a one-step call's own save
            self._run(dict(kw, L=1, out=out[:, s], u=rows("u", d)[:, s], dt=rows("dt", d)[:, s],
                           x_dbl=rows("x_dbl", r + 2 * n)[:, s], xz=rows("xz", 2 * d)[:, s]))


class RefKernels:
    """A stand-in Kernels: fn() for every catalog family with a reference, less `missing` (family or symbol
    names); gemm_route/gemm for the layouts in `layouts` (none when no_route). `calls` records every launch
    (symbol names; ("gemm", layout, M, N, K) for GEMMs), `gemms` every GEMM's (A as given, C). strided_a: the nn
    rungs read A through tensor maps, so gemm takes a row-strided A under runtime/gemm.py's rules (else dense only)."""

    manifest = SimpleNamespace(routes=[])
    device = SimpleNamespace(name="stand-in", sm_count=132)  # an H200's: the ops' shape routes read it

    def __init__(self, missing=(), no_route: bool = False, layouts=("nn", "nt", "tn"), strided_a: bool = True):
        self.missing, self.no_route, self.layouts = set(missing), no_route, set(layouts)
        self.strided_a = strided_a
        self.calls: list = []
        self.gemms: list = []

    def fn(self, family, dtype=None, *, tile=None):
        records, families, refs = catalog()
        if family in self.missing or family not in families or family not in refs:
            raise SymbolUnavailable(family, f"{family}_{dtype} is not in this manifest")
        variants = families[family]
        if dtype is None:
            (dtype,) = variants
        name = variants[dtype][tile or ""]
        if name in self.missing:
            raise SymbolUnavailable(name, f"{name} is rejected on this device")
        return RefKernel(records[name], _resolve(refs[family]), self.calls)

    def _serves_name(self, name):
        return False

    def gemm_route(self, m, n, k, a, b=None, c=None, layout="nn", *, bias=False, symbol=None):
        if self.no_route or layout not in self.layouts:
            raise NoRoute(f"no admitted GEMM symbol serves {layout} {a}x{a}->{a} at N={n}, K={k}")
        return "ref"

    def gemm_reads_a_in_place(self, A, B, *, bias=None, layout="nn"):
        """Kernels.gemm_reads_a_in_place: dense, or (strided_a) rows dense with a row stride >= K whose bytes and
        address are multiples of 16, layout nn."""
        if A.is_contiguous():
            return True
        lda, step = A.stride()
        return (self.strided_a and layout == "nn" and step == 1 and lda >= A.shape[1]
                and lda * A.element_size() % 16 == 0 and A.data_ptr() % 16 == 0)

    def gemm(self, A, B, out=None, *, bias=None, layout="nn", **kw):
        if layout not in self.layouts:
            raise AssertionError(f"a {layout} GEMM was launched though no route serves {layout}")
        assert A.dtype == B.dtype and B.is_contiguous(), "operands the contract refuses"
        assert self.gemm_reads_a_in_place(A, B, bias=bias, layout=layout), "an A kernels.gemm refuses"
        m, n, k = gemm_dims(layout, tuple(A.shape), tuple(B.shape))
        self.calls.append(("gemm", layout, m, n, k))
        a = A.double().t() if layout == "tn" else A.double()
        bb = B.double().t() if layout == "nt" else B.double()
        c = a @ bb + (0 if bias is None else bias.double())
        c = c.to(A.dtype) if out is None else out.copy_(c)
        self.gemms.append((A, c))
        return c


def register_cpu(kernels=None):
    """mamba_forge.runtime.torch registered with `kernels` (a RefKernels by default), every op's implementation
    also dispatched for CPU tensors (and called directly by the differentiable ops' Autograd kernel, as on CUDA).
    Returns the module."""
    import mamba_forge.runtime.torch as mft

    mft.register(kernels if kernels is not None else RefKernels())
    mft.implement_for("CPU")
    return mft


# ---- mamba-ssm's reference path in float64 (differentiable) ---------------------------------------------------------

def reference_mamba(p: dict, h: torch.Tensor, d_conv: int, dt_rank: int, d_state: int) -> torch.Tensor:
    """mamba-ssm's slow path (mamba_simple.Mamba.forward without the fused kernels) in the dtype of `p` (float64
    leaves: torch autograd differentiates it): p maps the layer's parameter names to tensors (in_proj.bias,
    conv1d.bias, out_proj.bias where the layer has them), h [b, L, d_model]."""
    b, L, _ = h.shape
    d_inner = p["D"].shape[0]
    xz = h @ p["in_proj.weight"].T
    if "in_proj.bias" in p:
        xz = xz + p["in_proj.bias"]
    x, z = xz.transpose(1, 2).chunk(2, dim=1)  # b, D, L each
    x = F.silu(F.conv1d(x, p["conv1d.weight"], p.get("conv1d.bias"), padding=d_conv - 1, groups=d_inner)[..., :L])
    x_dbl = x.transpose(1, 2).reshape(b * L, -1) @ p["x_proj.weight"].T
    dt, B, C = torch.split(x_dbl, [dt_rank, d_state, d_state], dim=-1)
    dt = F.softplus((dt @ p["dt_proj.weight"].T + p["dt_proj.bias"]).reshape(b, L, -1).transpose(1, 2))
    B, C = B.reshape(b, L, -1).transpose(1, 2), C.reshape(b, L, -1).transpose(1, 2)
    A = -torch.exp(p["A_log"])
    hs = torch.zeros(b, d_inner, d_state, dtype=h.dtype, device=h.device)
    ys = []
    for t in range(L):
        hs = torch.exp(dt[:, :, t, None] * A) * hs + (dt[:, :, t] * x[:, :, t])[..., None] * B[:, None, :, t]
        ys.append((hs * C[:, None, :, t]).sum(-1))
    y = (torch.stack(ys, -1) + p["D"][None, :, None] * x) * F.silu(z)
    out = y.transpose(1, 2) @ p["out_proj.weight"].T
    return out + p["out_proj.bias"] if "out_proj.bias" in p else out


def layer_params64(m) -> dict:
    """The layer's parameters as float64 leaves that require grad, by name."""
    return {k: v.detach().double().requires_grad_(True) for k, v in m.named_parameters()}


__all__ = ["RefKernel", "RefKernels", "catalog", "layer_params64", "reference_mamba", "register_cpu"]
