"""Hostile target choices: --arch values, MAMBA_FORGE_ARCH and TORCH_CUDA_ARCH_LIST (ours and torch spellings,
separators, `all`, `native` with and without a GPU, garbage), --kernels globs, cache sizes. Each generated case
asserts the exact outcome: the target tuple, or exit 2 with one `error:` line and nothing written."""

from __future__ import annotations

import random

import pytest

from mamba_forge.build.cache_admin import parse_size
from mamba_forge.catalog.targets import DEFAULT_TARGETS, TARGETS, parse_arch_list, select_targets
from mamba_forge.cli import main
from mamba_forge.core.errors import ForgeError

RNG = random.Random(20240611)
NO_GPU = list  # native() with no GPU visible: an empty list of compute capabilities
H200 = lambda: [(9, 0)]  # noqa: E731


GOOD = [
    ("sm_90a,sm_80", ("sm_90a", "sm_80")),
    ("sm_90a sm_80", ("sm_90a", "sm_80")),
    ("8.0 9.0a 12.0", ("sm_80", "sm_90a", "sm_120")),
    ("8.0;9.0", ("sm_80", "sm_90")),
    ("8.0;9.0;", ("sm_80", "sm_90")),
    ("  8.6  ", ("sm_86",)),
    ("9.0+PTX", ("sm_90",)),
    ("9.0a+ptx", ("sm_90a",)),
    ("sm_90a,sm_90a,9.0a", ("sm_90a",)),
    ("all", tuple(TARGETS)),
    ("ALL", tuple(TARGETS)),
    ("sm_80,all", tuple(TARGETS)),
    ("10.0a 10.3a 12.0a", ("sm_100a", "sm_103a", "sm_120a")),
]


@pytest.mark.parametrize(("text", "names"), GOOD)
def test_good_spellings(text, names):
    assert parse_arch_list(text, "MAMBA_FORGE_ARCH", NO_GPU).names == names


def test_plus_ptx_is_ignored_with_a_note():
    sel = parse_arch_list("8.0;9.0+PTX", "TORCH_CUDA_ARCH_LIST", NO_GPU)
    assert sel.names == ("sm_80", "sm_90")
    assert len(sel.notes) == 1 and "+PTX part is ignored" in sel.notes[0]


def test_native_uses_the_attached_gpu():
    assert parse_arch_list("native", "--arch", H200).names == ("sm_90a",)
    assert parse_arch_list("native,sm_80", "--arch", H200).names == ("sm_90a", "sm_80")


