"""The summary.json records of the benchmark scripts (benchmarks/summary.py), on CPU: each script's record function
fed rows shaped as the script builds them. Every record carries summary.FIELDS; speedup is baseline / ours (times,
rounded as summary.record does) or our bandwidth over the copy's; met follows the goal, with a row on each side of
it; a row without its baseline has speedup None and is not met; records that two scripts write for the same
(symbol, shape, dtype) agree on their goal; append merges by that key, the latest winning. The scripts import
without torch (benchmarks/ is not a package: it goes on sys.path, as the scripts' own run does)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_build  # noqa: E402
import bench_conv1d  # noqa: E402
import bench_conv_optim  # noqa: E402
import bench_gemm  # noqa: E402
import bench_gemm_f32  # noqa: E402
import bench_gemm_sm90a  # noqa: E402
import bench_memory_bound  # noqa: E402
import bench_scan  # noqa: E402
import bench_sm120_tma  # noqa: E402
import summary  # noqa: E402

GPU = "NVIDIA H200"
SCRIPTS = ("bench_scan", "bench_gemm", "bench_gemm_sm90a", "bench_memory_bound", "bench_sm120_tma", "bench_conv_optim",
           "bench_build")


def fields_ok(recs: list[dict]) -> None:
    assert recs, "no records"
    for r in recs:
        assert set(r) == set(summary.FIELDS), sorted(set(summary.FIELDS) ^ set(r))


def time_speedup_ok(r: dict) -> None:
    assert r["speedup"] == round(r["baseline"] / r["ours"], 3), r


def test_scripts_import_without_torch_or_cupy():
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import {', '.join(SCRIPTS)}; "
            "print([m for m in ('torch', 'cupy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- bench_scan: rows (case, shape, ours ms, peer ms or None, ok, floors, anchor) -----------------------------

SEQ_SHAPE, DECODE_SHAPE = "B8 D2048 L2048 N16", "B1 D2048 N16"


def scan_row(case: str, ratio: float, ok: bool = True, peer: float | None = 0.6):
    t = (peer or 0.6) * ratio
    if case.startswith("decode"):
        return (case, DECODE_SHAPE, t / 50, None if peer is None else peer / 50, ok, "io 0.0041", None)
    anchor = 0.585 if case.startswith("fwd ") else 3.042
    return (case, SEQ_SHAPE, t, peer, ok, "io 0.065 / exp 0.128", anchor)


def test_scan_records_name_the_launched_symbols():
    cases = ["fwd nosave", "fwd save", "fwd+bwd", "fwd+bwd fold", "decode step (graph)"]
    recs = bench_scan.summary_records([scan_row(c, 0.9) for c in cases], GPU)
    fields_ok(recs)
    assert [(r["family"], r["symbol"]) for r in recs] == [
        ("ssm_parallel_scan_fwd_nosave", "ssm_parallel_scan_fwd_nosave_bf16"),
        ("ssm_parallel_scan_fwd", "ssm_parallel_scan_fwd_bf16"),
        ("ssm_parallel_scan_bwd", "ssm_parallel_scan_bwd_bf16"),
        ("ssm_parallel_scan_bwd_fold", "ssm_parallel_scan_bwd_fold_bf16"),
        ("ssm_step_forward_fused", "ssm_step_forward_fused_bf16")]
    assert [r["shape"] for r in recs] == ["B8xD2048xL2048xN16"] * 4 + ["B1xD2048xN16"]
    assert {(r["dtype"], r["unit"], r["gpu"]) for r in recs} == {("bf16", "ms", GPU)}
    assert len({(r["symbol"], r["shape"], r["dtype"]) for r in recs}) == len(recs)
    for r in recs:
        time_speedup_ok(r)


@pytest.mark.parametrize("case, goal, good, bad", [
    ("fwd nosave", "<=1.0x mamba-ssm forward time", 0.99, 1.01),
    ("fwd save", "<=1.0x mamba-ssm forward time", 0.99, 1.01),
    ("fwd+bwd fold", "<=0.9x mamba-ssm fwd+bwd time", 0.89, 0.95),  # 0.95 would meet a 1.0x goal
    ("fwd+bwd", "", 0.99, 1.01),  # no goal: met = parity with mamba-ssm
    ("decode step (graph)", "<=1.0x Triton time", 0.99, 1.01),
])
def test_scan_met_follows_the_goal(case, goal, good, bad):
    (g,), (b,) = (bench_scan.summary_records([scan_row(case, x)], GPU) for x in (good, bad))
    assert g["goal"] == b["goal"] == goal
    assert g["met"] is True and b["met"] is False
    assert g["speedup"] > b["speedup"]
    (failed,) = bench_scan.summary_records([scan_row(case, good, ok=False)], GPU)  # fast but failed a check
    assert failed["met"] is False and failed["speedup"] == g["speedup"]


@pytest.mark.parametrize("case", ["fwd nosave", "fwd save", "fwd+bwd", "fwd+bwd fold", "decode step (graph)"])
def test_scan_without_the_peer_is_not_met(case):
    (r,) = bench_scan.summary_records([scan_row(case, 0.5, peer=None)], GPU)
    fields_ok([r])
    assert r["baseline"] is None and r["speedup"] is None and r["met"] is False
    assert r["ours"] > 0


def test_scan_decode_records_are_bench_decode_step_s():
    """bench_decode_step.py writes the same (symbol, shape, dtype) for its current symbol: same baseline and goal."""
    src = (BENCH / "bench_decode_step.py").read_text()
    assert re.search(r'^BASELINE = "(.*)"$', src, re.M).group(1) == bench_scan.PEER_DECODE
    assert 'shape=f"B{bsz}xD{D}xN{N}", dtype="bf16"' in src and 'goal="<=1.0x Triton time"' in src
    assert 'family="ssm_step_forward_fused" if n == CURRENT' in src


# ---- bench_gemm: rows (symbol, m, n, k, ms, ours, cuBLAS, unit, ratio, copy fraction, cuBLAS ms, family, kind, math)

def gemm_row(symbol, family, kind, math, m, n, k, ms, base_ms, copy_gbs=4000.0, esz=2):
    if kind == "gemm":
        unit, ov, bv, frac = "TFLOP/s", 2 * m * n * k / ms / 1e9, 2 * m * n * k / base_ms / 1e9, ""
    else:
        nbytes = (m * k + k * n) * esz + m * n * esz
        unit, ov, bv = "GB/s", nbytes / ms / 1e6, nbytes / base_ms / 1e6
        frac = f"{ov / copy_gbs:.2f}"
    return (symbol, m, n, k, ms, ov, bv, unit, base_ms / ms, frac, base_ms, family, kind, math)


GEMM_CASES = [  # (symbol, family, kind, math, m, n, k, goal, least ratio cuBLAS ms / ours that meets it)
    ("gemm_bi_f32_f32_n128_s2", "gemm_bi_f32_f32", "gemm", "f32", 4096, 4096, 4096, ">=0.85x cuBLAS fp32", 0.85),
    ("triad_sm80_nn_tf32", "triad_sm80_nn", "gemm", "tf32", 8192, 8192, 8192, ">=0.8x cuBLAS TF32", 0.8),
    ("gemm_bi_nn_tc128_bf16", "gemm_bi_nn_tc128", "gemm", "bf16", 16384, 4096, 2048, ">=0.9x cuBLAS", 0.9),
    ("gemm_bi_nn_tc64_f16", "gemm_bi_nn_tc64", "gemm", "f16", 4096, 4096, 4096, ">=0.9x cuBLAS", 0.9),
    ("matvec_bi_bf16_bf16", "matvec_bi", "matvec", "bf16", 8, 8192, 8192, ">=0.9x cuBLAS", 0.9),
    ("matvec_bi_f32_f32", "matvec_bi_f32", "matvec", "f32", 1, 4096, 4096, ">=0.9x cuBLAS", 0.9),
]


@pytest.mark.parametrize("symbol, family, kind, math, m, n, k, goal, threshold", GEMM_CASES)
def test_gemm_met_follows_the_goal(symbol, family, kind, math, m, n, k, goal, threshold):
    rows = [gemm_row(symbol, family, kind, math, m, n, k, 1.0, base) for base in (threshold + 0.01, threshold - 0.01)]
    good, bad = bench_gemm.summary_records(rows, GPU, 4000.0)
    fields_ok([good, bad])
    assert good["goal"] == bad["goal"] == goal
    assert good["met"] is True and bad["met"] is False
    assert (good["family"], good["symbol"], good["dtype"]) == (family, symbol, math)
    assert good["shape"] == f"M{m}xN{n}xK{k}" and good["unit"] == "ms"
    assert good["baseline_name"] == bench_gemm.BASELINE_NAMES[math]
    for r in (good, bad):
        time_speedup_ok(r)


@pytest.mark.parametrize("ratio, frac, met", [(1.05, 0.9, True), (0.95, 0.9, False), (1.05, 0.8, False)])
def test_gemm_headline_matvec_needs_cublas_parity_and_the_copy(ratio, frac, met):
    row = gemm_row("matvec_bi_bf16_bf16", "matvec_bi", "matvec", "bf16", 1, 8192, 8192, 0.04, 0.04 * ratio)
    copy_gbs = row[5] / frac  # ours GB/s = frac of the copy
    (r,) = bench_gemm.summary_records([row], GPU, copy_gbs)
    assert r["goal"] == ">=1.0x cuBLAS and >=85% copy"
    assert r["met"] is met
    time_speedup_ok(r)


def test_gemm_goals_match_the_other_scripts_records():
    """The matvec headline and skinny goals are bench_decode_gemm.py's (same symbols and shapes at M=1), the exact
    f32 goal bench_gemm_f32.py's."""
    src = (BENCH / "bench_decode_gemm.py").read_text()
    assert 'goal = ">=1.0x cuBLAS and >=85% copy" if headline else ">=0.9x cuBLAS"' in src
    assert "headline = M == 1 and (N, K) == (8192, 8192)" in src
    (r,) = bench_gemm.summary_records([gemm_row("gemm_bi_f32_f32", "gemm_bi_f32_f32", "gemm", "f32", 4096, 4096,
                                                4096, 1.0, 1.0)], GPU, 4000.0)
    assert r["goal"] == f">={bench_gemm_f32.GOAL}x cuBLAS fp32"


