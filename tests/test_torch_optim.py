"""mamba_forge.runtime.torch_optim on the CPU (a CPU torch is enough): AdamW and clip_grad_norm_ with the kernels
stood in for by the float64 references (mamba_forge/references/optim.py) on CPU tensors, every call checked
against the family's parameters in kernels/fixed/optim.toml, and the multi-tensor descriptors dereferenced by
address (each must point at a known tensor of the right dtype and size). Against torch.optim.AdamW over several
steps, the state_dict both ways, the descriptor layout against the contract and the qualifier's prepare hook, and
every refusal. tests/gpu/test_torch_optim_gpu.py runs the real kernels."""

from __future__ import annotations

import copy
import gc
import inspect
import struct
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mamba_forge.references import optim as ro
from mamba_forge.runtime.errors import FamilyUnavailable, LaunchRefused, SymbolUnavailable

torch = pytest.importorskip("torch")
from mamba_forge.runtime import torch_optim as mo  # noqa: E402  (imports torch)

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = {f["name"]: f for f in tomllib.loads((ROOT / "kernels/fixed/optim.toml").read_text())["family"]}
DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# the descriptor as the contract states it (kernels/fixed/optim.toml adamw_step_multi), independently of struct
DESC = np.dtype([("param", "<u8"), ("grad", "<u8"), ("exp_avg", "<u8"), ("exp_avg_sq", "<u8"), ("numel", "<i8"),
                 ("weight_decay", "<f4"), ("reserved", "<u4")])
ALL_SERVED = {mo.MULTI_FAMILY: ("f32", "bf16", "f16"), mo.CAPTURABLE_FAMILY: ("f32",), mo.SUMSQ_FAMILY: ("f32",),
              mo.CLIP_COEF_FAMILY: ("f32",), mo.SCALE_DEV_FAMILY: ("f32",)}


def _np(t):
    return t.detach().double().numpy()


def _put(t, x) -> None:
    """t <- the float64 result x, rounded to t's dtype (x may be a numpy scalar: a 0-dim parameter's), written
    through .data as a kernel writes through a pointer: torch counts no version (the optimizer counts them)."""
    t.data.copy_(torch.from_numpy(np.array(x, dtype=np.float64)).reshape(t.shape).to(t.dtype))


def _accepted(family: str) -> tuple[set[str], set[str]]:
    """(every parameter name, the required ones) of a family's launch contract: a scalar carrying a dim that some
    pointer's shape is exactly may be omitted (the launch derives it), everything else is required."""
    params = FAMILIES[family]["params"]
    dims = {p["shape"][0] for p in params if p["type"] == "ptr" and len(p["shape"]) == 1 and isinstance(p["shape"][0], str)}
    names = {p["name"] for p in params}
    optional = {p["name"] for p in params if p["type"] != "ptr" and p.get("value") in dims}
    return names, names - optional


