"""Programmatic dependent launch, from the catalog to the launch (CPU; the GPU test is tests/gpu/test_runtime_gpu.py
test_the_decode_step_under_programmatic_dependent_launch_equals_plain_launches).

A family's `launch.pdl_max_blocks` (an expression over instance params, 0 to 2^31-1) says that a grid of at most
that many blocks may be launched with the programmatic-serialization attribute; the build holds the kernel to
waiting (griddepcontrol.wait) where PDL exists (tests/test_build.py's pdl_no_wait control); the qualified record
carries the figure and the runtime launches with PDL exactly there, on sm_90+ devices.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from runtime_fakes import FakeTorchTensor as T
from runtime_fakes import catalog_record
from runtime_support import H200, FakeBackend, signed_tiny, write_tiny_catalog

from mamba_forge.build import cubin
from mamba_forge.catalog.model import load_catalog
from mamba_forge.core.codec import from_dict
from mamba_forge.core.errors import CatalogError
from mamba_forge.core.schema import RuntimeSymbol, SchemaError
from mamba_forge.core.vocab import DeviceInfo
from mamba_forge.runtime import load
from mamba_forge.runtime.kernel import launch
from mamba_forge.runtime.loader import pdl_blocks

pytestmark = pytest.mark.usefixtures("fake_tensor_streams", "isolated_trust")  # tests/conftest.py

PDL_FAMILY = """
[[family]]
name = "pdl_copy"
instantiate = "TINY_PDL_COPY"
variants = ["bf16"]
instances = [{ CAP = 16 }]
symbol = "{name}_{dtype}"
launch = { block = 128, grid = ["ceil_div(n, 128)"], pdl_max_blocks = "CAP" }
params = [
  { name = "y", type = "ptr", dtype = "T", role = "out", shape = ["n"] },
  { name = "x", type = "ptr", dtype = "T", shape = ["n"] },
  { name = "n", type = "i64", value = "n" },
]
qualify = { dims = { n = 4096 } }
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return signed_tiny(tmp_path_factory.mktemp("pdl"), PDL_FAMILY)


def test_the_record_carries_the_catalog_figure_and_small_grids_launch_with_pdl(tiny):
    fake = FakeBackend()
    k = load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake)
    fn = k.fn("pdl_copy", "bf16")
    assert fn.symbol.pdl_max_blocks == 16 and fn.pdl_max_blocks == 16  # H200: cc 9.0
    assert k.fn("scale", "bf16").pdl_max_blocks == 0  # a family that declares nothing
    for n, blocks, pdl in ((128, 1, True), (16 * 128, 16, True), (16 * 128 + 1, 17, False)):
        fn(y=T(n, "bf16"), x=T(n, "bf16"))
        assert (fake.launches[-1]["grid"], fake.launches[-1]["pdl"]) == ((blocks, 1, 1), pdl), n
    y, x = T(4096, "bf16"), T(4096, "bf16")
    launch(fn, (16,), (128,), (y, x, 4096))  # the positional path decides as the keyword one
    assert fake.launches[-1]["pdl"] is True
    launch(fn, (32,), (128,), (y, x, 4096))
    assert fake.launches[-1]["pdl"] is False
    k.fn("scale", "bf16")(y=T(128, "bf16"), x=T(128, "bf16"), a=1.0)
    assert fake.launches[-1]["pdl"] is False


def test_load_can_turn_pdl_off(tiny):
    fake = FakeBackend()
    k = load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake, pdl=False)
    fn = k.fn("pdl_copy", "bf16")
    assert fn.symbol.pdl_max_blocks == 16 and fn.pdl_max_blocks == 0  # the record keeps it; this load does not use it
    fn(y=T(128, "bf16"), x=T(128, "bf16"))
    assert fake.launches[-1]["pdl"] is False
    with pytest.raises(TypeError, match=r"load\(pdl=...\) takes True or False, not 'no'"):
        load(tiny.manifest, trusted_keys=[tiny.pub], backend=FakeBackend(), pdl="no")