# ---- bench_gemm_sm90a: rows (date, GPU, symbol, layout, M, N, K, ms, TFLOP/s, cuBLAS TFLOP/s, ratio, cuBLAS ms,
# family, result checked) ---------------------------------------------------------------------------------------

def sm90a_row(name, ms, ms_ref, ok=True, M=8192, N=8192, K=8192):
    flops = 2.0 * M * N * K
    return ("2026-12-01 12:00", GPU, name, name.split("_")[2], M, N, K, ms, flops / ms / 1e9, flops / ms_ref / 1e9,
            ms_ref / ms, ms_ref, "gemm_bi_nt_sm90a_wgmma_ws2_tmastore", ok)


@pytest.mark.parametrize("name, dtype", [("gemm_bi_nt_sm90a_wgmma_ws2_tmastore_m128n256_s3_bf16", "bf16"),
                                         ("gemm_bi_tn_sm90a_wgmma_ws2_tmastore_m128n256_s3_f16", "f16")])
def test_gemm_sm90a_met_follows_the_goal(name, dtype):
    good, bad, wrong = bench_gemm_sm90a.summary_records(
        [sm90a_row(name, 1.0, 0.91), sm90a_row(name, 1.0, 0.88), sm90a_row(name, 1.0, 1.2, ok=False)], GPU)
    fields_ok([good, bad, wrong])
    assert good["goal"] == ">=0.9x cuBLAS" and good["unit"] == "ms"
    assert (good["met"], bad["met"], wrong["met"]) == (True, False, False)  # 0.88 would meet 0.85
    assert good["dtype"] == dtype and good["shape"] == "M8192xN8192xK8192"
    assert good["family"] == "gemm_bi_nt_sm90a_wgmma_ws2_tmastore"
    for r in (good, bad, wrong):
        time_speedup_ok(r)


