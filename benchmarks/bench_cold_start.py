"""Cold start on the GPU: verify + load every admitted module of a signed bundle for this device, against
compiling the same modules with NVRTC at process start (how the reference library boots), both in this run.

Each measurement runs in a fresh Python process; the CUDA context is made current before the clock starts in
both paths (an engine has one either way), and imports are timed apart. The load is measured from the .tar.gz
bundle and from the same bundle unpacked to a folder. NVRTC keeps its own compute cache (~/.nv/ComputeCache on
the GPU machine): the compile path is measured cold (an empty CUDA_CACHE_PATH, as on a fresh machine or
container) and then warm (the same cache path again). Goal: load under 100 ms and at least 50x faster than
compiling.

    python benchmarks/bench_cold_start.py --bundle dist/h200.tar.gz --key manifests/keys
    python benchmarks/bench_cold_start.py                    # builds and qualifies every module here first
    python benchmarks/bench_cold_start.py --module Fixed     # ... only these module kinds

    python benchmarks/bench_cold_start.py --imports-only     # the import alone (no GPU): median of 21 processes
    python benchmarks/bench_cold_start.py --smoke --bundle dist/h200.tar.gz --key manifests/keys
                                # 2 loads, 3 imports, no compile: seconds; nothing written

Also timed, in fresh processes (median of --import-runs, 21): `import mamba_forge.runtime` (goal <= 80 ms) and
with `load` taken from it (the loader's modules; cryptography follows in load()), and the load split into load()
(signature, table, records) and load_all() (cubins). Prints a table and writes benchmarks/results/cold_start.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOAD_GOAL_MS, RATIO_GOAL, IMPORT_GOAL_MS = 100.0, 50.0, 80.0
SMOKE_NEEDS_BUNDLE = True  # --smoke times a given bundle (tests/gpu/test_benchmarks_smoke.py skips it without one)

LOAD_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import mamba_forge.runtime as rt
t1 = time.perf_counter()
rt.load  # the loader's modules (names resolve on first use): what `from mamba_forge.runtime import load` costs
t2 = time.perf_counter()
from mamba_forge.gpu import driver as cu
t3 = time.perf_counter()
cu.init(); cu.Device(0).make_current()
t4 = time.perf_counter()
k = rt.load(sys.argv[1], trusted_keys=[sys.argv[2]])
t5 = time.perf_counter()
modules = k.load_all()
t6 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "import_load_s": t2 - t0, "driver_import_s": t3 - t2, "context_s": t4 - t3,
                  "load_s": t6 - t4, "verify_s": t5 - t4, "modules_s": t6 - t5, "modules": modules,
                  "symbols": len(k.admitted())}))
"""

# no GPU needed: the import alone, in a fresh process (`-X importtime` shows what it is made of)
IMPORT_CHILD = r"""
import json, time
t0 = time.perf_counter()
import mamba_forge.runtime as rt
t1 = time.perf_counter()
from mamba_forge.runtime import load  # noqa: F401
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "import_load_s": t2 - t0}))
"""

COMPILE_CHILD = r"""
import json, sys, time
from pathlib import Path
want = json.loads(sys.argv[1])  # {"target": ..., "state_capacity": ..., "symbols": {module: [names]}}
t0 = time.perf_counter()
from mamba_forge.gpu import driver as cu
from mamba_forge.build import nvrtc
from mamba_forge.build.builder import BuildRequest, plan
from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.catalog.targets import get_target
req = BuildRequest(load_catalog(default_catalog_path()), [get_target(want["target"])], Path(sys.argv[2]),
                   state_capacity=want["state_capacity"], cache_location=None)
jobs = [j for j in plan(req) if j.module.kind in want["symbols"]]
t1 = time.perf_counter()
cu.init(); cu.Device(0).make_current()
t2 = time.perf_counter()
for j in jobs:
    r = nvrtc.compile_program(j.source, j.program_name, j.options, j.headers, want_ptx=False)
    if not r.ok:
        raise SystemExit(f"{j.module.kind} failed to compile: {r.log[:400]}")
    mod = cu.Module(r.cubin)
    for name in want["symbols"][j.module.kind]:
        mod.function(name)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "context_s": t2 - t1, "compile_s": t3 - t2, "modules": sorted(j.module.kind for j in jobs)}))
"""


def sh(cmd: list[str], timeout: float, env: dict | None = None) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                         env=None if env is None else {**os.environ, **env})
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return res.stdout


def prepare(args, work: Path) -> tuple[Path, Path]:
    """A bundle and its public key: given, or built and qualified here."""
    if args.bundle:
        return Path(args.bundle), Path(args.key)
    from mamba_forge.manifest.bundle import write_bundle
    from mamba_forge.runtime import signing
    from mamba_forge.runtime.trust import trusted_keys

    build = work / "build"
    sh([sys.executable, "-m", "mamba_forge.cli", "build", "--arch", args.arch, "--out", str(build), "-q"], 1800)
    priv, pub, _ = signing.write_keypair(work / "keys", "bench")
    cmd = [sys.executable, "-m", "mamba_forge.cli", "qualify", "--build", str(build), "--level", "quick", "--sign-key",
           str(priv), "--out", str(work / "manifest.toml"), "-q"]
    for m in args.module or []:
        cmd += ["--module", m]
    sh(cmd, 3600)
    return write_bundle(work / "manifest.toml", work / "bundle.tar.gz", keys=trusted_keys([pub], defaults=False),
                        build=build), pub