class _RefKernel:
    """A family's contract computed by the float64 reference on CPU tensors."""

    def __init__(self, owner, family: str, dtype: str):
        self.owner, self.family, self.dtype = owner, family, dtype

    def __call__(self, **a):
        names, required = _accepted(self.family)
        assert set(a) <= names, f"{self.family}: unknown arguments {set(a) - names}"
        assert required <= set(a), f"{self.family}: missing arguments {required - set(a)}"
        for p in FAMILIES[self.family]["params"]:
            if p["type"] == "ptr" and p["name"] in a:
                want = self.dtype if p["dtype"] == "T" else p["dtype"]
                got = a[p["name"]]
                assert isinstance(got, torch.Tensor) and mo.torch_dtype(got.dtype) == want, (self.family, p["name"])
                assert got.is_contiguous(), (self.family, p["name"])
        self.owner.calls.append((self.family, self.dtype, a))
        getattr(self, "_" + self.family)(a)

    def _adamw_step_multi(self, a):
        descs = a["descs"]
        assert descs.dtype == torch.uint8 and descs.numel() == mo.DESC_BYTES * a["num_tensors"]
        table = np.frombuffer(descs.numpy().tobytes(), dtype=DESC)
        index, at = self.owner.index(), self.owner.at
        for d in table:
            assert d["reserved"] == 0
            n = int(d["numel"])
            p = at(index, int(d["param"]), DT[self.dtype], n)
            g = at(index, int(d["grad"]), DT[self.dtype], n)
            m = at(index, int(d["exp_avg"]), torch.float32, n)
            v = at(index, int(d["exp_avg_sq"]), torch.float32, n)
            rp, rm, rv = ro.adamw(_np(p), _np(g), _np(m), _np(v), lr=a["lr"], beta1=a["beta1"], beta2=a["beta2"],
                                  eps=a["eps"], weight_decay=float(d["weight_decay"]), step=a["step"])
            for t, r in ((p, rp), (m, rm), (v, rv)):
                _put(t, r)

    def _adamw_step_capturable(self, a):
        assert a["step"].dtype == torch.int32 and a["arrivals"].dtype == torch.uint32
        assert int(a["arrivals"].view(torch.int32)) == 0, "arrivals must be 0 before a launch"
        n = a.get("n", a["p"].numel())
        got = ro.adamw_step_capturable({k: _np(v) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                                        for k, v in a.items()} | {"step": np.array([int(a["step"])])}, {"n": n})
        for k in ("p", "m", "v"):
            _put(a[k], got[k])
        a["step"].fill_(int(got["step"][0]))

    def _grad_sumsq_partial(self, a):
        assert a["partials"].dtype == torch.float64 and a["partials"].numel() == mo.GRAD_PARTIALS
        n = a.get("n", a["g"].numel())
        _put(a["partials"], ro.grad_sumsq_partial({"g": _np(a["g"]).ravel(), "n": n}, {})["partials"])

    def _grad_clip_coef(self, a):
        got = ro.grad_clip_coef({"partials": _np(a["partials"]), "num_partials": a.get("num_partials",
                                 a["partials"].numel()), "max_norm": a["max_norm"], "eps": a["eps"]}, {})
        a["coef"].fill_(float(got["coef"][0]))
        a["norm"].fill_(float(got["norm"][0]))

    def _scale_grads_dev(self, a):
        _put(a["g"], ro.scale_grads_dev({"g": _np(a["g"]), "scale": _np(a["scale"])}, {})["g"])


class _RefKernels:
    """Stands in for a loaded Kernels: fn(family, dtype) for what `serves` lists, refusing the rest as the loader
    does (FamilyUnavailable for an absent family, SymbolUnavailable for an absent variant). `device` is a
    torch.device: the optimizer's tensors live there."""

    def __init__(self, serves=None, device=None):
        self.serves = ALL_SERVED if serves is None else serves
        self.device = torch.device("cpu") if device is None else device
        self.calls: list = []
        self.known = None  # callable -> the tensors a descriptor may point at

    def fn(self, family, dtype=None):
        if family not in self.serves:
            raise FamilyUnavailable(family, f"no family {family} in the manifest qualified on CPU stand-in",
                                    reason="absent", check="absent")
        if dtype not in self.serves[family]:
            raise SymbolUnavailable(f"{family}_{dtype}", f"family {family} has no {dtype} variant "
                                    f"(has {', '.join(self.serves[family])})")
        return _RefKernel(self, family, dtype)

    def watch(self, opt):
        def known():
            for g in opt.param_groups:
                for p in g["params"]:
                    yield p
                    if p.grad is not None:
                        yield p.grad
            for st in opt.state.values():
                yield from (t for t in st.values() if isinstance(t, torch.Tensor))
        self.known = known
        return opt

    def index(self) -> dict:
        """(address, dtype, numel) -> tensor over the known tensors: the watched optimizer's, else every live
        tensor (for an optimizer made out of the test's reach)."""
        known = self.known() if self.known else (o for o in gc.get_objects()
                                                 if type(o) in (torch.Tensor, torch.nn.Parameter) and o.layout == torch.strided)
        return {(t.data_ptr(), t.dtype, t.numel()): t for t in known}

    @staticmethod
    def at(index: dict, addr: int, dtype, numel: int):
        """The known tensor at this address, of this dtype and size (the kernel touches numel elements there)."""
        t = index.get((addr, dtype, numel))
        if t is None:
            raise AssertionError(f"descriptor address {addr:#x} ({dtype}, {numel} elements) is no known tensor")
        return t.detach().view(-1)

    def launches(self, family):
        return [c for c in self.calls if c[0] == family]


def _params(shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.rand(s, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)) for s in shapes]


def _grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1).to(p.dtype) for p in params]


