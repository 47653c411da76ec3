"""Build benchmark: cold build of the whole catalog for the default targets with one worker and with one per CPU,
then a no-change (warm) rebuild. Not a test: prints a table and appends a row to benchmarks/results/build.md.

    python benchmarks/bench_build.py [--catalog PATH] [--jobs N]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.catalog.targets import DEFAULT_TARGETS, get_target

RESULTS = Path(__file__).parent / "results" / "build.md"
HEADER = (
    "| date | machine | CPUs | programs | symbols | cold, 1 worker (s) | cold, N workers (s) | N | speedup | "
    "warm rebuild (s) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
)


def timed(catalog, out: Path, cache: Path, jobs: int):
    req = BuildRequest(catalog, [get_target(t) for t in DEFAULT_TARGETS], out, jobs=jobs, cache_location=cache)
    t0 = time.perf_counter()
    m = build(req)
    return time.perf_counter() - t0, m


def private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", type=Path, default=default_catalog_path())
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    catalog = load_catalog(args.catalog)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        serial, m = timed(catalog, tmp / "o1", private(tmp / "c1"), 1)
        parallel, _ = timed(catalog, tmp / "o2", private(tmp / "c2"), args.jobs)
        warm, m2 = timed(catalog, tmp / "o2", tmp / "c2", args.jobs)
    assert all(x.cached for x in m2.modules), "warm rebuild missed the cache"
    n_sym = sum(1 for _ in m.symbols())
    row = (
        f"| {datetime.date.today()} | {platform.machine()} {platform.python_version()} | {os.cpu_count()} | "
        f"{len(m.modules)} | {n_sym} | {serial:.1f} | {parallel:.1f} | {args.jobs} | {serial / parallel:.2f}x | "
        f"{warm:.2f} |\n"
    )
    print(HEADER + row, end="")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if not RESULTS.exists():
        RESULTS.write_text("# Build benchmark (benchmarks/bench_build.py)\n\n" + HEADER)
    with RESULTS.open("a") as f:
        f.write(row)


if __name__ == "__main__":
    main()
