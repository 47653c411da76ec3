"""Small pieces the bench_*.py scripts share (run as `python benchmarks/bench_*.py`, so this module is importable as
`common`): their argument parsers' common options and the --smoke and --reps rules, shape lists, the date stamp of their result
tables, appending to a results/*.md table (and the summary records beside it), random device tensors, and loading
a signed bundle. torch is imported inside the functions, so this module imports on a machine without it
(tests/test_benchmark_cli.py)."""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Iterable
from pathlib import Path


class BenchParser(argparse.ArgumentParser):
    """A benchmark's ArgumentParser: parse_args applies its rule for --smoke (and checks like --reps >= 20) to what
    it parsed, so a script's parse_args(argv) is parser().parse_args(argv)."""

    def __init__(self, doc: str, rule=None):
        super().__init__(description=doc.splitlines()[0])  # the first line of the script's docstring
        self.rule = rule  # (parser, parsed args) -> args

    def parse_args(self, args=None, namespace=None):
        a = super().parse_args(args, namespace)
        return a if self.rule is None else self.rule(self, a)


def bench_parser(doc: str, smoke_help: str, *, signed: bool = False, no_write: str = "", rule=None,
                 **smoke_values) -> BenchParser:
    """A benchmark's parser: --bundle and --key (both required) when `signed`, a --no-write flag when `no_write` (its
    help) and --smoke (`smoke_help`), which sets `smoke_values` (and no_write: a smoke run writes nothing) on the
    parsed args (rule: another rule instead); the script adds its own options."""
    values = {"no_write": True, **smoke_values} if no_write else smoke_values
    ap = BenchParser(doc, rule or (lambda _ap, a: smoke(a, **values)))
    if signed:
        ap.add_argument("--bundle", required=True, help="signed bundle or manifest to load")
        ap.add_argument("--key", required=True, help="trusted public key (file or folder)")
    if no_write:
        ap.add_argument("--no-write", action="store_true", help=no_write)
    ap.add_argument("--smoke", action="store_true", help=smoke_help)
    return ap


def gemm_parser(doc: str, default_shapes: str, smoke_shapes: str, *, signed: bool = False,
                symbols: str = "") -> BenchParser:
    """bench_parser with the GEMM benchmarks' --iters (timed launches per figure), --shapes (MxNxK list) and, with
    `symbols` (what they are), --symbols (comma-separated substrings; matching() applies them), and their rule: --smoke takes `smoke_shapes` at 5 samples; otherwise --iters must be at least 20 (fewer samples give
    no stable median)."""

    def rule(ap, a):
        if a.smoke:
            a.iters, a.shapes = 5, smoke_shapes
        elif a.iters < 20:
            ap.error("--iters must be at least 20")
        return a

    ap = bench_parser(doc, f"{smoke_shapes} only, 5 samples; nothing written", signed=signed, rule=rule)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--shapes", default=default_shapes)
    if symbols:
        ap.add_argument("--symbols", default="", help=f"comma-separated substrings: only matching {symbols}")
    return ap


def matching(names, substrings: str) -> list[str]:
    """The names (in their order) holding any of the comma-separated `substrings`; all of them when there are none."""
    wanted = [w for w in substrings.split(",") if w]
    return [n for n in names if not wanted or any(w in n for w in wanted)]


def bandwidth_parser(doc: str, smoke_help: str, results: str, **smoke_values) -> BenchParser:
    """bench_parser with the bandwidth benchmarks' --reps and --only, and their rule (reps_or_smoke: --smoke sets
    `smoke_values` and no_write; --reps at least 20 otherwise); --no-write keeps `results` as they are."""
    ap = bench_parser(doc, smoke_help, no_write=f"do not append to {results}",
                      rule=lambda ap, a: reps_or_smoke(ap, a, no_write=True, **smoke_values))
    ap.add_argument("--reps", type=int, default=25, help="timed launches per kernel (median; at least 20)")
    ap.add_argument("--only", default="", help="run only kernels whose name contains this")
    return ap