def test_no_pdl_before_sm_90():
    rec = catalog_record("ssm_step_forward_fused_bf16")
    assert rec.pdl_max_blocks == 2048  # kernels/fixed/scan.toml: PDL_BLOCKS
    assert pdl_blocks(rec, H200) == 2048
    ada = DeviceInfo(ordinal=0, name="NVIDIA L40S", cc=(8, 9), sm_count=142, driver_version=13000)
    assert pdl_blocks(rec, ada) == 0
    assert pdl_blocks(dataclasses.replace(rec, pdl_max_blocks=0), H200) == 0


def test_the_record_refuses_a_negative_figure():
    rec = dataclasses.asdict(catalog_record("ssm_step_forward_fused_bf16"))
    assert from_dict(RuntimeSymbol, rec).pdl_max_blocks == 2048
    with pytest.raises(SchemaError, match=r"pdl_max_blocks -1 is not 0 \(never\) to 2\^31-1 blocks"):
        from_dict(RuntimeSymbol, {**rec, "pdl_max_blocks": -1})


def _catalog(tmp_path, launch_line: str):
    """The runtime tests' tiny catalog with one more family, `k` (one instance, CAP = 8), launched as given."""
    return load_catalog(write_tiny_catalog(tmp_path, f"""
[[family]]
name = "k"
instantiate = "TINY_COPY"
variants = ["f32"]
instances = [{{ CAP = 8 }}]
symbol = "k"
{launch_line}
params = [
  {{ name = "y", type = "ptr", dtype = "T", role = "out", shape = ["n"] }},
  {{ name = "x", type = "ptr", dtype = "T", shape = ["n"] }},
  {{ name = "n", type = "i64", value = "n" }},
]
qualify = {{ dims = {{ n = 4096 }} }}
"""))


def test_the_catalog_evaluates_pdl_max_blocks_per_instance_and_refuses_what_is_out_of_range(tmp_path):
    assert _catalog(tmp_path, 'launch = { block = 32, pdl_max_blocks = "CAP * 4" }').symbols["k"].pdl_max_blocks == 32
    assert _catalog(tmp_path, "launch = { block = 32 }").symbols["k"].pdl_max_blocks == 0
    with pytest.raises(CatalogError, match=r"launch.pdl_max_blocks is -8; it must be 0 \(never\) to 2\^31-1 blocks"):
        _catalog(tmp_path, 'launch = { block = 32, pdl_max_blocks = "0 - CAP" }')
    with pytest.raises(CatalogError, match="pdl_max_blocks"):
        _catalog(tmp_path, "launch = { block = 32, pdl_max_blocks = true }")  # strict: not a number
    with pytest.raises(CatalogError, match="NOPE"):
        _catalog(tmp_path, 'launch = { block = 32, pdl_max_blocks = "NOPE" }')  # an unknown name


def test_the_ptx_scan_finds_the_entries_that_wait():
    ptx = (".visible .entry waits(.param .u64 p)\n{\n griddepcontrol.wait;\n ld.global.f32 %f1, [%rd1];\n}\n"
           ".visible .entry triggers_only(.param .u64 p)\n{\n griddepcontrol.launch_dependents;\n}\n"
           ".visible .entry lookalike(.param .u64 p)\n{\n // griddepcontrol.waits is not an instruction\n"
           " mov.u32 %r1, %tid.x;\n}\n.visible .entry plain(.param .u64 p)\n{\n ret;\n}\n")
    assert cubin.pdl_wait_entries(ptx) == ["waits"]
    assert cubin.pdl_wait_entries("") == []


def test_the_step_kernels_take_the_figure_their_launch_declares():
    """The kernel waits on grids up to its PDL_BLOCKS template argument and the runtime launches with PDL up to the
    record's pdl_max_blocks: both come from the one instance parameter (kernels/fixed/scan.toml)."""
    from mamba_forge.catalog.model import default_catalog_path

    cat = load_catalog(default_catalog_path())
    steps = [s for s in cat.symbols.values() if s.family.startswith("ssm_step_forward_fused")]
    assert steps
    for s in steps:
        fam = cat.module(s.module).family(s.family)
        assert re.search(r"\bPDL_BLOCKS\b", fam.body) and fam.launch.pdl_max_blocks == "PDL_BLOCKS"
        assert s.pdl_max_blocks == s.params_env["PDL_BLOCKS"] > 0


