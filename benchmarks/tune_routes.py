"""GEMM route tuning: the fastest rung of a route class per Mamba projection shape and M, as tuning rules.

Times every admitted rung of a multi-rung route class at the model shapes and writes the fastest per (N, K, M) as
kernels/route_tuning.toml's rules (schema: mamba_forge/catalog/route_tuning.py).

The rungs of a class compute the same bits, so which one serves may follow (N, K, M) freely. For each key (--keys,
default nn bf16 and nn f16) and model shape (in_proj, x_proj, dt_proj, out_proj of d_model 1024 and 2560), the
class is the one the bundle's selector serves at (N, K); each of its rungs is forced by name through kernels.gemm
and checked bit-identical to the class reference on the same inputs (a rung that differs anywhere is dropped and
reported, and the run exits 1), then timed as GPU time in CUDA graphs (10 calls per replay, median of --reps
replays), as is cuBLAS (torch.matmul) in the same run. Per shape the winners at the measured M are merged into
M ranges (a winner within --tie of the fastest keeps the previous M's winner; a range ends at the geometric mean
of the last M it won and the next measured M; the last is unbounded).

Writes route_tuning.toml (the table, its header naming the GPU, the date and every measured time) and
route_tuning_timings.json into --out (default benchmarks/results/route_tuning); --write also replaces
kernels/route_tuning.toml in place (temporary file + rename, after the catalog's own checks pass on it; the
whole table: keys not measured in this run lose their rules; with --merge only the measured shapes' rules change,
every other shape's stay with their comments). Re-qualify to carry the table into a manifest.
--heads D,...: also the language-model head's GEMM at each d_model (N 50280, K d_model; --d-models= for the heads
alone).
Appends each shape's tuned time against cuBLAS and one row for the goal "every projection GEMM at least 0.9x
cuBLAS" to benchmarks/results/summary.json.

    python benchmarks/tune_routes.py --bundle h200.tar.gz --key manifests/keys [--write] [--smoke]

--smoke: nn bf16, d1024 x_proj at M 1 and 2048, 3 replays; seconds; writes into a temporary folder only.
--class NAME: measure that class of each key's route (where its region holds the shape) instead of the one served,
to compare classes before kernels/routes.toml changes which serves an (N, K); nothing written in place or recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from summary import append, record  # noqa: E402  (benchmarks/summary.py)
from timing import capture_graph, median_ms  # noqa: E402  (benchmarks/timing.py)
from tuning_table import (  # noqa: E402  (benchmarks/tuning_table.py: the table's pure parts)
    TIMINGS,
    _us,
    merge_tables,
    pick_winners,
    render_table,
    shape_times,
)

from mamba_forge.core.fsio import write_atomic  # noqa: E402  (temporary file + rename, fsynced)

TABLE = HERE.parent / "kernels" / "route_tuning.toml"
CATALOG = HERE.parent / "kernels" / "catalog.toml"
OUT = HERE / "results" / "route_tuning"
M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 2048, 8192, 16384)
D_MODELS = (1024, 2560)
KEYS = "nn:bf16,nn:f16"
INNER = 10  # calls per graph replay
GOAL = 0.9  # every projection GEMM at least 0.9x cuBLAS (issue 25)
DTYPES = ("bf16", "f16", "f32", "tf32")
HEAD_VOCAB = 50280  # mamba-ssm's GPT-NeoX vocabulary padded to a multiple of 8 (the published checkpoints')


def head_shape(d_model: int) -> tuple[str, int, int]:
    """(name, N, K) of a language model's head: logits = hidden [M, d_model] @ lm_head.weight^T [d_model, vocab]."""
    return (f"d{d_model} lm_head", HEAD_VOCAB, d_model)


def model_shapes(d_model: int) -> list[tuple[str, int, int]]:
    """(name, N, K) of a Mamba-1 layer's projections (expand 2, d_state 16, dt_rank ceil(d_model / 16))."""
    d_inner, dt_rank = 2 * d_model, math.ceil(d_model / 16)
    return [(f"d{d_model} in_proj", 2 * d_inner, d_model), (f"d{d_model} x_proj", dt_rank + 32, d_inner),
            (f"d{d_model} dt_proj", d_inner, dt_rank), (f"d{d_model} out_proj", d_model, d_inner)]


# ---- pure parts: the summary rows (the table's: benchmarks/tuning_table.py) -------------------------------------