def unpack(bundle: Path, folder: Path) -> Path:
    """The .tar.gz bundle as a folder bundle (what an engine would install)."""
    from mamba_forge.runtime.sources import read_tar_bundle

    for name, data in read_tar_bundle(bundle).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def import_rows(runs: int) -> list[tuple[str, float, float, int]]:
    """`import mamba_forge.runtime` and `from mamba_forge.runtime import load`, each run a fresh process."""
    rs = [json.loads(sh([sys.executable, "-c", IMPORT_CHILD], 60)) for _ in range(runs)]
    return [(name, statistics.median(r[k] for r in rs) * 1e3, min(r[k] for r in rs) * 1e3, runs)
            for name, k in (("import mamba_forge.runtime", "import_s"),
                            ("import mamba_forge.runtime + its load (the loader's modules)", "import_load_s"))]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", help="a signed bundle (.tar.gz or folder), manifest or index")
    ap.add_argument("--key", help="its public key file or folder (with --bundle)")
    ap.add_argument("--module", action="append", help="qualify only these module kinds (without --bundle)")
    ap.add_argument("--arch", default="sm_90a", help="build target when building here")
    ap.add_argument("--load-runs", type=int, default=9)
    ap.add_argument("--import-runs", type=int, default=21, help="fresh processes timing the import alone")
    ap.add_argument("--no-compile", action="store_true",
                    help="time the load paths and imports only (no NVRTC compile of the same modules, no ratio)")
    ap.add_argument("--imports-only", action="store_true",
                    help="time only the import (no GPU needed); prints, writes nothing")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cold_start.md"))
    ap.add_argument("--smoke", action="store_true",
                    help="a given bundle: 2 loads, 3 imports, no compile; seconds, nothing written")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    ap = parser()
    args = ap.parse_args(argv)
    if bool(args.bundle) != bool(args.key):
        ap.error("--bundle and --key go together")
    if args.smoke:
        args.load_runs, args.import_runs, args.no_compile = min(args.load_runs, 2), min(args.import_runs, 3), True
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke and not args.bundle and not args.imports_only:
        parser().error("--smoke times a given bundle: pass --bundle and --key (building one here takes minutes)")
    if args.imports_only:
        for name, m, lo, n in import_rows(args.import_runs):
            goal = f" (goal <= {IMPORT_GOAL_MS:.0f} ms)" if name == "import mamba_forge.runtime" else ""
            print(f"{name}: median {m:.1f} ms, min {lo:.1f} ms, {n} fresh processes{goal}")
        return 0

    from mamba_forge.gpu import driver as cu
    from mamba_forge.runtime import load

    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="mf-cold-") as tmp:
        work = Path(tmp)
        bundle, key = prepare(args, work)
        # a private, empty cache: the first load checks the whole body and writes the verified-body memo
        # (runtime/memo.py) that every later load of the same bytes takes; that first load is timed on its own
        memo_cache = work / "cache"
        memo_cache.mkdir(mode=0o700)
        os.environ["MAMBA_FORGE_CACHE"] = str(memo_cache)
        first_load = json.loads(sh([sys.executable, "-c", LOAD_CHILD, str(bundle), str(key)], 300))
        k = load(bundle, trusted_keys=[key])  # also checks the bundle is for this GPU before timing anything
        info = cu.Device(0).info()
        symbols: dict[str, list[str]] = {}
        for name in k.admitted():
            symbols.setdefault(k.symbol(name).module, []).append(name)
        targets = {k.symbol(n).target for n in k.admitted()}
        if len(targets) != 1:
            raise SystemExit(f"admitted symbols span targets {sorted(targets)}; expected one")
        want = {"target": targets.pop(), "state_capacity": k.manifest.state_capacity, "symbols": symbols}
        sources = {"tar.gz bundle": bundle}
        if Path(bundle).name.endswith((".tar.gz", ".tgz")):
            sources["folder bundle"] = unpack(Path(bundle), work / "unpacked")

        loads = {what: [json.loads(sh([sys.executable, "-c", LOAD_CHILD, str(src), str(key)], 300))
                        for _ in range(args.load_runs)] for what, src in sources.items()}
        # NVRTC's compute cache on (mamba_forge.build.nvrtc turns it off otherwise), at an empty path: the first compile
        # is cold, the second finds its programs there
        nvrtc_cache = {"CUDA_CACHE_PATH": str(work / "nvrtc-cache"), "CUDA_CACHE_DISABLE": "0"}
        compiles = {} if args.no_compile else {
            what: json.loads(sh([sys.executable, "-c", COMPILE_CHILD, json.dumps(want), str(work / "c")], 1800,
                                env=nvrtc_cache))
            for what in ("cold", "warm")}

    imports = import_rows(args.import_runs)
    import_ms = imports[0][1]
    first_rs = next(iter(loads.values()))
    first = first_rs[0]
    if first["modules"] != len(symbols) or (compiles and compiles["cold"]["modules"] != sorted(symbols)):
        raise SystemExit(f"compiled {compiles and compiles['cold']['modules']} but loaded {first['modules']} of "
                         f"{sorted(symbols)}")
    load_ms = {what: med(r["load_s"] for r in rs) * 1e3 for what, rs in loads.items()}
    cold_ms, warm_ms = ((compiles[w]["compile_s"] * 1e3 for w in ("cold", "warm")) if compiles
                        else (float("nan"), float("nan")))
    rows = [(f"verify + load, {what} (runtime)", load_ms[what], min(r["load_s"] for r in rs) * 1e3, len(rs))
            for what, rs in loads.items()]
    first_ms = first_load["load_s"] * 1e3
    rows += [("verify + load, tar.gz bundle, first on this machine (whole body checked, memo written; not counted)",
              first_ms, first_ms, 1)]
    rows += [
        ("compile + load, NVRTC cold (empty compute cache)", cold_ms, cold_ms, 1),
        ("compile + load, NVRTC warm (its compute cache hit)", warm_ms, warm_ms, 1),
    ] if compiles else []
    rows += [(f"  of which {part}, {what}", med(r[k] for r in rs) * 1e3, min(r[k] for r in rs) * 1e3, len(rs))
             for what, rs in loads.items() for part, k in (("load() (verify, table, records)", "verify_s"),
                                                            ("load_all() (cubins checked and loaded)", "modules_s"))]
    rows += imports
    rows += [(name, med(r[k] for r in first_rs) * 1e3, min(r[k] for r in first_rs) * 1e3, len(first_rs))
             for name, k in (("import mamba_forge.gpu.driver (cuda-bindings; not counted)", "driver_import_s"),
                             ("CUDA context (both paths, not counted)", "context_s"))]
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    worst = max(load_ms.values())
    ratio, ratio_warm = cold_ms / worst, warm_ms / worst
    lines = [
        "# Cold start: verify + load vs NVRTC compile at process start", "",
        f"{now}; {info.name} (cc {info.cc_text}, {info.sm_count} SMs, driver {info.driver_version}); "
        f"{first['modules']} module(s) of target {want['target']} ({', '.join(sorted(symbols))}), {first['symbols']} "
        f"admitted symbols, every function resolved and its shared-memory limit set; bundle `{Path(bundle).name}`. "
        "Fresh process per run; medians.", "",
        "| path | median ms | min ms | runs |", "| --- | ---: | ---: | ---: |",
        *[f"| {name} | {m:.1f} | {lo:.1f} | {n} |" for name, m, lo, n in rows], "",
        (f"Ratio cold compile / load (slower load path): **{ratio:.0f}x** (goal >= {RATIO_GOAL:.0f}x: "
         f"{'met' if ratio >= RATIO_GOAL else 'NOT met'}); against NVRTC's warm compute cache: {ratio_warm:.0f}x. "
         if compiles else "Compile path not timed (--no-compile). ") +
        f"Load {worst:.1f} ms (goal < {LOAD_GOAL_MS:.0f} ms: {'met' if worst < LOAD_GOAL_MS else 'NOT met'}). "
        f"Import {import_ms:.1f} ms (goal <= {IMPORT_GOAL_MS:.0f} ms: {'met' if import_ms <= IMPORT_GOAL_MS else 'NOT met'}; "
        f"median of {args.import_runs} fresh processes).", "",
        "Command: `python benchmarks/bench_cold_start.py " + " ".join(sys.argv[1:]) + "`",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.smoke:
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import summary

    shape = f"{first['modules']} modules, {first['symbols']} symbols"
    recs = [summary.record(family="cold_start", symbol=f"load {what}", shape=shape, dtype="-", ours=round(ms, 2),
                           baseline=round(cold_ms, 1) if compiles else None,
                           baseline_name="NVRTC cold compile + load" if compiles else "",
                           unit="ms", goal=f"< {LOAD_GOAL_MS:.0f} ms", met=ms < LOAD_GOAL_MS, gpu=info.name)
            for what, ms in load_ms.items()]
    # the first load on a machine (page cache cold) has no goal: it is in the table above, not in the summary
    recs.append(summary.record(family="cold_start", symbol="import mamba_forge.runtime", shape="-", dtype="-",
                               ours=round(import_ms, 2), baseline=None, baseline_name="", unit="ms",
                               goal=f"<= {IMPORT_GOAL_MS:.0f} ms", met=import_ms <= IMPORT_GOAL_MS, gpu=info.name))
    summary.append(recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