# ---- bench_sm120_tma: rows (date, GPU, symbol, M, N, K, ms, TFLOP/s, twin, twin ms, ratio, family, bitwise) -----

def sm120_row(name, ms, ms_t, same=True, M=4096, N=4096, K=4096):
    twin = bench_sm120_tma.TWINS[bench_sm120_tma.kind_of(name)].format(dtype="bf16")
    return ("2026-12-01 12:00", GPU, name, M, N, K, ms, 2.0 * M * N * K / ms / 1e9, twin, ms_t, ms_t / ms,
            "gemm_bi_nn_sm120_tma", same)


@pytest.mark.parametrize("name, dtype", [
    ("gemm_bi_nn_sm120_tma_128x128_bk32_s3_bf16", "bf16"),
    ("gemm_bi_nn_sm120_tma_128x128_bk32_s3_f32out_bf16", "bf16"),
    ("gemm_bi_nn_sm120_tma_tf32_v1_m64n128_bk32_s2", "tf32"),
    ("gemm_bi_nn_sm120_tma_fma_v1_fixed_postbias_m64n128_bk16_s2", "f32"),
])
def test_sm120_tma_met_is_parity_with_a_bitwise_equal_twin(name, dtype):
    good, bad, differs = bench_sm120_tma.summary_records(
        [sm120_row(name, 1.0, 1.02), sm120_row(name, 1.0, 0.98), sm120_row(name, 1.0, 1.5, same=False)], GPU)
    fields_ok([good, bad, differs])
    assert good["goal"] == ""
    assert (good["met"], bad["met"], differs["met"]) == (True, False, False)
    assert good["dtype"] == dtype and good["shape"] == "M4096xN4096xK4096"
    assert good["baseline_name"].startswith(sm120_row(name, 1, 1)[8] + " ")
    for r in (good, bad, differs):
        time_speedup_ok(r)