def summary_records(results: dict) -> list[dict]:
    """Per (key, shape, M) the tuned rung's time against cuBLAS, and per key the goal's row: the worst ratio."""
    recs, worst = [], {}
    for e in results["entries"]:
        layout, a, _b, _c = e["key"]
        for shape in e["shapes"]:
            times = shape_times(shape, e["dropped"])
            for m, sym in pick_winners(times, results["tie"]).items():
                ours, ref = times[m][sym], shape["M"][str(m)]["cublas"]
                worst[(layout, a)] = min(worst.get((layout, a), math.inf), ref / ours)
                recs.append(record(family="route_tuning", symbol=f"{layout} {a} tuned rung",
                                   shape=f"{shape['name']} M{m} N{shape['N']} K{shape['K']}", dtype=a,
                                   ours=round(ours, 5), baseline=round(ref, 5),
                                   baseline_name=f"cuBLAS (torch.matmul) in CUDA graphs; served by {sym}", unit="ms",
                                   goal=f">= {GOAL}x cuBLAS", met=ref / ours >= GOAL, gpu=results["gpu"]))
        if e["dropped"]:
            worst[(layout, a)] = 0.0  # a rung off its class's bits: the goal is not met whatever the times
    for (layout, a), ratio in sorted(worst.items()):
        recs.append(record(family="route_tuning", symbol=f"{layout} {a} every projection GEMM (tuned)",
                           shape="worst of the model shapes", dtype=a, ours=round(ratio, 3), baseline=None,
                           baseline_name="cuBLAS (torch.matmul), same run", unit="x cuBLAS (lowest ratio)",
                           goal=f"every projection GEMM at least {GOAL}x cuBLAS", met=ratio >= GOAL,
                           gpu=results["gpu"], speedup=round(ratio, 3)))
    return recs


def check_table(text: str, catalog_path: Path = CATALOG) -> None:
    """The catalog's own rules on a table before it is written (CatalogError when refused): against the catalog's
    routes with their current tuning removed, as a load of the new table would see them."""
    from mamba_forge.catalog.model import load_catalog
    from mamba_forge.catalog.route_tuning import apply_tuning

    cat = load_catalog(catalog_path)
    untuned = tuple(dataclasses.replace(r, tuning=()) for r in cat.routes)
    apply_tuning(tomllib.loads(text), catalog_path.parent / TABLE.name, untuned, cat)


# ---- the device side ---------------------------------------------------------------------------------------------


def _tokens(dt: str) -> tuple[str, str, str | None]:
    """(A/B token, C token, kernels.gemm math=) of a --keys dtype."""
    return ("tf32", "f32", "tf32") if dt == "tf32" else (dt, dt, None)


