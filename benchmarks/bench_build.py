"""Build benchmark: cold build of the whole catalog for the default targets with one worker and with one per CPU,
then a no-change (warm) rebuild. Not a test: prints a table, appends a row to benchmarks/results/build.md and
records (seconds, on the CPU; summary_records below) to benchmarks/results/summary.json.

    python benchmarks/bench_build.py [--catalog PATH] [--jobs N] [--smoke]

--smoke: the tests' one-kernel catalog (tests/fixtures/build_basic) for one target, seconds; nothing recorded.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from summary import append, record  # benchmarks/summary.py

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.catalog.targets import DEFAULT_TARGETS, get_target

RESULTS = Path(__file__).parent / "results" / "build.md"
SMOKE_CATALOG = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "build_basic" / "catalog.toml"
HEADER = (
    "| date | machine | CPUs | programs | symbols | cold, 1 worker (s) | cold, N workers (s) | N | speedup | "
    "warm rebuild (s) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
)
WARM_BUDGET_S = 1.0  # a no-change rebuild: tests/test_full_catalog.py holds the full catalog's to under a second


def timed(catalog, out: Path, cache: Path, jobs: int, targets=DEFAULT_TARGETS):
    req = BuildRequest(catalog, [get_target(t) for t in targets], out, jobs=jobs, cache_location=cache)
    t0 = time.perf_counter()
    m = build(req)
    return time.perf_counter() - t0, m


def private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", type=Path, default=None, help="catalog.toml (default: the built-in catalog)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--smoke", action="store_true",
                    help="the tests' one-kernel catalog for one target, seconds; nothing recorded")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    path = args.catalog or (SMOKE_CATALOG if args.smoke else default_catalog_path())
    targets = DEFAULT_TARGETS[:1] if args.smoke else DEFAULT_TARGETS
    catalog = load_catalog(path)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        serial, m = timed(catalog, tmp / "o1", private(tmp / "c1"), 1, targets)
        parallel, _ = timed(catalog, tmp / "o2", private(tmp / "c2"), args.jobs, targets)
        warm, m2 = timed(catalog, tmp / "o2", tmp / "c2", args.jobs, targets)
    cached = all(x.cached for x in m2.modules)
    assert cached, "warm rebuild missed the cache"
    fig = {"machine": f"{platform.machine()} {platform.python_version()}", "cpus": os.cpu_count(),
           "programs": len(m.modules), "symbols": sum(1 for _ in m.symbols()), "serial": serial, "parallel": parallel,
           "jobs": args.jobs, "warm": warm, "cached": cached}
    row = (
        f"| {datetime.date.today()} | {fig['machine']} | {fig['cpus']} | "
        f"{fig['programs']} | {fig['symbols']} | {serial:.1f} | {parallel:.1f} | {args.jobs} | {serial / parallel:.2f}x | "
        f"{warm:.2f} |\n"
    )
    print(HEADER + row, end="")
    if args.smoke:
        return 0
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if not RESULTS.exists():
        RESULTS.write_text("# Build benchmark (benchmarks/bench_build.py)\n\n" + HEADER)
    with RESULTS.open("a") as f:
        f.write(row)
    append(summary_records(fig))
    return 0


def summary_records(fig: dict) -> list[dict]:
    """summary.json records for one run's figures (seconds on the CPU: gpu ""). No budget is stated for a cold
    build, and a goal-less record with no baseline could only make its met up; so the 1-worker cold build is the
    baseline of the N-worker one (speedup = the parallel speedup the table prints), goal "" and met = parity (N
    workers no slower than one), the encoding bench_scan.py gives its goal-less rows. The no-change rebuild has a
    budget this script checks: every module from the cache (asserted above) and under WARM_BUDGET_S."""
    common = {"family": "build", "dtype": "-", "unit": "s", "gpu": "",
              "shape": f"{fig['programs']} programs, {fig['symbols']} symbols; {fig['machine']}, {fig['cpus']} CPUs"}
    return [
        record(symbol=f"cold build, {fig['jobs']} workers", ours=round(fig["parallel"], 2),
               baseline=round(fig["serial"], 2), baseline_name="the same cold build, 1 worker (same run)", goal="",
               met=fig["parallel"] <= fig["serial"], **common),
        record(symbol=f"no-change rebuild, {fig['jobs']} workers", ours=round(fig["warm"], 3), baseline=None,
               baseline_name="", goal=f"< {WARM_BUDGET_S} s, every module from the cache",
               met=fig["cached"] and fig["warm"] < WARM_BUDGET_S, **common),
    ]


if __name__ == "__main__":
    sys.exit(main())