SHAPES = [(7, 13), (1000,), (), (3, 1, 5), (0,), (2049,)]


def _groups(params, **over):
    return [{"params": params[:3], "weight_decay": 0.1, "lr": 2e-2},
            {"params": params[3:], "weight_decay": 0.0, "lr": 5e-3, **over}]


def test_signature_is_torch_adamws_plus_kernels():
    ours = inspect.signature(mo.AdamW.__init__).parameters
    theirs = inspect.signature(torch.optim.AdamW.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs) and list(ours)[len(theirs):] == ["kernels"]
    for name, p in theirs.items():
        assert ours[name].default == p.default and ours[name].kind == p.kind, name


def test_descriptor_layout_is_the_contracts():
    entries = [(0x7F0000001000, 0x7F0000002000, 0x7F0000003000, 0x7F0000004000, 12345, 0.1),
               (0x10, 0x20, 0x30, 0x40, 0, 0.0), (2**64 - 16, 0x1, 0x2, 0x3, 2**40 + 7, 1e-30)]
    data = mo.pack_descriptors(entries)
    assert DESC.itemsize == mo.DESC_BYTES == 48 and len(data) == 48 * len(entries)
    assert [DESC.fields[f][1] for f in DESC.names] == [0, 8, 16, 24, 32, 40, 44]
    table = np.frombuffer(data, dtype=DESC)
    for row, (p, g, m, v, n, wd) in zip(table, entries, strict=True):
        assert (int(row["param"]), int(row["grad"]), int(row["exp_avg"]), int(row["exp_avg_sq"])) == (p, g, m, v)
        assert int(row["numel"]) == n and row["reserved"] == 0
        assert row["weight_decay"] == np.float32(wd)  # stored as float32, rounded to nearest
    assert data[:8] == (0x7F0000001000).to_bytes(8, "little")  # little-endian on any host
    assert data[32:40] == (12345).to_bytes(8, "little") and data[44:48] == b"\0\0\0\0"


def test_descriptors_equal_the_qualifiers_prepare_hook():
    """The table the qualifier built for adamw_step_multi (references.optim.adamw_multi_descriptors, the prepare
    hook that qualified it) and ours for the same tensors are the same bytes."""
    for sizeof_t in (4, 2):
        dims = {"tensors": 7, "total": 100_003, "sizeof_T": sizeof_t}
        ptr = {"param": 0x7000_0000, "grad": 0x8000_0000, "exp_avg": 0x9000_0000, "exp_avg_sq": 0xA000_0000}
        theirs = ro.adamw_multi_descriptors(ptr, {"num_tensors": 7}, dims)["descs"]
        entries, start = [], 0
        for t, n in enumerate(ro.multi_tensor_sizes(dims["total"], dims["tensors"])):
            entries.append((ptr["param"] + start * sizeof_t, ptr["grad"] + start * sizeof_t, ptr["exp_avg"] + start * 4,
                            ptr["exp_avg_sq"] + start * 4, n, ro.multi_weight_decay(t)))
            start += n
        assert mo.pack_descriptors(entries) == theirs


@pytest.mark.parametrize("entry, match", [
    ((0, 8, 16, 24, 1, 0.0), "param address 0"),
    ((8, 2**64, 16, 24, 1, 0.0), "grad address"),
    ((8, 16, 24.0, 32, 1, 0.0), "exp_avg address"),
    ((8, 16, 24, 32, -1, 0.0), "numel -1"),
    ((8, 16, 24, 32, 1.5, 0.0), "numel 1.5"),
    ((8, 16, 24, 32, 1, -0.1), "weight_decay -0.1"),
    ((8, 16, 24, 32, 1, float("nan")), "weight_decay nan"),
    ((8, 16, 24, 32, 1, 1e39), "weight_decay 1e"),
])
def test_descriptor_refusals(entry, match):
    with pytest.raises(LaunchRefused, match=match) as exc:
        mo.pack_descriptors([(8, 16, 24, 32, 1, 0.0), entry])
    assert "descriptor 1" in str(exc.value) and "\n" not in str(exc.value)


def _torch_twin(params, groups_of):
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    return twin, torch.optim.AdamW(groups_of(twin), foreach=False)