# ---- the qualifier's pdl check (qualify/pdl.py), its launch sequence on a recording stand-in for the driver ----


class _Buf:
    def __init__(self, name, role, nbytes, needs_fill):
        self.name, self.role, self.nbytes, self.needs_fill = name, role, nbytes, needs_fill


def test_the_pdl_check_poisons_every_input_and_lets_a_late_writer_restore_it(monkeypatch):
    """The sequence on the stream: a copy of each `in` buffer, every buffer poisoned, the late writer (one wave)
    restoring the filled ones from those copies and the pristine ones, then the symbol with PDL; it applies only
    where the runtime would launch with PDL."""
    from types import SimpleNamespace

    from mamba_forge.qualify import pdl as PDL

    calls, n = [], [0]

    class DB:
        def __init__(self, nbytes):
            n[0] += 1
            self.ptr, self.nbytes = 0x9000 * n[0], nbytes
            calls.append(("alloc", self.ptr, nbytes))

        def free(self):
            calls.append(("free", self.ptr))

    fake = SimpleNamespace(
        DeviceBuffer=DB, context_synchronize=lambda: calls.append(("sync",)),
        memcpy_dtod=lambda d, s, nb, st=None: calls.append(("dtod", d, s, nb)),
        memset_d8=lambda d, v, nb, st=None: calls.append(("memset", d, v, nb)),
        memcpy_htod=lambda d, data: calls.append(("htod", d, len(data))),
        PackedParams=lambda values, aligns: ("params", tuple(values)),
        launch=lambda fn, grid, block, params, smem=0, stream=None, pdl=False: calls.append(
            ("launch", fn, grid, block, pdl)))
    monkeypatch.setattr(PDL, "cu", fake)
    monkeypatch.setattr(PDL, "writer_function", lambda ctx: "writer")
    bufs = [_Buf("out", "out", 64, False), _Buf("state", "inout", 128, True), _Buf("u", "in", 32, True)]
    rec = SimpleNamespace(pdl_max_blocks=2048)
    spec = SimpleNamespace(all_buffers=bufs, grid=(4, 3, 1), block=(64, 1, 1), dynamic_smem=0,
                           contract=SimpleNamespace(record=rec))
    ctx = SimpleNamespace(stream="s", info=SimpleNamespace(cc=(9, 0), sm_count=132), wait=lambda st: calls.append(
        ("wait",)))
    inst = SimpleNamespace(spec=spec, fn="step", params="P", ptrs={"out": 0x100, "state": 0x200, "u": 0x300},
                           pristine={"state": 0x2000}, verify=lambda st: calls.append(("verify",)),
                           outputs=lambda: {"out": b"o", "state": b"s"})
    assert PDL.applies(spec, ctx.info)
    assert PDL.run_after_late_writer(ctx, inst) == {"out": b"o", "state": b"s"}
    keep = 0x9000
    assert calls[:5] == [("memset", 0x100, 0xFF, 64), ("memset", 0x200, 0xFF, 128), ("alloc", keep, 32),
                         ("dtod", keep, 0x300, 32), ("memset", 0x300, 0xFF, 32)]
    launches = [c for c in calls if c[0] == "launch"]
    assert launches == [("launch", "writer", (132,), (256,), False), ("launch", "step", (4, 3, 1), (64, 1, 1), True)]
    assert calls.index(("sync",)) < calls.index(launches[0]) and calls[-2:] == [("free", keep), ("free", 0x9000 * 2)]
    # where the runtime would not use PDL, the check does not apply
    assert not PDL.applies(SimpleNamespace(**{**vars(spec), "grid": (4096, 1, 1)}), ctx.info)
    assert not PDL.applies(spec, SimpleNamespace(cc=(8, 9)))
    assert not PDL.applies(SimpleNamespace(**{**vars(spec), "contract": SimpleNamespace(
        record=SimpleNamespace(pdl_max_blocks=0))}), ctx.info)
