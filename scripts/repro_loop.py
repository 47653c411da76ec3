"""Loop one module's NVRTC compile in fresh processes and count the distinct outputs (the hardening issue's
reproducibility flake): the same source and options must give the same PTX and cubin every time.

    python scripts/repro_loop.py --kernels 'gemm_bi_f32_f32_n128_s2' --runs 40 [--no-aslr] [-j 2]
    python scripts/repro_loop.py --module Fixed --runs 12 --keep /tmp/ptx

Each run is a fresh interpreter (`--no-aslr`: started under `setarch -R`, address randomisation off). Prints one
line per run (sha256 prefixes of PTX and cubin, and the compile time) and a summary; exit 1 when outputs differ
(`--cubin-only`: when cubins differ).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import hashlib, json, pickle, sys, time
from mamba_forge.build import nvrtc
job = pickle.load(open(sys.argv[1], "rb"))
t0 = time.perf_counter()
res = nvrtc.compile_program(job["source"], job["name"], job["options"], job["headers"])
print(json.dumps({"ptx": hashlib.sha256(res.ptx).hexdigest(), "cubin": hashlib.sha256(res.cubin).hexdigest(),
                  "seconds": round(time.perf_counter() - t0, 2), "ok": res.ok}))
if len(sys.argv) > 2:
    open(sys.argv[2], "wb").write(res.ptx)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="gemm_bi_f32_f32_n128_s2")
    ap.add_argument("--module", help="a whole module kind instead of --kernels (e.g. Fixed)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--no-aslr", action="store_true", help="run each compile under setarch -R")
    ap.add_argument("--keep", type=Path, help="folder to keep each distinct PTX in")
    ap.add_argument("--drop-option", action="append", default=[], help="leave this compile option out (repeatable)")
    ap.add_argument("--cubin-only", action="store_true",
                    help="exit 0 when every cubin agrees, whatever the PTX (NVRTC 13.0's PTX of the exact-f32 GEMMs "
                         "varies; the cubin is what is signed)")
    args = ap.parse_args()

    from mamba_forge.build import builder
    from mamba_forge.catalog.model import load_catalog
    from mamba_forge.catalog.select import select_symbols
    from mamba_forge.catalog.targets import get_target

    cat = load_catalog(ROOT / "kernels" / "catalog.toml")
    cat = (cat.narrowed(tuple(m for m in cat.modules if m.kind == args.module)) if args.module
           else select_symbols(cat, [args.kernels]))
    req = builder.BuildRequest(catalog=cat, targets=[get_target(args.arch)], out=Path(tempfile.mkdtemp()),
                               cache_location=None)
    jobs = builder.plan(req)
    if len(jobs) != 1:
        print(f"--kernels {args.kernels!r} spans {len(jobs)} modules; pick symbols of one", file=sys.stderr)
        return 2
    j = jobs[0]
    opts = [o for o in j.options if o not in args.drop_option]
    tmp = Path(tempfile.mkdtemp())
    jf = tmp / "job.pkl"
    jf.write_bytes(pickle.dumps({"source": j.source, "name": f"{j.module.kind}.cu", "options": opts,
                                 "headers": j.headers}))
    prefix = ["setarch", "-R"] if args.no_aslr else []

    def one(i: int) -> dict:
        out = tmp / f"run{i}.ptx"
        p = subprocess.run([*prefix, sys.executable, "-c", CHILD, str(jf), str(out)], capture_output=True, text=True,
                           check=True, cwd=ROOT)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r["file"] = out
        return r

    seen: collections.Counter = collections.Counter()
    first: dict[str, Path] = {}
    with cf.ThreadPoolExecutor(args.jobs) as ex:
        for i, r in enumerate(ex.map(one, range(args.runs))):
            seen[(r["ptx"][:12], r["cubin"][:12])] += 1
            first.setdefault(r["ptx"], r["file"])
            print(f"run {i:3d}: ptx {r['ptx'][:12]} cubin {r['cubin'][:12]} {r['seconds']:6.2f} s", flush=True)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        for k, f in first.items():
            (args.keep / f"{k[:12]}.ptx").write_bytes(f.read_bytes())
    print(f"{len(seen)} distinct output(s) in {args.runs} runs ({'no ASLR' if args.no_aslr else 'ASLR on'}): "
          + ", ".join(f"{k[0]}/{k[1]} x{n}" for k, n in seen.most_common()))
    cubins = {k[1] for k in seen}
    print(f"{len(cubins)} distinct cubin(s)")
    return 0 if (len(cubins) if args.cubin_only else len(seen)) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