# Within f32 rounding, where the kernels' own rounding is the f32 hyperparameters they receive (the contract's
# f32 scalars): 1 - f32(beta2) differs from torch's 1 - beta2 by up to 2^-25 / (1 - beta2) relative, 3.4e-5 at
# beta2 = 0.999, which exp_avg_sq carries; the bias correction uses the same f32(beta2), so the parameters' update
# (v / (1 - beta2^t)) cancels most of it; and torch's own f32 steps round several times per element (mul, lerp,
# addcdiv): its parameters drift from the exact update by about half an ulp per step (4e-7 after 6 steps at
# |p| ~ 1, measured). Measured here: p 2.3e-7, exp_avg 6e-8 (1 ulp), exp_avg_sq 2.4e-5 relative.
TOL = {"p": (1e-6, 5e-7), "exp_avg": (1e-5, 2e-7), "exp_avg_sq": (6e-5, 1e-9)}


def _assert_state_close(opt, ref, params, twin):
    for i, (p, q) in enumerate(zip(params, twin, strict=True)):
        rtol, atol = TOL["p"]
        torch.testing.assert_close(p.detach(), q.detach(), rtol=rtol, atol=atol, msg=lambda m, i=i: f"param {i}: {m}")
        if q in ref.state:
            s, r = opt.state[p], ref.state[q]
            assert float(s["step"]) == float(r["step"]), f"param {i} step"
            for k in ("exp_avg", "exp_avg_sq"):
                assert s[k].dtype == torch.float32 and s[k].shape == q.shape
                rtol, atol = TOL[k]
                torch.testing.assert_close(s[k], r[k].float(), rtol=rtol, atol=atol,
                                           msg=lambda m, i=i, k=k: f"param {i} {k}: {m}")
        else:
            assert p not in opt.state or not opt.state[p]


def test_matches_torch_adamw_over_steps_with_groups_and_lagging_steps():
    """f32: two groups (weight decay and lr differ), odd sizes, a 0-dim and an empty parameter, and one parameter
    without a gradient at step 2 (its step count lags: the group then needs two launches, one per step count)."""
    params = _params(SHAPES)
    twin, ref = _torch_twin(params, _groups)
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(_groups(params), kernels=kern))
    for step in range(1, 7):
        grads = _grads(params, seed=100 + step)
        for p, q, g in zip(params, twin, grads, strict=True):
            skip = step == 2 and p is params[1]
            p.grad = None if skip else g.clone()
            q.grad = None if skip else g.clone()
        n_before = len(kern.launches(mo.MULTI_FAMILY))
        opt.step()
        ref.step()
        _assert_state_close(opt, ref, params, twin)
        launches = kern.launches(mo.MULTI_FAMILY)[n_before:]
        assert len(launches) == (3 if step >= 3 else 2), [c[2]["step"] for c in launches]
    with torch.no_grad():
        moved = max(float((p - q0).abs().max()) for p, q0 in zip(params, _params(SHAPES), strict=True) if p.numel())
    assert moved > 1e-2  # the updates were real, not a few ulps