def measure_key(torch, kernels, layout: str, dt: str, shapes, ms_list, reps: int,
                eq_class: str | None = None) -> list[dict]:
    """One entry per (key, class) served at the shapes: every serving rung of the class, checked and timed.
    `eq_class`: that class of the key's route instead of the one served, at the shapes its region holds (to
    compare classes: which class serves an (N, K) is routes.toml's choice, never the tuner's)."""
    from mamba_forge.runtime.errors import LaunchRefused
    from mamba_forge.runtime.routes import NoRoute

    a_tok, c_tok, mathopt = _tokens(dt)
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}.get(dt, torch.float32)
    bits = torch.int16 if tdt != torch.float32 else torch.int32
    torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
    entries: dict[tuple, dict] = {}

    def route(m, n, k, symbol=None):
        try:
            return kernels.gemm_route(m, n, k, a_tok, a_tok, c_tok, layout, symbol=symbol)
        except NoRoute:
            return None

    def launcher(A, B, C, symbol: str):
        return lambda: kernels.gemm(A, B, C, layout=layout, math=mathopt, symbol=symbol)

    def gpu_ms(fn) -> float:
        g = capture_graph(fn, INNER)
        t = median_ms(g.replay, reps, warmup=2) / INNER
        del g
        return t

    for name, N, K in shapes:
        served = next((r for m in ms_list if (r := route(m, N, K)) is not None), None)
        if served is None or served.cast:
            print(f"{layout} {dt} {name}: {'no route' if served is None else 'served with casts'}; not tuned")
            continue
        key = (layout, served.a, served.b, served.c)
        qroute = next(r for r in kernels.manifest.routes if (r.layout, r.a, r.b, r.c) == key)
        if eq_class is not None:  # the named class where its region holds (N, K): its reference rung serves there
            if not any(x.eq_class == eq_class and x.mode == "auto" and (x.m_min, x.m_max) == (1, 0)
                       and route(1, N, K, x.symbol) is not None for x in qroute.rungs):
                print(f"{layout} {dt} {name}: class {eq_class} does not serve (N {N}, K {K}) here; not measured")
                continue
            served = dataclasses.replace(served, eq_class=eq_class)
        members = [x for x in qroute.rungs if x.mode == "auto" and x.eq_class == served.eq_class]
        if len(members) < 2:
            print(f"{layout} {dt} {name}: class {served.eq_class} has one rung; nothing to tune")
            continue
        e = entries.setdefault((key, served.eq_class), {"key": list(key), "class": served.eq_class, "dropped": {},
                                                       "shapes": []})
        g = torch.Generator(device="cuda").manual_seed(N * 7919 + K)
        B = (torch.rand((N, K) if layout == "nt" else (K, N), generator=g, device="cuda") * 2 - 1).to(tdt)
        rows = {}
        for M in ms_list:
            A = (torch.rand((K, M) if layout == "tn" else (M, K), generator=g, device="cuda") * 2 - 1).to(tdt)
            serving = [x for x in members if x.symbol not in e["dropped"] and route(M, N, K, x.symbol) is not None]
            ref = next((x.symbol for x in serving if (x.m_min, x.m_max) == (1, 0)), None)
            if ref is None:
                continue
            run = {x.symbol: launcher(A, B, torch.empty((M, N), dtype=tdt, device="cuda"), x.symbol)
                   for x in serving}  # each rung its own C, so every output is compared with the reference's
            outs = {}
            for sym, fn in run.items():
                try:
                    outs[sym] = fn().view(bits)
                except LaunchRefused as exc:  # a launch the runtime refuses here: not a candidate, the run goes on
                    print(f"{sym} refused at {name} M={M}: {exc}")
            if ref not in outs:
                continue
            row = {"served": route(M, N, K).symbol, "reference": ref, "rungs": {}}
            for sym, fn in run.items():
                if sym not in outs:
                    continue
                if not torch.equal(outs[sym], outs[ref]):
                    e["dropped"][sym] = f"differs from {ref} at {name} M {M}"
                    print(f"MISMATCH: {sym} differs from its class reference {ref} at {name} M={M}; dropped")
                    continue
                row["rungs"][sym] = gpu_ms(fn)
            a_op, b_op = A.t() if layout == "tn" else A, B.t() if layout == "nt" else B
            Cc = torch.empty((M, N), dtype=tdt, device="cuda")
            row["cublas"] = gpu_ms(lambda a_op=a_op, b_op=b_op, Cc=Cc: torch.matmul(a_op, b_op, out=Cc))
            rows[str(M)] = row
            best = min(row["rungs"], key=row["rungs"].__getitem__)
            now = row["rungs"].get(row["served"])
            print(f"{layout} {dt} {name:16s} M={M:5d}  best {best} {_us(row['rungs'][best])} "
                  f"({row['cublas'] / row['rungs'][best]:.2f}x cuBLAS {_us(row['cublas'])}); served now by "
                  f"{row['served']}" + (f" {_us(now)}" if now else ""), flush=True)
        e["shapes"].append({"name": name, "N": N, "K": K, "M": rows})
        del B
        torch.cuda.empty_cache()
    return list(entries.values())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True, help="signed bundle or manifest to load (qualified on this GPU)")
    p.add_argument("--key", required=True, help="trusted public key (file or folder of *.pub)")
    p.add_argument("--smoke", action="store_true", help="nn bf16, d1024 x_proj at M 1 and 2048, 3 replays; seconds; "
                   "writes into a temporary folder only")
    p.add_argument("--out", type=Path, help=f"folder for the table and the timings (default {OUT})")
    p.add_argument("--write", action="store_true", help=f"also replace {TABLE} (checked, temporary file + rename)")
    p.add_argument("--merge", action="store_true", help="with --write: replace only the measured shapes' rules, "
                   "keeping every other shape's (tune a new width without measuring the old ones again)")
    p.add_argument("--keys", default=KEYS, help="layout:dtype list (dtype bf16, f16, f32 or tf32)")
    p.add_argument("--d-models", default=",".join(map(str, D_MODELS)), help="the layers' widths (empty: none)")
    p.add_argument("--heads", default="", help=f"d_model list: also the language-model head at each (N {HEAD_VOCAB}, "
                   "K d_model; MambaLMHeadModel's logits GEMM)")
    p.add_argument("--ms", default=",".join(map(str, M_VALUES)), help="the M values measured")
    p.add_argument("--reps", type=int, default=10, help="graph replays per figure (median; at least 5)")
    p.add_argument("--tie", type=float, default=0.02, help="a previous winner within this fraction keeps winning")
    p.add_argument("--no-record", action="store_true", help="no benchmarks/results/summary.json rows")
    p.add_argument("--class", dest="eq_class", help="measure this route class (where its region holds) instead of "
                   "the one served: compares classes; with it nothing is written in place or recorded")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    try:
        a.keys = [tuple(x.strip().split(":")) for x in a.keys.split(",") if x.strip()]
        a.d_models = [int(x) for x in a.d_models.split(",") if x.strip()]
        a.heads = [int(x) for x in a.heads.split(",") if x.strip()]
        a.ms = sorted({int(x) for x in a.ms.split(",") if x.strip()})
    except ValueError as exc:
        p.error(f"--keys, --d-models and --ms are comma-separated lists: {exc}")
    for k in a.keys:
        if len(k) != 2 or k[0] not in ("nn", "nt", "tn") or k[1] not in DTYPES:
            p.error(f"--keys takes layout:dtype (layout nn, nt or tn; dtype {', '.join(DTYPES)}), not {':'.join(k)}")
    if not a.keys or not a.ms or min(a.ms) < 1 or not (a.d_models or a.heads) or min(a.d_models + a.heads) < 16:
        p.error("--keys and --ms (each >= 1) need at least one value, and --d-models or --heads (each >= 16)")
    if a.reps < 5 or not 0 <= a.tie < 0.5:
        p.error("--reps must be at least 5 and --tie in [0, 0.5)")
    if a.merge and not a.write:
        p.error("--merge merges into the committed table: add --write")
    if a.eq_class and a.write:
        p.error("--class measures a class for comparison only: drop --write")
    if a.eq_class:
        a.no_record = True
    if a.smoke:
        if a.write:
            p.error("--smoke writes nothing in place: drop --write")
        a.keys, a.d_models, a.heads, a.ms, a.reps, a.no_record = [("nn", "bf16")], [1024], [], [1, 2048], 3, True
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch

    from mamba_forge.runtime import load

    started = time.perf_counter()
    kernels = load(a.bundle, trusted_keys=[a.key])
    props = torch.cuda.get_device_properties(0)
    shapes = [s for d in a.d_models for s in model_shapes(d) if not a.smoke or s[0].endswith("x_proj")]
    shapes += [head_shape(d) for d in a.heads]
    shapes = list({(n, k): (name, n, k) for name, n, k in shapes}.values())  # one rule set per (N, K)
    results = {"gpu": f"{props.name} ({props.multi_processor_count} SMs)", "torch": torch.__version__,
               "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "inner": INNER,
               "reps": a.reps, "tie": a.tie, "entries": []}
    for layout, dt in a.keys:
        results["entries"] += measure_key(torch, kernels, layout, dt, shapes, a.ms, a.reps, a.eq_class)
    return emit(results, a, started)