def smoke(a: argparse.Namespace, **values) -> argparse.Namespace:
    """With --smoke, set `values` on parsed args `a` (fewer samples, nothing written). Returns `a`."""
    if a.smoke:
        for name, value in values.items():
            setattr(a, name, value)
    return a


def reps_or_smoke(ap: argparse.ArgumentParser, a: argparse.Namespace, **values) -> argparse.Namespace:
    """The bandwidth benchmarks' rule on parsed args `a` of parser `ap`: --smoke sets `values`; otherwise --reps
    must be at least 20 (fewer samples give no stable median). Returns `a`."""
    if not a.smoke and a.reps < 20:
        ap.error("--reps must be at least 20")
    return smoke(a, **values)


def shapes(text: str) -> list[tuple[int, ...]]:
    """'4096x4096x4096,1024x4096x4096' -> [(4096, 4096, 4096), (1024, 4096, 4096)]."""
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]


def utc_stamp(fmt: str = "%Y-%m-%d %H:%M") -> str:
    """Now, UTC, as the result tables date their rows."""
    return datetime.datetime.now(datetime.UTC).strftime(fmt)


def append_table(path: Path, intro: str, lines: Iterable[str]) -> None:
    """Append `lines` (each ending in a newline) to the results table at `path`, writing `intro` (its title and
    header) first when the file is new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", encoding="utf-8") as f:
        if new:
            f.write(intro)
        f.writelines(lines)


def torch_dtype(token: str):
    """The torch dtype of a catalog dtype token."""
    import torch

    return {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "f16": torch.float16,
            "i32": torch.int32, "i64": torch.int64, "u32": torch.uint32, "u8": torch.uint8}[token]


def device_values(count: int, dtype: str, lo: float = -1.0, hi: float = 1.0):
    """A torch CUDA tensor of `count` values of `dtype` uniform in [lo, hi), drawn on the GPU (integer dtypes: zeros,
    as counters and steps start)."""
    import torch

    tdt = torch_dtype(dtype)
    if not tdt.is_floating_point:
        return torch.zeros(count, dtype=tdt, device="cuda")
    return (torch.rand(count, device="cuda") * (hi - lo) + lo).to(tdt)


def load_signed(bundle: str, key: str):
    """The runtime's kernels from a signed bundle or manifest, trusting `key` (a public key file, or a folder whose
    *.pub files are all trusted)."""
    from mamba_forge.runtime import load

    keys = sorted(Path(key).glob("*.pub")) if Path(key).is_dir() else [Path(key)]
    return load(bundle, trusted_keys=keys)


def register_signed(bundle: str, key: str):
    """load_signed's kernels, registered as the torch.ops.mamba_forge operators (mamba_forge.runtime.torch)."""
    import mamba_forge.runtime.torch as mft

    kernels = load_signed(bundle, key)
    mft.register(kernels)
    return kernels


def cuda_device():
    """torch's CUDA context made (an allocation, so first-use costs stay out of any timing); device 0's properties."""
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    return torch.cuda.get_device_properties(0)


def table_lines(rows, formats: tuple[str, ...]) -> list[str]:
    """Results-table lines ("| a | b | ... |\n") of tuples `rows`: field i with format spec formats[i] ("": as is);
    fields past the formats are left out (the summary records' own)."""
    return ["| " + " | ".join(format(r[i], f) for i, f in enumerate(formats)) + " |\n" for r in rows]


def write_results(path: Path, intro: str, lines: list[str], records: list[dict]) -> None:
    """append_table(path, intro, lines), then `records` (if any) into benchmarks/results/summary.json, saying what
    was written."""
    import summary  # benchmarks/summary.py

    append_table(path, intro, lines)
    print(f"wrote {len(lines)} rows to {path}")
    if records:
        summary.append(records)
        print(f"recorded {len(records)} results in benchmarks/results/summary.json")