ULP = {"bf16": 2.0**-7, "f16": 2.0**-10}  # one ulp, relative, anywhere in the format's normal range


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_parameters_keep_f32_state(dtype):
    """bf16/f16 parameters: gradients in the parameter's dtype, exp_avg/exp_avg_sq f32; the parameter is the f32
    update rounded to its dtype, step after step (torch.optim.AdamW on f32 copies, rounded likewise, is the
    reference). lr is large, so a missed update is many ulps."""
    params = _params([(33, 17), (5,)], dtype=DT[dtype], seed=3)
    twin = [torch.nn.Parameter(p.detach().float()) for p in params]
    ref = torch.optim.AdamW(twin, lr=0.1, weight_decay=0.05, foreach=False)
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(params, lr=0.1, weight_decay=0.05, kernels=kern))
    for step in range(1, 5):
        for p, q, g in zip(params, twin, _grads(params, seed=step), strict=True):
            p.grad, q.grad = g.clone(), g.float()
        opt.step()
        ref.step()
        with torch.no_grad():
            for p, q in zip(params, twin, strict=True):
                assert p.dtype == DT[dtype]
                want = q.to(DT[dtype])
                # the same value after rounding to the parameter's dtype, but where the f32 update lies within
                # f32 rounding of a rounding boundary of the 16-bit format: one ulp, rarely
                off = (p.float() != want.float()).sum().item()
                assert off <= max(1, p.numel() // 100), f"{off} of {p.numel()} elements differ"
                torch.testing.assert_close(p.float(), want.float(), rtol=ULP[dtype], atol=0)
                q.copy_(p.float())  # the next step starts both from the same (stored, rounded) parameter
                st = opt.state[p]
                assert st["exp_avg"].dtype == torch.float32 == st["exp_avg_sq"].dtype
                for k in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(st[k], ref.state[q][k], rtol=TOL[k][0], atol=TOL[k][1])
    assert {c[1] for c in kern.launches(mo.MULTI_FAMILY)} == {dtype}


def test_one_launch_per_group_and_dtype_and_the_table_is_reused():
    params = _params([(4, 4), (9,)]) + _params([(6,)], dtype=torch.bfloat16)
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(params, kernels=kern))
    for p, g in zip(params, _grads(params, 1), strict=True):
        p.grad = g
    opt.step()
    assert sorted((c[1], c[2]["num_tensors"]) for c in kern.calls) == [("bf16", 1), ("f32", 2)]
    tables = {c[1]: c[2]["descs"] for c in kern.calls}
    opt.step()  # the same gradients: the same addresses, so the same device tables
    assert all(c[2]["descs"] is tables[c[1]] for c in kern.calls[2:])
    params[0].grad = params[0].grad.clone()  # a new address: the f32 table is rebuilt, the bf16 one kept
    opt.step()
    later = {c[1]: c[2]["descs"] for c in kern.calls[4:]}
    assert later["f32"] is not tables["f32"] and later["bf16"] is tables["bf16"]
    assert [c[2]["step"] for c in kern.calls] == [1, 1, 2, 2, 3, 3]


def test_capturable_gives_the_multi_paths_bits_and_reads_lr_from_the_device():
    params_a, params_b = _params(SHAPES, seed=5), _params(SHAPES, seed=5)
    ka, kb = _RefKernels(), _RefKernels()
    plain = ka.watch(mo.AdamW(_groups(params_a), kernels=ka))
    lr = torch.tensor([5e-3])
    capt = kb.watch(mo.AdamW(_groups(params_b, lr=lr, capturable=True), kernels=kb))
    for step in range(1, 5):
        if step == 3:  # a schedule writes the device lr in place; the plain optimizer gets the same value
            lr.fill_(1e-3)
            plain.param_groups[1]["lr"] = float(lr)
        for pa, pb, g in zip(params_a, params_b, _grads(params_a, step), strict=True):
            pa.grad, pb.grad = g.clone(), g.clone()
        plain.step()
        capt.step()
        for pa, pb in zip(params_a, params_b, strict=True):
            assert torch.equal(pa, pb)
            sa, sb = plain.state[pa], capt.state[pb]
            assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
            assert int(sa["step"]) == int(sb["step"]) == step
    assert {c[1] for c in kb.launches(mo.MULTI_FAMILY)} == {"f32"}  # group 0 is not capturable
    capt_calls = kb.launches(mo.CAPTURABLE_FAMILY)
    assert capt_calls and all(c[2]["lr"] is lr for c in capt_calls)
    st = capt.state[params_b[3]]
    assert st["step"].dtype == torch.int32 and st["step"].dim() == 0


def _run(opt, params, steps, seed0):
    for step in range(steps):
        for p, g in zip(params, _grads(params, seed0 + step), strict=True):
            p.grad = g
        opt.step()