# ---- bandwidth scripts: rows are dicts (bench_memory_bound.bench_one, bench_conv_optim.main) --------------------

def bw_row(kernel, family, dtype, shape, ratio, moved=256e6, t=100e-6, **extra):
    tc = ratio * t
    return {"kernel": kernel, "shape": shape, "us": t * 1e6, "gbs": moved / t / 1e9, "copy_gbs": moved / tc / 1e9,
            "ratio": tc / t, "family": family, "dtype": dtype, **extra}


def bandwidth_ok(r: dict, row: dict) -> None:
    assert r["unit"] == "GB/s" and r["ours"] == round(row["gbs"], 1) and r["baseline"] == round(row["copy_gbs"], 1)
    assert r["speedup"] == round(row["gbs"] / row["copy_gbs"], 3)
    assert abs(r["speedup"] - r["ours"] / r["baseline"]) < 2e-3


def mb_row(kernel, family, dtype, ratio, shape="n=67108864"):
    return bw_row(kernel, family, dtype, shape, ratio, bytes=int(256e6), peer=None)


@pytest.mark.parametrize("kernel, family, dtype", [("rmsnorm_forward", "rmsnorm_forward", "f32"),
                                                   ("cast_bf16_to_f32", "cast", "-"),
                                                   ("adamw_step_f32", "adamw_step", "f32")])
def test_memory_bound_met_follows_the_goal(kernel, family, dtype):
    rows = [mb_row(kernel, family, dtype, 0.86), mb_row(kernel, family, dtype, 0.84)]
    good, bad = bench_memory_bound.summary_records(rows, GPU)
    fields_ok([good, bad])
    assert good["goal"] == bad["goal"] == ">= 0.85 of copy bandwidth"
    assert good["met"] is True and bad["met"] is False
    assert (good["family"], good["symbol"], good["dtype"], good["shape"]) == (family, kernel, dtype, "n=67108864")
    for r, row in zip((good, bad), rows, strict=True):
        bandwidth_ok(r, row)


