"""benchmarks/summary.py's writer and the records it refuses, on CPU: a failed write leaves neither a temporary
file nor a changed summary; values become plain JSON (numpy scalars to Python numbers) or are refused before the
file is touched; the file is 0644; concurrent appends (threads, processes) keep every row; one call may not carry
two records of one (symbol, shape, dtype) key; goal "" (parity) needs a baseline. Then the scripts' record
builders: bit-identity rows record the comparison itself, a bandwidth row's goal states its threshold, and no
benchmark hard-codes met=True."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_conv_tokens  # noqa: E402
import bench_decode_gemm  # noqa: E402
import bench_scan_tokens  # noqa: E402
import summary  # noqa: E402

GPU = "NVIDIA H200"


def rec(symbol="s", **kw) -> dict:
    base = {"family": "f", "symbol": symbol, "shape": "x", "dtype": "bf16", "ours": 1.0, "baseline": 2.0,
            "baseline_name": "b", "unit": "ms", "goal": ">= 1.0x b", "met": True}
    return summary.record(**{**base, **kw})


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "summary.json")


# ---- the writer -------------------------------------------------------------------------------------------------

def test_a_failed_write_leaves_no_temp_file_and_the_old_summary(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    summary.append([rec("old")], path)
    before = path.read_text()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(summary.json, "dump", boom)
    with pytest.raises(OSError, match="disk full"):
        summary.append([rec("new")], path)
    monkeypatch.undo()
    assert path.read_text() == before and leftovers(tmp_path) == []
    # a failure at the rename too
    monkeypatch.setattr(summary.os, "replace", boom)
    with pytest.raises(OSError):
        summary.append([rec("new")], path)
    monkeypatch.undo()
    assert path.read_text() == before and leftovers(tmp_path) == []


def test_numpy_scalars_become_python_numbers(tmp_path):
    path = tmp_path / "summary.json"
    r = rec(ours=np.float32(1.5), baseline=np.float64(3.0), met=np.bool_(True))
    r["speedup"] = np.float32(2.0)
    (out,) = summary.append([r], path)
    assert type(out["ours"]) is float and out["ours"] == 1.5 and type(out["speedup"]) is float
    assert json.loads(path.read_text())[0]["ours"] == 1.5 and leftovers(tmp_path) == []


@pytest.mark.parametrize("bad", [object(), float("nan"), np.float32("inf"), np.zeros(2)])
def test_a_value_that_is_not_json_is_refused_before_writing(tmp_path, bad):
    path = tmp_path / "summary.json"
    summary.append([rec("old")], path)
    before = path.read_text()
    with pytest.raises(TypeError, match="'new'"):
        summary.append([dict(rec("new"), ours=bad)], path)
    assert path.read_text() == before and leftovers(tmp_path) == []


def test_the_summary_is_mode_0644(tmp_path):
    path = tmp_path / "summary.json"
    old = os.umask(0o077)
    try:
        summary.append([rec("a")], path)
        summary.append([rec("b")], path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_appends_from_threads_keep_every_row(tmp_path):
    path = tmp_path / "summary.json"
    threads = [threading.Thread(target=lambda i=i: [summary.append([rec(f"t{i}-{j}")], path) for j in range(5)])
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["symbol"] for r in json.loads(path.read_text())) == sorted(
        f"t{i}-{j}" for i in range(6) for j in range(5))
    assert leftovers(tmp_path) == []


def test_appends_from_processes_keep_every_row(tmp_path):
    path = tmp_path / "summary.json"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import summary; from pathlib import Path; p = Path(sys.argv[2])\n"
            "for j in range(15):\n"
            "    summary.append([summary.record(family='f', symbol=f'p{sys.argv[3]}-{j}', shape='x', dtype='-', ours=1.0,"
            " baseline=1.0, baseline_name='b', unit='ms', goal='', met=True)], p)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(BENCH), str(path), str(i)]) for i in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    rows = json.loads(path.read_text())
    assert len(rows) == 60 and {r["symbol"] for r in rows} == {f"p{i}-{j}" for i in range(4) for j in range(15)}
    assert leftovers(tmp_path) == []


# ---- what one call may carry ------------------------------------------------------------------------------------

def test_two_records_of_one_key_in_one_call_are_refused(tmp_path):
    path = tmp_path / "summary.json"
    summary.append([rec("old")], path)
    before = path.read_text()
    a, b = rec("s", goal="bit-identical"), rec("s", goal="<= 1.0x peer time")
    with pytest.raises(ValueError, match="share the key"):
        summary.append([a, b], path)
    assert path.read_text() == before
    summary.append([a, dict(b, dtype="f16")], path)  # another dtype: another key


def test_goal_must_be_stated_or_parity_with_a_baseline(tmp_path):
    path = tmp_path / "summary.json"
    with pytest.raises(ValueError, match="goal must be a string"):
        summary.append([rec(goal=None)], path)
    with pytest.raises(ValueError, match="parity"):
        summary.append([rec(goal="", baseline=None)], path)
    assert not path.exists()
    summary.append([rec(goal="", baseline=2.0)], path)


# ---- the scripts' record builders -------------------------------------------------------------------------------

@pytest.mark.parametrize("same", [True, False])
def test_conv_tokens_decode_rows_have_distinct_keys_and_real_met(tmp_path, same):
    recs = bench_conv_tokens.decode_records("b1 d2048 L1 w4", 2.0, 1.5, 3.0, same, GPU)
    assert [r["symbol"] for r in recs] == ["conv1d_tokens_silu_vec_bf16:vs-tiled", "conv1d_tokens_silu_vec_bf16:vs-peer"]
    assert [r["met"] for r in recs] == [same, same]  # faster than the peer, but not met when the bits differ
    assert recs[1]["ours"] == pytest.approx(1.5e-3) and recs[1]["baseline"] == pytest.approx(3e-3)
    assert len(summary.append(recs, tmp_path / "summary.json")) == 2
    slow = bench_conv_tokens.decode_records("b1 d2048 L1 w4", 4.0, 3.5, 3.0, True, GPU)
    assert [r["met"] for r in slow] == [True, False]
    (only,) = bench_conv_tokens.decode_records("b1 d2048 L1 w4", 2.0, 1.5, None, True, GPU)  # no peer
    assert only["symbol"].endswith(":vs-tiled")


@pytest.mark.parametrize("same", [True, False])
def test_scan_tokens_bit_identity_row_records_the_comparison(tmp_path, same):
    op, ws = bench_scan_tokens.scan_records("B8 D2048 L2048 N16", 0.5, 0.6, 0.55, 0.45, same, GPU)
    assert op["met"] is same and ws["met"] is same
    assert ws["goal"] == "bit-identical to ssm_scan_tokens" and ws["symbol"] != op["symbol"]
    (op_slow, _) = bench_scan_tokens.scan_records("B8 D2048 L2048 N16", 0.7, 0.6, 0.55, 0.45, True, GPU)
    (op_nopeer, _) = bench_scan_tokens.scan_records("B8 D2048 L2048 N16", 0.5, None, 0.55, 0.45, True, GPU)
    assert not op_slow["met"] and not op_nopeer["met"]
    assert len(summary.append([op, ws], tmp_path / "summary.json")) == 2


@pytest.mark.parametrize("frac, met", [(0.86, True), (0.84, False)])
def test_decode_gemm_bandwidth_row_states_its_threshold(frac, met):
    r = bench_decode_gemm.bandwidth_record("matvec_bi", "matvec_bi_bf16_bf16", "M1xN4096xK4096", "bf16",
                                           4.0 * frac, 4.0, GPU)
    assert r["goal"] == ">=85% copy" and r["met"] is met and r["shape"] == "M1xN4096xK4096-bandwidth"


def test_no_benchmark_hard_codes_met_true():
    hits = [f"{p.name}:{i}" for p in sorted(BENCH.glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\bmet\s*=\s*True\b", line)]
    assert hits == []


@pytest.mark.parametrize("script", ["bench_conv_tokens.py", "bench_scan_tokens.py"])
def test_a_bit_mismatch_is_recorded_before_the_script_fails(script):
    # the GPU path: the mismatch is collected, the rows appended, then main returns 1 (no SystemExit before append)
    src = (BENCH / script).read_text()
    assert "raise SystemExit" not in src
    assert src.index("append(records)") < src.index("if differ:") < src.index("return 1")


# ---- bench_gemm: the result checked against float64 before a number is recorded -------------------------------

def test_gemm_result_check_passes_a_right_result_and_fails_a_wrong_one():
    torch = pytest.importorskip("torch")
    import bench_gemm

    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(64, 256, generator=g).bfloat16(), torch.randn(256, 96, generator=g).bfloat16()
    right = (A.float() @ B.float()).bfloat16()  # f32 accumulation, bf16 output: what a correct kernel writes
    assert bench_gemm.result_ok(bench_gemm.rel_error(right, A, B), "bf16")
    wrong = right.clone()
    wrong[:, -1] = 0  # one column dropped
    assert not bench_gemm.result_ok(bench_gemm.rel_error(wrong, A, B), "bf16")
    assert not bench_gemm.result_ok(bench_gemm.rel_error(torch.zeros_like(right), A, B), "bf16")
    af, bf = A.float(), B.float()
    assert bench_gemm.result_ok(bench_gemm.rel_error(af @ bf, af, bf), "f32")
    assert not bench_gemm.result_ok(bench_gemm.rel_error((af @ bf).bfloat16().float(), af, bf), "f32")  # too coarse
    nan = right.clone()
    nan[0, 0] = float("nan")
    assert not bench_gemm.result_ok(bench_gemm.rel_error(nan, A, B), "bf16")


def test_gemm_a_wrong_result_is_recorded_not_met():
    import bench_gemm

    flops = 2 * 4096 ** 3
    row = ("gemm_bi_nn_tc128_bf16", 4096, 4096, 4096, 1.0, flops / 1e9, flops / 2e9, "TFLOP/s", 2.0, "", 2.0,
           "gemm_bi_nn_tc128", "gemm", "bf16")  # twice as fast as cuBLAS
    (fast,) = bench_gemm.summary_records([row], GPU, 4000.0, set())
    (fast_wrong,) = bench_gemm.summary_records([row], GPU, 4000.0, {("gemm_bi_nn_tc128_bf16", 4096, 4096, 4096)})
    assert fast["met"] is True and fast_wrong["met"] is False
    src = (BENCH / "bench_gemm.py").read_text()
    assert "summary_records(results, gpu, copy_gbs, wrong)" in src and "rel = rel_error(C, A, B)" in src