BAD = [
    ("", "names no architecture"),
    ("   ", "names no architecture"),
    (",;,", "names no architecture"),
    ("sm_91", "unknown architecture 'sm_91'"),
    ("sm_100", "unknown architecture 'sm_100'"),
    ("10.0", "'10.0' is sm_100, which mamba-forge does not build"),
    ("7.5", "'7.5' is sm_75, which mamba-forge does not build"),
    ("9.0f", "'9.0f' is not an architecture"),
    ("9", "'9' is not an architecture"),
    ("SM_90A", "'SM_90A' is not an architecture"),
    ("compute_90", "'compute_90' is not an architecture"),
    ("sm_90a;rm -rf /", "'rm' is not an architecture"),
    ("9.0+SASS", "'9.0+SASS' is not an architecture"),
    ("native", "native needs an attached NVIDIA GPU, and none is visible"),
    ("٩.٠", "is not an architecture"),  # non-ASCII digits
    ("sm_٩٠a", "is not an architecture"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_spellings_are_refused(text, message):
    with pytest.raises(ForgeError, match=None) as exc:
        parse_arch_list(text, "MAMBA_FORGE_ARCH", NO_GPU)
    assert message in str(exc.value)
    assert exc.value.exit_code == 2


GARBAGE = ["".join(RNG.choice("sm_0123456789a.;, +PTXx\t\n\x00é") for _ in range(RNG.randint(1, 30)))
           for _ in range(40)]


@pytest.mark.parametrize("text", GARBAGE)
def test_generated_garbage_gives_targets_or_one_bad_input_line(text):
    try:
        sel = parse_arch_list(text, "MAMBA_FORGE_ARCH", NO_GPU)
    except ForgeError as exc:
        assert exc.exit_code == 2 and "\n" not in str(exc)
        return
    assert sel.names and set(sel.names) <= set(TARGETS)


def test_a_long_hostile_token_is_shortened_in_the_message():
    with pytest.raises(ForgeError) as exc:
        parse_arch_list("x" * 10_000, "MAMBA_FORGE_ARCH", NO_GPU)
    assert len(str(exc.value)) < 400


@pytest.mark.parametrize(
    ("cli", "env", "names", "source"),
    [
        (None, {}, DEFAULT_TARGETS, "default"),
        (None, {"MAMBA_FORGE_ARCH": ""}, DEFAULT_TARGETS, "default"),  # set but empty counts as unset
        (None, {"MAMBA_FORGE_ARCH": "sm_80"}, ("sm_80",), "MAMBA_FORGE_ARCH"),
        (None, {"TORCH_CUDA_ARCH_LIST": "8.0;9.0a"}, ("sm_80", "sm_90a"), "TORCH_CUDA_ARCH_LIST"),
        (None, {"MAMBA_FORGE_ARCH": "sm_89", "TORCH_CUDA_ARCH_LIST": "8.0"}, ("sm_89",), "MAMBA_FORGE_ARCH"),
        (["sm_90a"], {"MAMBA_FORGE_ARCH": "sm_89", "TORCH_CUDA_ARCH_LIST": "8.0"}, ("sm_90a",), "--arch"),
        (["sm_90a", "8.0,sm_90a"], {}, ("sm_90a", "sm_80"), "--arch"),
        (["all"], {}, tuple(TARGETS), "--arch"),
    ],
)
def test_precedence(cli, env, names, source):
    sel = select_targets(cli, env, NO_GPU)
    assert (sel.names, sel.source) == (names, source)


def test_torch_list_use_is_announced():
    sel = select_targets(None, {"TORCH_CUDA_ARCH_LIST": "9.0a"}, NO_GPU)
    assert any("targets from TORCH_CUDA_ARCH_LIST" in n for n in sel.notes)


def test_a_bad_torch_list_is_bad_input_naming_the_variable():
    # torch's own list names architectures mamba-forge does not build: those are skipped with a note, and only a
    # list with none left is refused (tests/test_newcomer_fixes.py has the cases)
    sel = select_targets(None, {"TORCH_CUDA_ARCH_LIST": "8.0;10.0"}, NO_GPU)
    assert sel.names == ("sm_80",) and any("skipped 10.0 (sm_100)" in n for n in sel.notes)
    with pytest.raises(ForgeError, match="^TORCH_CUDA_ARCH_LIST: '10.0' is sm_100"):
        select_targets(None, {"TORCH_CUDA_ARCH_LIST": "10.0"}, NO_GPU)
    with pytest.raises(ForgeError, match="^TORCH_CUDA_ARCH_LIST: 'sm_9' is not an architecture"):
        select_targets(None, {"TORCH_CUDA_ARCH_LIST": "8.0;sm_9"}, NO_GPU)  # garbage stays bad input


def _run(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--arch", ""], {}, "error: --arch '' names no architecture"),
        (["--arch", "sm_91"], {}, "error: unknown architecture 'sm_91'"),
        (["--arch", "native"], {}, "error: --arch: native needs an attached NVIDIA GPU"),
        ([], {"MAMBA_FORGE_ARCH": "garbage"}, "error: MAMBA_FORGE_ARCH: 'garbage' is not an architecture"),
        ([], {"MAMBA_FORGE_ARCH": "native"}, "error: MAMBA_FORGE_ARCH: native needs an attached NVIDIA GPU"),
        ([], {"TORCH_CUDA_ARCH_LIST": "7.0"}, "error: TORCH_CUDA_ARCH_LIST: '7.0' is sm_70"),
        (["--arch", "sm_90a", "--kernels", "no_such_kernel*"], {}, "error: --kernels 'no_such_kernel*' matches no"),
        (["--arch", "sm_90a", "--kernels", ""], {}, "error: --kernels '' is empty"),
        (["--arch", "sm_90a", "--kernels", "*" * 300], {}, "is too long"),
    ],
)
def test_build_refuses_bad_targets_with_one_line(capsys, tmp_path, monkeypatch, argv, env, message):
    monkeypatch.delenv("MAMBA_FORGE_ARCH", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr("mamba_forge.catalog.targets._native_ccs", NO_GPU)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out_dir = tmp_path / "out"
    rc, out, err = _run(capsys, ["build", *argv, "--out", str(out_dir), "-q"])
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert not out_dir.exists()


SIZES = [("0", 0), ("1048576", 1048576), ("500M", 500 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29),
         ("500MB", 500_000_000), ("2 G", 2 << 30), ("10k", 10240), ("100B", 100), ("1TiB", 1 << 40), ("3mi", 3 << 20)]


@pytest.mark.parametrize(("text", "value"), SIZES)
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "-1", "1e9", "1.5.2G", "G", "iB", "1iB", "nan", "inf", "2P", "0x10", "1,000",
                                  "٥M", "9" * 30, "1" + "\x00", "500M extra"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ForgeError) as exc:
        parse_size(text, "MAMBA_FORGE_CACHE_MAX")
    assert exc.value.exit_code == 2 and str(exc.value).startswith("MAMBA_FORGE_CACHE_MAX ")