def test_memory_bound_goal_is_bench_conv1d_s_for_the_forwards():
    for kind in ("fwd_nosave", "fwd_save"):
        assert bench_memory_bound.GOAL == bench_conv1d.KINDS[kind][3]


@pytest.mark.parametrize("kernel, family, goal", [
    ("conv1d_burnin_forward_nosave_tiled_bf16", "conv1d_burnin_forward_nosave_tiled", 0.85),
    ("conv1d_burnin_forward_tiled_f32", "conv1d_burnin_forward_tiled", 0.85),
    ("conv1d_bwd_tiled_f16", "conv1d_bwd_tiled", 0.70),
    ("adamw_step_f32", "adamw_step", 0.85),
    ("adamw_step_f32_capturable", "adamw_step_capturable", 0.85),
    ("adamw_step_multi_bf16", "adamw_step_multi", 0.85),
    ("grad_sumsq_partial_f32", "grad_sumsq_partial", None),  # no goal: met = at least the copy's bandwidth
])
def test_conv_optim_met_follows_the_goal(kernel, family, goal):
    dtype = kernel.split("_")[-1] if kernel.split("_")[-1] in ("bf16", "f16", "f32") else "f32"
    threshold = 1.0 if goal is None else goal
    rows = [bw_row(kernel, family, dtype, "B4 D4096 L4096 w4", r, mb=256.0) for r in (threshold + 0.01,
                                                                                     threshold - 0.01)]
    good, bad = bench_conv_optim.summary_records(rows, GPU)
    fields_ok([good, bad])
    assert good["goal"] == bad["goal"] == ("" if goal is None else f">= {goal} of copy bandwidth")
    assert good["met"] is True and bad["met"] is False
    assert (good["family"], good["symbol"], good["dtype"]) == (family, kernel, dtype)
    for r, row in zip((good, bad), rows, strict=True):
        bandwidth_ok(r, row)


def test_conv_optim_conv1d_records_are_bench_conv1d_s():
    """Same symbol, shape text and goal as bench_conv1d.py's records; every family the script runs has a goal
    but the gradient norm (the families from the catalog, as main() looks them up)."""
    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    for prod, _cands, _bufs, goal in bench_conv1d.KINDS.values():
        assert bench_conv_optim.GOALS[prod] == goal
    assert bench_conv1d.shape_text(bench_conv1d.SHAPES[0]) == f"B{bench_conv_optim.CONV['batch']} " \
        f"D{bench_conv_optim.CONV['d']} L{bench_conv_optim.CONV['L']} w{bench_conv_optim.CONV['width']}"
    cases = bench_conv_optim.conv_cases() + bench_conv_optim.optim_cases(1)  # nothing runs before setup(kernels)
    assert {c[1] for c in cases[:9]} == {bench_conv1d.shape_text(bench_conv1d.SHAPES[0])}
    syms = {s.name: s for s in load_catalog(default_catalog_path()).module("Fixed").symbols}
    families = {syms[name].family for name, *_ in cases}
    assert families - set(bench_conv_optim.GOALS) == {"grad_sumsq_partial"}


# ---- bench_build: one run's figures ---------------------------------------------------------------------------

def build_fig(serial=200.0, parallel=100.0, warm=0.25, cached=True):
    return {"machine": "x86_64 3.11.7", "cpus": 2, "programs": 25, "symbols": 1135, "serial": serial,
            "parallel": parallel, "jobs": 2, "warm": warm, "cached": cached}


def test_build_records():
    cold, rebuild = bench_build.summary_records(build_fig())
    fields_ok([cold, rebuild])
    assert (cold["unit"], cold["dtype"], cold["gpu"]) == ("s", "-", "")
    assert cold["symbol"] == "cold build, 2 workers" and cold["shape"] == rebuild["shape"]
    assert (cold["ours"], cold["baseline"]) == (100.0, 200.0) and cold["speedup"] == 2.0
    assert cold["goal"] == "" and cold["met"] is True
    assert rebuild["baseline"] is None and rebuild["speedup"] is None
    assert rebuild["goal"] == "< 1.0 s, every module from the cache" and rebuild["met"] is True