def test_state_dict_round_trips_and_is_torch_adamws():
    params = _params(SHAPES, seed=9)
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(_groups(params), kernels=kern))
    _run(opt, params, 3, 10)
    sd = opt.state_dict()
    twin, ref = _torch_twin(params, _groups)
    _run(ref, twin, 1, 10)
    theirs = ref.state_dict()
    assert [sorted(g) for g in sd["param_groups"]] == [sorted(g) for g in theirs["param_groups"]]
    assert sd["state"].keys() == theirs["state"].keys()
    for i, st in sd["state"].items():
        assert set(st) == set(theirs["state"][i]) == {"step", "exp_avg", "exp_avg_sq"}
        for k in st:
            assert st[k].shape == theirs["state"][i][k].shape and st[k].dtype == theirs["state"][i][k].dtype, (i, k)
    # ours -> ours: the continuation is the same bits as never stopping
    clone = [torch.nn.Parameter(p.detach().clone()) for p in params]
    k2 = _RefKernels()
    opt2 = k2.watch(mo.AdamW(_groups(clone), kernels=k2))
    opt2.load_state_dict(sd)
    _run(opt, params, 2, 20)
    _run(opt2, clone, 2, 20)
    for p, q in zip(params, clone, strict=True):
        assert torch.equal(p, q) and torch.equal(opt.state[p]["exp_avg_sq"], opt2.state[q]["exp_avg_sq"])
    # ours -> torch and torch -> ours: both continue as the other would
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ref = torch.optim.AdamW(_groups(twin), foreach=False)
    ref.load_state_dict(opt.state_dict())
    k3 = _RefKernels()
    back = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt3 = k3.watch(mo.AdamW(_groups(back), kernels=k3))
    opt3.load_state_dict(ref.state_dict())
    _run(ref, twin, 2, 30)
    _run(opt3, back, 2, 30)
    _assert_state_close(opt3, ref, back, twin)


def test_loading_keeps_half_parameters_state_f32():
    params = _params([(10, 3)], dtype=torch.bfloat16, seed=2)
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(params, kernels=kern))
    _run(opt, params, 2, 0)
    sd = opt.state_dict()
    saved = {k: v.clone() for k, v in sd["state"][0].items()}
    assert saved["exp_avg"].dtype == torch.float32
    other = _params([(10, 3)], dtype=torch.bfloat16, seed=2)
    k2 = _RefKernels()
    opt2 = k2.watch(mo.AdamW(other, kernels=k2))
    opt2.load_state_dict(sd)
    st = opt2.state[other[0]]
    for k in ("exp_avg", "exp_avg_sq"):  # torch's load alone would have cast them to bfloat16
        assert st[k].dtype == torch.float32 and torch.equal(st[k], saved[k])
        assert st[k].data_ptr() != saved[k].data_ptr()
    assert float(st["step"]) == 2.0
    _run(opt2, other, 1, 5)
    assert float(opt2.state[other[0]]["step"]) == 3.0


@pytest.mark.parametrize("mutate, match", [
    (lambda sd: sd["param_groups"][0].update(amsgrad=True), "amsgrad=True"),
    (lambda sd: sd["param_groups"][0].update(maximize=True), "maximize=True"),
    (lambda sd: sd["param_groups"][0].update(decoupled_weight_decay=False), "decoupled_weight_decay=False"),
    (lambda sd: sd["state"][0].update(exp_avg=torch.zeros(3)), r"exp_avg of parameter 0 is \[3\]"),
    (lambda sd: sd["param_groups"].append({"params": []}), "groups"),
])
def test_load_state_dict_refusals_change_nothing(mutate, match):
    params = _params([(4, 5), (6,)])
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(params, kernels=kern))
    _run(opt, params, 2, 0)
    sd = copy.deepcopy(opt.state_dict())  # a state dict's state holds the optimizer's own tensors
    before = {k: v.clone() for k, v in opt.state[params[0]].items()}
    mutate(sd)
    with pytest.raises(LaunchRefused, match=match) as exc:
        opt.load_state_dict(sd)
    assert "\n" not in str(exc.value)
    assert all(torch.equal(opt.state[params[0]][k], v) for k, v in before.items())
    assert opt.param_groups[0]["amsgrad"] is False and len(opt.param_groups) == 1


def test_a_state_of_another_shape_is_refused_at_step():
    params = _params([(4, 5)])
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(params, kernels=kern))
    _run(opt, params, 1, 0)
    opt.state[params[0]]["exp_avg"] = torch.zeros(3)
    params[0].grad = torch.ones(4, 5)
    with pytest.raises(LaunchRefused, match=r"state exp_avg of parameter 0 \[4, 5\] is torch.float32 \[3\]"):
        opt.step()
    opt.state[params[0]]["exp_avg"] = torch.zeros(4, 5, dtype=torch.float64)
    with pytest.raises(LaunchRefused, match="float64"):
        opt.step()


