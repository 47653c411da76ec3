"""The qualifier's own kernels (qualify/helper_kernels.py) compile with NVRTC for the GPUs it qualifies on (CPU: the
driver half, loading the cubin, is a stand-in here; the GPU tests load them for real)."""

from __future__ import annotations

import pytest

from mamba_forge.qualify import checks, guards, helper_kernels, pdl, placement

SOURCES = [
    (guards.CHECK_SOURCE, "mf_guard_check"),
    (checks.NEIGHBOUR_SOURCE, "mf_noisy_neighbour"),
    (placement.BLOCKER_SOURCE, "mf_placement_blocker"),
    (pdl.WRITER_SOURCE, "mf_pdl_late_writer"),
]


class _Module:
    def __init__(self, image: bytes):
        assert image[:4] == b"\x7fELF"  # a cubin
        self.image = image

    def function(self, name: str) -> str:
        assert name.encode() + b"\0" in self.image, f"{name} is not an entry of the cubin"
        return name


@pytest.mark.parametrize(("source", "entry"), SOURCES, ids=[e for _, e in SOURCES])
@pytest.mark.parametrize("cc", [(8, 0), (9, 0), (12, 0)])
def test_every_helper_kernel_compiles_for_the_gpus_it_runs_on(monkeypatch, source, entry, cc):
    if entry == "mf_pdl_late_writer" and cc < (9, 0):
        pytest.skip("programmatic dependent launch: sm_90+ only (the pdl check never runs before it)")
    monkeypatch.setattr(helper_kernels.cu, "Module", _Module)
    module, fn = helper_kernels.compile_helper(cc, source, f"{entry}.cu", entry, entry)
    assert fn == entry and isinstance(module, _Module)


def test_a_helper_that_does_not_compile_says_which_and_why():
    with pytest.raises(RuntimeError, match=r"^the PDL writer kernel failed to compile: .*error"):
        helper_kernels.compile_helper((9, 0), "this is not CUDA", "broken.cu", "k", "PDL writer kernel")