def emit(results: dict, a: argparse.Namespace, started: float) -> int:
    """Write the table and the timings into the output folder (and kernels/, with --write), record the summary
    rows; exit status 1 when a rung was dropped for differing from its class reference."""
    text = render_table(results)
    out = a.out or (Path(tempfile.mkdtemp(prefix="mf-tune-")) if a.smoke else OUT)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / TIMINGS, json.dumps(results, indent=1, sort_keys=True) + "\n")
    write_atomic(out / TABLE.name, text)
    print(f"wrote {out / TABLE.name} and {out / TIMINGS} ({time.perf_counter() - started:.0f} s)")
    if a.write:
        from mamba_forge.core.errors import CatalogError

        if a.merge:
            text = merge_tables(TABLE.read_text(), text)
        try:
            check_table(text)
        except CatalogError as exc:
            print(f"not written: the catalog refuses the table ({exc}); {TABLE} is unchanged")
            return 2
        write_atomic(TABLE, text)
        print(f"{'merged into' if a.merge else 'replaced'} {TABLE}: re-qualify to carry it into a manifest")
    if not a.no_record:
        recs = summary_records(results)
        append(recs)
        print(f"recorded {len(recs)} results in benchmarks/results/summary.json")
    dropped = {s: why for e in results["entries"] for s, why in e["dropped"].items()}
    for s, why in dropped.items():
        print(f"DROPPED {s}: {why} (route-equivalence should have rejected it)")
    return 1 if dropped else 0


if __name__ == "__main__":
    sys.exit(main())