@pytest.mark.parametrize("fig, which", [(build_fig(parallel=201.0), 0), (build_fig(warm=1.2), 1),
                                        (build_fig(cached=False), 1)])
def test_build_records_not_met(fig, which):
    recs = bench_build.summary_records(fig)
    assert [r["met"] for r in recs] == [i != which for i in range(2)]
    time_speedup_ok(recs[0])


# ---- summary.append ---------------------------------------------------------------------------------------------

def test_append_merges_by_symbol_shape_dtype_latest_winning(tmp_path):
    path = tmp_path / "results" / "summary.json"
    first = bench_scan.summary_records([scan_row("fwd nosave", 0.9), scan_row("fwd save", 1.1)], GPU)
    assert summary.append(first, path) == first
    again = bench_scan.summary_records([scan_row("fwd save", 0.95)], GPU)  # the same key, re-measured
    other_dtype = dict(again[0], dtype="f16", ours=9.0)  # another key: kept beside it
    merged = summary.append(again + [other_dtype], path)
    assert json.loads(path.read_text()) == merged
    assert [(r["symbol"], r["dtype"]) for r in merged] == [
        ("ssm_parallel_scan_fwd_nosave_bf16", "bf16"), ("ssm_parallel_scan_fwd_bf16", "bf16"),
        ("ssm_parallel_scan_fwd_bf16", "f16")]
    assert merged[0] == first[0] and merged[1] == again[0] and merged[1]["met"] is True
    assert merged[1]["ours"] == pytest.approx(0.6 * 0.95)
    with pytest.raises(ValueError, match="lacks"):
        summary.append([{k: v for k, v in first[0].items() if k != "goal"}], path)
    assert json.loads(path.read_text()) == merged  # a bad record writes nothing


# ---- bench_decode_gemm: the routed rung's figure per (M, N, K) ------------------------------------------------


def test_decode_gemm_route_records_follow_the_route_table():
    """The record for each M is the time of the rung the catalog's route table serves there (all built rungs
    serving), with the rung named; met against >=0.9x cuBLAS (>=1.0x at the M = 1, 8192^2 headline)."""
    from types import SimpleNamespace

    import bench_decode_gemm as bdg

    from mamba_forge.catalog.model import default_catalog_path, load_catalog
    from mamba_forge.qualify.assemble import route_table
    from mamba_forge.runtime.routes import select

    cat = load_catalog(default_catalog_path())
    names = [f"{n}_bf16" for n in (*bdg.WG_SKINNY, bdg.WG_LARGE)] + [*bdg.F32_DECODE, *bdg.F32_SKINNY, *bdg.F32_ROUTED]
    names = [n for n in names if n in cat.symbols]
    table = route_table(cat.routes, [SimpleNamespace(name=n, status="admitted") for n in names])
    # Kernels.gemm_route's answer on a device that admitted every built rung (as benchmarks/built.py serves them)
    kernels = SimpleNamespace(gemm_route=lambda m, n, k, a: select(table, m, n, k, a, a, a, "nn",
                                                                   serves=lambda s: s in names))
    picks = {}
    for dt in ("bf16", "f32"):
        for m in (1, 16, 17, 64, 65, 256):
            times = {n: 0.010 for n in names}
            (r,) = bdg.route_records(kernels, times, dt, m, 8192, 8192, 0.0095, GPU)
            fields_ok([r])
            assert r["family"] == bdg.ROUTE_FAMILY and r["symbol"] == f"nn {dt} route" and r["shape"] == f"M{m}xN8192xK8192"
            picks[dt, m] = r["baseline_name"].split("served by ")[1]
            assert r["met"] is (m != 1)  # 0.95x cuBLAS: meets 0.9x, not the headline's 1.0x
    assert picks["f32", 1] == picks["f32", 16] != picks["f32", 17]  # the decode rung up to its M range, then not
    assert picks["bf16", 64] != picks["bf16", 65]
    assert all(p in names for p in picks.values())
    # a pick that was not timed gives no record (never another rung's time)
    assert bdg.route_records(kernels, {}, "bf16", 1, 8192, 8192, 0.01, GPU) == []