@pytest.mark.parametrize("make, kw, match", [
    (lambda: _params([(3,)], dtype=torch.float64), {}, "parameter 0 \\[3\\] is f64.*adamw_step_multi"),
    (lambda: _params([(3,)]) + _params([(2, 2)], dtype=torch.bfloat16), {"serves": {mo.MULTI_FAMILY: ("f32",)}},
     "parameter 1 \\[2, 2\\] is bf16, which this manifest's adamw_step_multi kernels do not serve.*has f32"),
    (lambda: _params([(3,)]), {"serves": {}}, "no family adamw_step_multi"),
    (lambda: _params([(3,)], dtype=torch.bfloat16), {"capturable": True}, "bf16.*adamw_step_capturable"),
    (lambda: _params([(3,)]), {"serves": {mo.MULTI_FAMILY: ("f32",)}, "capturable": True},
     "no family adamw_step_capturable"),
    (lambda: [torch.nn.Parameter(torch.zeros(4, 3).t())], {}, "not contiguous"),
    (lambda: _params([(3,)]), {"device": SimpleNamespace(ordinal=0)}, "is on cpu; the kernels run on cuda:0"),
    (lambda: _params([(3,)]), {"amsgrad": True}, "amsgrad=True has no qualified kernel"),
    (lambda: _params([(3,)]), {"maximize": True}, "maximize=True"),
    (lambda: _params([(3,)]), {"differentiable": True}, "differentiable=True"),
    (lambda: _params([(3,)]), {"lr": -1.0}, "Invalid learning rate"),
    (lambda: _params([(3,)]), {"betas": (0.9, 1.0)}, "beta parameter at index 1"),
    (lambda: _params([(3,)]), {"eps": float("nan")}, "Invalid epsilon"),
    (lambda: _params([(3,)]), {"weight_decay": -0.1}, "weight_decay"),
    (lambda: _params([(3,)]), {"lr": torch.ones(2)}, "tensor of 2 elements"),
])
def test_construction_refusals(make, kw, match):
    kern_kw = {k: kw.pop(k) for k in ("serves", "device") if k in kw}
    kern = _RefKernels(**kern_kw)
    with pytest.raises(LaunchRefused, match=match) as exc:
        mo.AdamW(make(), kernels=kern, **kw)
    assert "\n" not in str(exc.value) and isinstance(exc.value, ValueError)
    assert kern.calls == []


def test_a_group_added_later_is_checked_and_not_kept_when_refused():
    kern = _RefKernels(serves={mo.MULTI_FAMILY: ("f32",)})
    opt = mo.AdamW(_params([(3,)]), kernels=kern)
    with pytest.raises(LaunchRefused, match="parameter 1 \\[2\\] is f16"):
        opt.add_param_group({"params": _params([(2,)], dtype=torch.float16)})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": _params([(2,)]), "weight_decay": 0.0})
    assert len(opt.param_groups) == 2


def test_without_registered_kernels_it_refuses(monkeypatch):
    import mamba_forge.runtime.torch as mft

    monkeypatch.setitem(mft._state, "kernels", None)
    with pytest.raises(LaunchRefused, match="need loaded kernels"):
        mo.AdamW(_params([(3,)]))
    monkeypatch.setitem(mft._state, "kernels", _RefKernels())
    assert isinstance(mo.AdamW(_params([(3,)])).kernels, _RefKernels)  # the registered ones by default
    with pytest.raises(LaunchRefused, match="says no device"):
        mo.AdamW(_params([(3,)]), kernels=SimpleNamespace(device=None))


def test_sparse_gradients_are_refused_before_anything_changes():
    params = _params([(5, 3), (4, 3)])
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(params, kernels=kern))
    before = [p.detach().clone() for p in params]
    params[0].grad = torch.ones(5, 3)
    params[1].grad = torch.sparse_coo_tensor([[0, 2]], torch.ones(2, 3), (4, 3), check_invariants=True)
    with pytest.raises(LaunchRefused, match="gradient of parameter 1 .* sparse") as exc:
        opt.step()
    assert "\n" not in str(exc.value)
    assert kern.calls == [] and all(torch.equal(p, b) for p, b in zip(params, before, strict=True))
    assert not opt.state[params[0]] or float(opt.state[params[0]]["step"]) == 0.0


def test_a_gradient_of_another_dtype_is_refused():
    params = _params([(3,)])
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(params, kernels=kern))
    params[0].grad = torch.ones(3)
    params[0].data = params[0].data.double()  # the parameter changed dtype after the optimizer was built
    with pytest.raises(LaunchRefused, match="is f64, which this manifest's adamw_step_multi"):
        opt.step()


