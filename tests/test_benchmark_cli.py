"""Every benchmarks/bench_*.py and tune_*.py (found by glob: a new one cannot be missed) imports without a GPU,
torch or CuPy, answers --help, and takes --smoke (one small shape, seconds, nothing recorded) through a
`parse_args(argv)` and a `main(argv=None)` (issue 28). The GPU side, each benchmark run with --smoke, is
tests/gpu/test_benchmarks_smoke.py.

The contract a benchmark keeps: a module-level `parser()` (its argparse.ArgumentParser), `parse_args(argv)` and
`main(argv=None)`; torch and CuPy are imported inside main, after the arguments are parsed."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
BENCH_FILES = sorted(BENCHMARKS.glob("bench_*.py")) + sorted(BENCHMARKS.glob("tune_*.py"))  # tune_*.py: tuners
HEAVY = ("torch", "cupy")  # imported inside main() only: -h and the CLI checks run on a machine without them


def load_bench(path: Path):
    """The benchmark file as a module of its own name (benchmarks/ on sys.path, as when run as a script)."""
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"_cli_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # registered first, as an import would: dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def placeholder_args(p: argparse.ArgumentParser) -> list[str]:
    """A value for every required option (parsing only: nothing is opened)."""
    out = []
    for action in p._actions:
        if action.required and action.option_strings:
            out += [action.option_strings[0], "placeholder"]
    return out


def cli_problems(path: Path) -> list[str]:
    """What keeps this benchmark file from the --smoke contract; empty when it keeps it."""
    try:
        mod = load_bench(path)
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        return [f"import failed: {type(exc).__name__}: {exc}"]
    problems = []
    for name in ("parser", "parse_args", "main"):
        if not callable(getattr(mod, name, None)):
            problems.append(f"no {name}() function")
    if problems:
        return problems
    if "argv" not in inspect.signature(mod.main).parameters:
        problems.append("main() takes no argv")
    p = mod.parser()
    if not isinstance(p, argparse.ArgumentParser):
        return [*problems, f"parser() returned {type(p).__name__}, not an ArgumentParser"]
    if "--smoke" not in p._option_string_actions:
        return [*problems, "no --smoke option"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            mod.parse_args(["--help"])
            problems.append("--help did not exit")
        except SystemExit as exc:
            if exc.code not in (0, None):
                problems.append(f"--help exited {exc.code}")
    if "--smoke" not in out.getvalue():
        problems.append("--help does not show --smoke")
    argv = ["--smoke", *placeholder_args(p)]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            a = mod.parse_args(argv)
    except SystemExit as exc:
        return [*problems, f"parse_args({argv}) exited {exc.code}: {err.getvalue().strip()[-200:]}"]
    if getattr(a, "smoke", None) is not True:
        problems.append(f"parse_args({argv}) left smoke={getattr(a, 'smoke', None)!r}")
    try:
        plain = mod.parse_args(placeholder_args(p))
    except SystemExit as exc:
        return [*problems, f"parse_args without --smoke exited {exc.code}"]
    if plain.smoke is not False:
        problems.append("smoke is set without --smoke")
    return problems


def test_benchmarks_are_found():
    assert len(BENCH_FILES) >= 16, [p.name for p in BENCH_FILES]


@pytest.mark.parametrize("path", BENCH_FILES, ids=lambda p: p.stem)
def test_benchmark_keeps_the_smoke_contract(path):
    assert cli_problems(path) == []


def heavy_imports(paths: list[Path], extra_path: Path | None = None) -> dict[str, list[str]]:
    """{file name: heavy modules its import brought in}, every file imported in one fresh process."""
    code = (
        "import importlib.util, json, sys\n"
        f"sys.path[:0] = {[str(BENCHMARKS)] + ([str(extra_path)] if extra_path else [])!r}\n"
        "bad = {}\n"
        f"for path in {[str(p) for p in paths]!r}:\n"
        "    before = set(sys.modules)\n"
        "    spec = importlib.util.spec_from_file_location('_imp_' + path.rsplit('/', 1)[1][:-3], path)\n"
        "    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(mod)\n"
        f"    heavy = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in {HEAVY!r})\n"
        "    if heavy:\n"
        "        bad[path.rsplit('/', 1)[1]] = heavy[:3]\n"
        "print(json.dumps(bad))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_no_benchmark_imports_torch_or_cupy_at_import():
    assert heavy_imports(BENCH_FILES) == {}


# ---- the checks reject what they should (a fake benchmark in a temporary folder) ---------------------------

GOOD = '''
import argparse
import sys


def parser():
    p = argparse.ArgumentParser(description="fake")
    p.add_argument("--bundle", required=True)
    p.add_argument("--smoke", action="store_true", help="one small shape")
    return p


def parse_args(argv=None):
    return parser().parse_args(argv)


def main(argv=None):
    parse_args(argv)
    return 0
'''


@pytest.fixture
def fake(tmp_path):
    def write(text: str) -> Path:
        path = tmp_path / "bench_fake.py"
        path.write_text(text)
        return path
    return write


def test_a_benchmark_keeping_the_contract_passes(fake):
    assert cli_problems(fake(GOOD)) == []


@pytest.mark.parametrize("mutate, expect", [
    (lambda t: t.replace('    p.add_argument("--smoke", action="store_true", help="one small shape")\n', ""),
     "no --smoke option"),
    (lambda t: t.replace('"--smoke", action="store_true"', '"--smoke", action="store_false"'), "left smoke=False"),
    (lambda t: t.replace("def parse_args(argv=None):\n    return parser().parse_args(argv)\n", ""),
     "no parse_args() function"),
    (lambda t: t.replace("def parser():", "def make_parser():").replace("return parser()", "return make_parser()"),
     "no parser() function"),
    (lambda t: t.replace("def main(argv=None):\n    parse_args(argv)", "def main():\n    parse_args(None)"),
     "main() takes no argv"),
    (lambda t: "import mf_not_installed_anywhere  # noqa\n" + t, "import failed: ModuleNotFoundError"),
    (lambda t: t.replace("return parser().parse_args(argv)", "return parser().parse_args([])"), "exited 2"),
    (lambda t: t.replace('help="one small shape"', 'help=argparse.SUPPRESS'), "--help does not show --smoke"),
])
def test_a_benchmark_breaking_the_contract_is_reported(fake, mutate, expect):
    text = mutate(GOOD)
    assert text != GOOD
    problems = cli_problems(fake(text))
    assert any(expect in p for p in problems), problems


def test_a_benchmark_importing_torch_at_import_is_reported(tmp_path):
    """A stand-in torch module on the path: the fresh-process check names the benchmark that imported it early,
    and not the one that imports it inside main()."""
    (tmp_path / "stub").mkdir()
    (tmp_path / "stub" / "torch.py").write_text("")
    early, late = tmp_path / "bench_early.py", tmp_path / "bench_late.py"
    early.write_text("import torch  # noqa: F401\n" + GOOD)
    late.write_text(GOOD.replace("    parse_args(argv)\n", "    parse_args(argv)\n    import torch  # noqa: F401\n"))
    assert heavy_imports([early, late], extra_path=tmp_path / "stub") == {"bench_early.py": ["torch"]}


def test_launch_overhead_cpu_gemm_case_needs_no_driver(monkeypatch):
    """bench_launch_overhead's CPU kernels.gemm case prebuilds its tensor maps under the key
    mamba_forge.runtime.gemm._tensor_maps looks up: with the key wrong, every call encoded real maps through the
    driver (CUDA_ERROR_NOT_INITIALIZED on the H200, no libcuda here). An encode that is reached fails the test."""
    from mamba_forge.gpu import tma

    mod = load_bench(BENCHMARKS / "bench_launch_overhead.py")

    def no_encode(*a, **k):
        raise AssertionError("the CPU case encoded a tensor map: its prebuilt maps were missed")

    for hook in list(tma.TENSOR_MAP_HOOKS):
        monkeypatch.setitem(tma.TENSOR_MAP_HOOKS, hook, no_encode)
    (rec,) = mod.cpu_gemm_records(1, 3)
    assert rec["symbol"] == "nn bf16 route:kernels.gemm(cpu,fake)" and rec["ours"] > 0


@pytest.mark.parametrize("name, samples, smoke", [
    ("bench_gemm_f32", "--iters", {"iters": 5, "shapes": "1024x1024x1024"}),
    ("bench_gemm_sm90a", "--iters", {"iters": 5, "shapes": "1024x1024x1024"}),
    ("bench_sm120_tma", "--iters", {"iters": 5, "shapes": "1024x1024x1024"}),
    ("bench_conv1d", "--reps", {"reps": 5, "no_write": True}),
    ("bench_memory_bound", "--reps", {"reps": 5, "no_write": True}),
    ("bench_conv_optim", "--reps", {"reps": 5, "params": 1, "no_write": True}),
    ("bench_decode_step", None, {"inner": 4, "rounds": 1, "no_write": True}),
])
def test_shared_parsers_apply_each_benchmarks_rules(name, samples, smoke):
    """benchmarks/common.py's parsers: --smoke sets the script's values (and writes nothing); the GEMM and
    bandwidth benchmarks refuse fewer than 20 timed samples (no stable median) unless --smoke."""
    mod = load_bench(BENCHMARKS / f"{name}.py")
    req = placeholder_args(mod.parser())
    few = [samples, "19"] if samples else []
    a = mod.parse_args([*req, "--smoke", *few])
    assert {k: getattr(a, k) for k in smoke} == smoke
    if samples:
        with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit) as exc:
            mod.parse_args([*req, *few])
        assert exc.value.code == 2 and f"{samples} must be at least 20" in err.getvalue()
        assert getattr(mod.parse_args([*req, samples, "20"]), samples[2:]) == 20


def test_mamba_train_arguments():
    mod = load_bench(BENCHMARKS / "bench_mamba_train.py")
    req = ["--bundle", "b", "--key", "k"]
    a = mod.parse_args(req)
    assert (a.d_models, a.shapes, a.reps, a.runs) == ([1024, 2560], [(8, 2048), (4, 4096)], 20, 10)
    a = mod.parse_args([*req, "--smoke", "--d-models", "4096"])
    assert (a.d_models, a.shapes, a.reps, a.runs) == ([256], [(2, 128)], 3, 3)  # --smoke: one small shape
    assert mod.parse_args([*req, "--shapes", "1x64, 2X128", "--d-models", "512"]).shapes == [(1, 64), (2, 128)]
    for bad in (["--shapes", "8x"], ["--shapes", "0x64"], ["--shapes", "8x2048x1"], ["--d-models", "0"],
                ["--reps", "2"], ["--runs", "1"]):
        with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as exc:
            mod.parse_args([*req, *bad])
        assert exc.value.code == 2, bad


def test_mamba_train_counts_differing_gradient_elements():
    """The determinism figure counts every gradient element (input and parameters) that differs in any bit from
    the first run in any later run: 0 for a deterministic backward, exactly the perturbed elements otherwise."""
    torch = pytest.importorskip("torch")
    mod = load_bench(BENCHMARKS / "bench_mamba_train.py")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
    h, dout = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    total = 3 * 5 * 8 + sum(p.numel() for p in model.parameters())
    assert mod.gradient_differences(model, h, dout, 4) == (0, total)
    runs = iter(range(100))

    def wobble(grad):  # run k > 0 moves k-th element(s) of the bias gradient by one ulp
        k = next(runs)
        out = grad.clone()
        if k:
            out.view(-1)[: min(k, 3)] = torch.nextafter(out.view(-1)[: min(k, 3)], torch.tensor(float("inf")))
        return out

    model[2].bias.register_hook(wobble)
    assert mod.gradient_differences(model, h, dout, 4) == (3, total)
    model.zero_grad(set_to_none=True)
    step, x = mod.fwd_bwd(model, h, dout)
    assert mod.missing_grads(model, x) == ["the input", "0.weight", "0.bias", "2.weight", "2.bias"]
    step()
    assert mod.missing_grads(model, x) == []
    model[0].weight.requires_grad_(False)  # a parameter the backward does not reach is named
    step()
    assert mod.missing_grads(model, x) == ["0.weight"]


def test_mamba_generate_arguments():
    mod = load_bench(BENCHMARKS / "bench_mamba_generate.py")
    req = ["--bundle", "b", "--key", "k"]
    a = mod.parse_args(req)
    assert (a.models.split(","), a.batches, a.prompt, a.new_tokens) == (list(mod.MODELS), "1,16", 512, 128)
    assert mod.parse_args([*req, "--models", "mamba-130m,mamba-2.8b"]).models == "mamba-130m,mamba-2.8b"
    for bad in (["--models", "mamba-7b"], ["--new-tokens", "1"], ["--prompt", "0"], ["--reps", "0"], []):
        with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as exc:
            mod.parse_args(bad if not bad else [*req, *bad])
        assert exc.value.code == 2, bad