# ---- clip_grad_norm_ -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch(max_norm):
    params = _params([(300, 7), (1,), (0,), (5000,), ()], seed=4)
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q, g in zip(params, twin, _grads(params, 6), strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    params[1].grad = None
    twin[1].grad = None
    kern = _RefKernels()
    norm = mo.clip_grad_norm_(params, max_norm, kernels=kern)
    want = torch.nn.utils.clip_grad_norm_(twin, max_norm, foreach=False)
    assert norm.dtype == torch.float32 and norm.dim() == 0
    torch.testing.assert_close(norm, want, rtol=1e-6, atol=0)
    for p, q in zip(params, twin, strict=True):
        if p.grad is not None:
            if max_norm > 1e5:
                assert torch.equal(p.grad, q.grad)  # coefficient 1: the gradients keep their bits
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-9)
    sums = kern.launches(mo.SUMSQ_FAMILY)
    assert len(sums) == 3 and len(kern.launches(mo.SCALE_DEV_FAMILY)) == 3  # empty and absent gradients skipped
    assert kern.launches(mo.CLIP_COEF_FAMILY)[0][2]["num_partials"] == 3 * mo.GRAD_PARTIALS
    bases = [c[2]["partials"].data_ptr() for c in sums]  # each gradient's partials in parameter order
    assert bases == [bases[0] + 8 * mo.GRAD_PARTIALS * j for j in range(3)]


def test_clip_grad_norm_of_nothing_is_zero():
    kern = _RefKernels()
    norm = mo.clip_grad_norm_(_params([(3,)]), 1.0, kernels=kern)
    assert float(norm) == 0.0


@pytest.mark.parametrize("make, kw, match", [
    (lambda: _params([(3,)], dtype=torch.bfloat16), {}, "is bf16, which this manifest's grad_sumsq_partial"),
    (lambda: _params([(3,)]), {"norm_type": 1.0}, "norm_type 1.0"),
    (lambda: _params([(3,)]), {"error_if_nonfinite": True}, "host read"),
    (lambda: _params([(3,)]), {"max_norm": float("inf")}, "must be finite"),
    (lambda: _params([(3,)]), {"serves": {mo.SUMSQ_FAMILY: ("f32",), mo.SCALE_DEV_FAMILY: ("f32",)}},
     "no family grad_clip_coef"),
])
def test_clip_grad_norm_refusals(make, kw, match):
    params = make()
    for p in params:
        p.grad = torch.ones_like(p)
    kern = _RefKernels(**({"serves": kw.pop("serves")} if "serves" in kw else {}))
    kw.setdefault("max_norm", 1.0)
    with pytest.raises(LaunchRefused, match=match) as exc:
        mo.clip_grad_norm_(params, kernels=kern, **kw)
    assert "\n" not in str(exc.value) and kern.calls == []


def test_clip_grad_norm_refuses_a_gradient_it_cannot_scale_in_place():
    p = torch.nn.Parameter(torch.zeros(4, 3))
    p.grad = torch.ones(3, 4).t()
    with pytest.raises(LaunchRefused, match="not contiguous"):
        mo.clip_grad_norm_([p], 1.0, kernels=_RefKernels())


def test_descriptor_scalars_are_the_kernels_floats():
    """The multi launch passes the group's hyperparameters as floats and the 1-based step as an int (the contract's
    f32 and i32 scalars), and each descriptor's weight decay is its group's."""
    params = _params([(3,), (4,)])
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW([{"params": params[:1], "weight_decay": 0.25}, {"params": params[1:]}], lr=0.003,
                              betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0, kernels=kern))
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    (a0, a1) = (c[2] for c in kern.calls)
    assert (a0["lr"], a0["beta1"], a0["beta2"], a0["eps"], a0["step"]) == (0.003, 0.8, 0.99, 1e-6, 1)
    assert type(a0["step"]) is int and type(a0["num_tensors"]) is int
    wd = [float(np.frombuffer(a["descs"].numpy().tobytes(), dtype=DESC)["weight_decay"][0]) for a in (a0, a1)]
    assert wd == [float(np.float32(0.25)), 0.0]
    assert struct.unpack("<f", a0["descs"].numpy().tobytes()[40:44])[0] == np.float32(0.25)
