"""benchmarks/tune_routes.py's pure parts on the CPU, with fake timings: the model shapes, choosing winners (ties
keep the previous winner), merging M into ranges, the table (deterministic, sorted, accepted by the catalog's
rules, each rule's rung the winner inside its ranges), the summary rows, the atomic write, and its arguments."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_benchmark_cli import BENCHMARKS, load_bench

from mamba_forge.core.errors import CatalogError
from mamba_forge.core.schema import QSymbol
from mamba_forge.qualify.assemble import route_table
from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.routes import select

tr = load_bench(BENCHMARKS / "tune_routes.py")
import tuning_table as tt  # noqa: E402  (benchmarks/tuning_table.py, on the path tune_routes.py set)

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
P = "gemm_bi_nn_sm90a_wgmma_"
LARGE, SKINNY64, SKINNY32, TMASTORE = (f"{P}ws2_m128n256_s4_bf16", f"{P}skinny_m64n64_s12_bf16",
                                       f"{P}skinny_m64n32_s18_bf16", f"{P}ws2_tmastore_m128n256_s3_bf16")


def test_model_shapes_are_the_mamba_projections():
    assert tr.model_shapes(1024) == [("d1024 in_proj", 4096, 1024), ("d1024 x_proj", 96, 2048),
                                     ("d1024 dt_proj", 2048, 64), ("d1024 out_proj", 1024, 2048)]
    assert [s[1:] for s in tr.model_shapes(2560)] == [(10240, 2560), (192, 5120), (5120, 160), (2560, 5120)]


def test_winners_are_the_fastest_and_a_near_tie_keeps_the_previous_winner():
    times = {1: {"a": 5.0, "b": 4.0}, 2: {"a": 4.05, "b": 4.0}, 4: {"a": 3.0, "b": 4.0}, 8: {"a": 4.0, "b": 4.0},
             16: {}, 32: {"b": 1.0}}
    assert tt.pick_winners(times, tie=0.02) == {1: "b", 2: "b", 4: "a", 8: "a", 32: "b"}
    assert tt.pick_winners(times, tie=0.0)[2] == "b"
    assert tt.pick_winners({1: {"b": 4.05, "a": 4.0}, 2: {"a": 4.0, "b": 4.04}}, tie=0.02) == {1: "a", 2: "a"}
    assert tt.pick_winners({1: {"b": 1.0, "a": 1.0}}, tie=0.0) == {1: "a"}  # an exact tie: by name


def test_merged_ranges_cover_every_m_once_and_change_between_measured_m():
    winners = {1: "a", 2: "a", 4: "b", 256: "b", 2048: "c", 8192: "c", 16384: "c"}
    got = tt.merge_ranges(winners)
    assert got == [(1, 2, "a"), (3, 724, "b"), (725, 0, "c")]
    assert tt.merge_ranges({1: "a", 16384: "a"}) == [(1, 0, "a")]
    assert tt.merge_ranges({8: "a", 16: "b"}) == [(1, 11, "a"), (12, 0, "b")]  # M < 8: the first winner serves
    assert tt.merge_ranges({}) == []
    # every M from 1 up is in exactly one range, and each measured M in its winner's
    for m in range(1, 20000):
        (sym,) = [s for lo, hi, s in got if lo <= m and (hi == 0 or m <= hi)]
        if m in winners:
            assert sym == winners[m]


def _results(tie=0.02, dropped=None) -> dict:
    """Fake run results: nn bf16 at x_proj (skinny rungs lead at small M) and in_proj (the large tile leads)."""
    def row(cublas, **rungs):
        return {"cublas": cublas, "served": LARGE, "rungs": rungs}

    x_proj = {"name": "d1024 x_proj", "N": 96, "K": 2048, "M": {
        "1": row(0.004, **{LARGE: 0.008, SKINNY64: 0.005, SKINNY32: 0.0045}),
        "64": row(0.005, **{LARGE: 0.009, SKINNY64: 0.0052, SKINNY32: 0.0051}),
        "2048": row(0.010, **{LARGE: 0.020, SKINNY64: 0.012, SKINNY32: 0.014}),
        "16384": row(0.050, **{LARGE: 0.070, SKINNY64: 0.060, SKINNY32: 0.090, TMASTORE: 0.07})}}
    in_proj = {"name": "d1024 in_proj", "N": 4096, "K": 1024, "M": {
        "1": row(0.010, **{LARGE: 0.012, SKINNY64: 0.011}),
        "16384": row(0.200, **{LARGE: 0.210, SKINNY64: 0.500, TMASTORE: 0.209})}}
    entry = {"key": ["nn", "bf16", "bf16", "bf16"], "class": "wgmma-k16", "dropped": dropped or {},
             "shapes": [in_proj, x_proj]}
    return {"gpu": "NVIDIA H200 (132 SMs)", "date": "2026-05-01 12:00 UTC", "inner": 10, "reps": 10, "tie": tie,
            "torch": "2.x", "entries": [entry]}


def test_the_table_is_deterministic_sorted_and_passes_the_catalogs_rules():
    res = _results()
    text = tr.render_table(res)
    assert text == tr.render_table(json.loads(json.dumps(res)))  # the same from the timings JSON
    assert text.startswith(tt.HEADER) and "NVIDIA H200 (132 SMs) at 2026-05-01 12:00 UTC" in text
    assert f"#   M 1: {SKINNY32} 4.5 us, cuBLAS 4.0 us (0.89x)" in text  # measured times beside the rules
    (entry,) = tomllib.loads(text)["tune"]
    assert (entry["layout"], entry["a"], entry["class"]) == ("nn", "bf16", "wgmma-k16")
    assert [(r["symbol"], r["n"], r["k"], r["m"]) for r in entry["rules"]] == [  # sorted by (N, K): x_proj first
        (SKINNY32, [96, 96], [2048, 2048], [1, 362]),  # won M 1 and 64; M 2048 went to SKINNY64: isqrt(64 * 2048)
        (SKINNY64, [96, 96], [2048, 2048], [363, 0]),
        (SKINNY64, [4096, 4096], [1024, 1024], [1, 128]),
        (TMASTORE, [4096, 4096], [1024, 1024], [129, 0]),  # fastest at 16384 (LARGE within 2 %, but not the
    ]                                                     # previous winner: a tie keeps only that one)
    tr.check_table(text, KERNELS / "catalog.toml")  # the built-in catalog's own rules accept it


def test_each_rule_names_the_measured_winner_inside_its_ranges():
    res = _results(tie=0.0)
    (entry,) = tomllib.loads(tr.render_table(res))["tune"]
    for shape in res["entries"][0]["shapes"]:
        for m, row in shape["M"].items():
            best = min(row["rungs"], key=row["rungs"].__getitem__)
            (rule,) = [r for r in entry["rules"] if r["n"][0] == shape["N"] and r["m"][0] <= int(m)
                       and (r["m"][1] == 0 or int(m) <= r["m"][1])]
            assert rule["symbol"] == best, (shape["name"], m)


def test_a_dropped_rung_never_wins_and_fails_the_goal():
    res = _results(dropped={SKINNY64: "differs from the reference at d1024 x_proj M 1"})
    assert SKINNY64 not in {r["symbol"] for r in tomllib.loads(tr.render_table(res))["tune"][0]["rules"]}
    recs = tr.summary_records(res)
    (goal,) = [r for r in recs if r["unit"].startswith("x cuBLAS")]
    assert goal["met"] is False and goal["ours"] == 0.0


def test_summary_rows_record_the_tuned_rung_against_cublas():
    recs = tr.summary_records(_results())
    rows = {r["shape"]: r for r in recs if r["unit"] == "ms"}
    assert len(rows) == 6 and all(r["family"] == "route_tuning" and r["dtype"] == "bf16" for r in recs)
    r = rows["d1024 x_proj M2048 N96 K2048"]
    assert (r["ours"], r["baseline"], r["met"]) == (0.012, 0.01, False) and SKINNY64 in r["baseline_name"]
    assert rows["d1024 in_proj M1 N4096 K1024"]["met"] is True  # 0.010 / 0.011 = 0.91
    (goal,) = [r for r in recs if r["unit"].startswith("x cuBLAS")]
    assert goal["ours"] == round(0.01 / 0.012, 3) and goal["met"] is False
    assert goal["goal"] == "every projection GEMM at least 0.9x cuBLAS"


def test_a_table_the_catalog_refuses_is_never_written(tmp_path):
    res = _results()
    res["entries"][0]["class"] = "no-such-class"
    with pytest.raises(CatalogError, match="the route has no class 'no-such-class'"):
        tr.check_table(tr.render_table(res), KERNELS / "catalog.toml")


def test_write_leaves_the_table_alone_when_the_catalog_refuses_the_new_one(tmp_path, monkeypatch, capsys):
    res = _results()
    res["entries"][0]["class"] = "no-such-class"
    monkeypatch.setattr(tr, "TABLE", tmp_path / "route_tuning.toml")
    tr.TABLE.write_text("# the previous table\n")
    args = tr.parse_args(["--bundle", "b", "--key", "k", "--out", str(tmp_path / "out"), "--write", "--no-record"])
    assert tr.emit(res, args, 0.0) == 2
    assert tr.TABLE.read_text() == "# the previous table\n"
    assert "not written: the catalog refuses" in capsys.readouterr().out


def _rules(text: str) -> set:
    return {(e["layout"], e["a"], e["class"], r["symbol"], tuple(r["n"]), tuple(r["k"]), tuple(r.get("m", [1, 0])))
            for e in tomllib.loads(text)["tune"] for r in e["rules"]}


def test_merge_replaces_only_the_measured_shapes_rules_and_keeps_the_rest(tmp_path, monkeypatch):
    """--write --merge: a run's (key, class, N, K) replace those rules of the committed table (or join its
    section, or open one); every other shape's rules and comments stay; the catalog accepts the result; merging
    the same run again changes no rule."""
    old = (KERNELS / "route_tuning.toml").read_text()
    res = _results()
    f32 = json.loads(json.dumps(res["entries"][0]))
    f32["key"] = ["nn", "f32", "f32", "f32"]  # a key the table has no section for
    f32["shapes"] = [f32["shapes"][0]]
    res["entries"].append(f32)
    new = tr.render_table(res)
    merged = tt.merge_tables(old, new)

    def measured(r):
        return (r[0], r[1], r[2]) == ("nn", "bf16", "wgmma-k16") and (r[4][0], r[5][0]) in {(96, 2048), (4096, 1024)}

    assert any(measured(r) for r in _rules(old))  # d1024 in_proj's committed rules: replaced
    assert _rules(merged) == {r for r in _rules(old) if not measured(r)} | _rules(new)
    assert "  # d2560 in_proj (N 10240, K 2560)" in merged and "# d1024 in_proj dX (N 1024, K 4096)" in merged
    assert "# Merged in (tune_routes.py --merge): measured on NVIDIA H200 (132 SMs) at 2026-05-01 12:00 UTC" in merged
    assert merged.startswith(tt.HEADER) and merged.count("[[tune]]") == old.count("[[tune]]") + 1
    assert _rules(tt.merge_tables(merged, new)) == _rules(merged)
    tr.check_table(tt.merge_tables(old, tr.render_table(_results())), KERNELS / "catalog.toml")  # (f32: no such class)

    monkeypatch.setattr(tr, "TABLE", tmp_path / "route_tuning.toml")
    tr.TABLE.write_text(old)
    args = tr.parse_args(["--bundle", "b", "--key", "k", "--out", str(tmp_path / "out"), "--write", "--merge",
                          "--no-record"])
    assert tr.emit(_results(), args, 0.0) == 0
    assert _rules(tr.TABLE.read_text()) == {r for r in _rules(old) if not measured(r)} | _rules(tr.render_table(_results()))


def test_the_committed_table_starts_with_the_tuners_header():
    assert (KERNELS / "route_tuning.toml").read_text().startswith(tt.HEADER)


def test_the_write_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path, monkeypatch):
    path = tmp_path / "route_tuning.toml"
    path.write_text("old\n")
    tr.write_atomic(path, "new\n")
    assert path.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["route_tuning.toml"]

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)  # core.fsio.write_atomic renames through os.replace
    with pytest.raises(OSError, match="disk full"):
        tr.write_atomic(path, "newer\n")
    assert path.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["route_tuning.toml"]


def test_arguments():
    req = ["--bundle", "b", "--key", "k"]
    a = tr.parse_args(req)
    assert a.keys == [("nn", "bf16"), ("nn", "f16")] and a.d_models == [1024, 2560] and a.ms == list(tr.M_VALUES)
    a = tr.parse_args([*req, "--smoke"])
    assert (a.keys, a.d_models, a.ms, a.reps, a.no_record) == ([("nn", "bf16")], [1024], [1, 2048], 3, True)
    assert tr.parse_args([*req, "--keys", "nt:tf32, nn:f32", "--ms", "64,1,64"]).ms == [1, 64]
    a = tr.parse_args([*req, "--d-models", "", "--heads", "2560,768"])  # the language-model heads alone
    assert (a.d_models, a.heads) == ([], [2560, 768])
    assert tr.head_shape(2560) == ("d2560 lm_head", 50280, 2560)
    for bad in (["--keys", "nn"], ["--keys", "xx:bf16"], ["--keys", "nn:f64"], ["--ms", "0"], ["--ms", "a"],
                ["--d-models", "8"], ["--reps", "4"], ["--tie", "0.5"], ["--smoke", "--write"], ["--keys", ""],
                ["--class", "wgmma-k16", "--write"], ["--d-models", ""], ["--heads", "8"], ["--heads", "x"],
                ["--merge"]):
        with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as exc:
            tr.parse_args([*req, *bad])
        assert exc.value.code == 2, bad


# ---- the device side on the CPU: real torch (CPU), a stand-in for the loaded kernels, fake GPU times ------------


class _CpuTorch:
    """torch with the device arguments dropped and no-op CUDA housekeeping: measure_key's tensors on the CPU."""

    def __init__(self, torch):
        self._t = torch
        self.cuda = SimpleNamespace(empty_cache=lambda: None)
        self.backends = SimpleNamespace(cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=None)))

    def __getattr__(self, name):
        return getattr(self._t, name)

    def Generator(self, device=None):  # noqa: N802 - torch's name
        return self._t.Generator()

    def rand(self, *a, device=None, **kw):
        return self._t.rand(*a, **kw)

    def empty(self, *a, device=None, **kw):
        return self._t.empty(*a, **kw)


class _Kernels:
    """The loaded kernels as measure_key uses them: the route table of every nn rung but Blackwell's (so wgmma-k16
    serves 16-bit nn), the selector, and a GEMM through torch; `off` rung flips one bit of its C."""

    def __init__(self, torch, cat, off: str = "", refuse: str = ""):
        self.torch, self.off, self.refuse, self.last = torch, off, refuse, None
        self.manifest = SimpleNamespace(routes=route_table(cat.routes, [
            QSymbol(name=n, module="M", target="sm_90a", family="f", status="admitted") for n in cat.symbols]))

    def gemm_route(self, m, n, k, a, b=None, c=None, layout="nn", *, bias=False, symbol=None):
        return select(self.manifest.routes, m, n, k, a, b or a, c or a, layout, bias=bias, symbol=symbol,
                      serves=lambda s: "_sm100_" not in s)

    def gemm(self, A, B, out, *, layout, math, symbol):
        assert self.gemm_route(A.shape[0], B.shape[1], A.shape[1], "bf16", symbol=symbol).symbol == symbol
        if symbol == self.refuse and A.shape[0] > 64:
            raise LaunchRefused(f"{symbol}: a tensor map this shape cannot have")
        out.copy_((A.float() @ B.float()).to(out.dtype))
        if symbol == self.off:
            out.view(self.torch.int16)[0, 0] ^= 1
        self.last = symbol
        return out


def _speed(symbol: str, m: int, n: int) -> float:
    """Fake GPU ms: the skinny rungs lead at small M (n32 on narrow N), the large tiles at large M."""
    if "skinny" in symbol:
        lead = ("skinny_m64n32" in symbol and n < 128) or ("skinny_m64n64" in symbol and n >= 128)
        return 0.004 + m * (1.5e-5 if lead else 2e-5)
    return 0.008 + m * 1e-6 + (0.0001 if "tmastore" in symbol or "wg1" in symbol else 0.0)


def _device_run(monkeypatch, off: str = "", refuse: str = "", eq_class=None, shapes=None):
    torch = pytest.importorskip("torch")
    from mamba_forge.catalog.model import load_catalog

    cat = load_catalog(KERNELS / "catalog.toml")
    kern, shim, times = _Kernels(torch, cat, off, refuse), _CpuTorch(torch), []

    def median_ms(fn, reps, warmup=5):  # one call: ours sets kern.last; cuBLAS (torch.matmul) does not
        kern.last = None
        fn()
        m, n = times[-1]
        return _speed(kern.last, m, n) if kern.last else 0.0075 + m * 1e-6

    def capture_graph(fn, inner):
        out = fn()
        times.append((out.shape[0], out.shape[1]) if hasattr(out, "shape") else times[-1])
        return SimpleNamespace(replay=fn)

    monkeypatch.setattr(tr, "median_ms", median_ms)
    monkeypatch.setattr(tr, "capture_graph", capture_graph)
    shapes = shapes or [("d64 x_proj", 96, 128), ("d64 in_proj", 256, 64)]
    return tr.measure_key(shim, kern, "nn", "bf16", shapes, [1, 64, 300], 5, eq_class)


def test_measure_key_checks_times_and_feeds_a_table_the_catalog_accepts(monkeypatch, tmp_path, capsys):
    (entry,) = _device_run(monkeypatch)
    assert entry["key"] == ["nn", "bf16", "bf16", "bf16"] and entry["class"] == "wgmma-k16" and not entry["dropped"]
    x_proj = next(s for s in entry["shapes"] if s["name"] == "d64 x_proj")
    assert sorted(x_proj["M"]) == ["1", "300", "64"]
    row = x_proj["M"]["1"]
    # every wgmma-k16 rung (the route table's, as written: a rung named by symbol serves outside its M range too);
    # a graph replay runs INNER calls, so a figure is the replay's time / INNER
    routes = tomllib.loads((KERNELS / "routes.toml").read_text())
    k16 = next(c for r in routes["route"] for c in r.get("classes", []) if c["name"] == "wgmma-k16")
    rungs = {r["symbols"].format(dtype="bf16") for r in k16["rungs"]}
    assert len(rungs) >= 8
    assert set(row["rungs"]) == rungs and row["cublas"] == pytest.approx((0.0075 + 1e-6) / tr.INNER)
    assert row["served"] == "gemm_bi_nn_sm90a_wgmma_skinny_m64n64_s12_bf16"  # the class order's pick at M 1
    results = {"gpu": "CPU stand-in", "date": "2026-05-01 12:00 UTC", "inner": 10, "reps": 5, "tie": 0.02,
               "entries": [entry]}
    table = tomllib.loads(tr.render_table(results))
    rules = [(r["symbol"].removeprefix(P).removesuffix("_bf16"), r["n"][0], r["m"]) for r in table["tune"][0]["rules"]]
    assert rules == [("skinny_m64n32_s18", 96, [1, 138]), ("ws2_m128n256_s4", 96, [139, 0]),  # isqrt(64 * 300)
                     ("skinny_m64n64_s12", 256, [1, 138]), ("ws2_m128n256_s4", 256, [139, 0])]
    monkeypatch.setattr(tr, "TABLE", tmp_path / "kernels" / "route_tuning.toml")
    tr.TABLE.parent.mkdir()
    recorded = []
    monkeypatch.setattr(tr, "append", recorded.extend)
    args = tr.parse_args(["--bundle", "b", "--key", "k", "--out", str(tmp_path / "out"), "--write"])
    assert tr.emit(results, args, 0.0) == 0
    assert tr.TABLE.read_text() == (tmp_path / "out" / "route_tuning.toml").read_text() == tr.render_table(results)
    assert json.loads((tmp_path / "out" / tr.TIMINGS).read_text()) == results
    assert len(recorded) == 7 and recorded[-1]["goal"] == "every projection GEMM at least 0.9x cuBLAS"


def test_a_named_class_is_measured_instead_of_the_served_one_where_its_region_holds(monkeypatch, capsys):
    assert tr.parse_args(["--bundle", "b", "--key", "k", "--class", "wgmma-k16"]).no_record  # comparison only
    split = [("d1024 x_proj", 96, 2048), ("d64 in_proj", 256, 64)]  # the split class serves x_proj, not in_proj
    (served,) = _device_run(monkeypatch, shapes=split[:1])
    assert served["class"] == "wgmma-k16-split8"
    assert all("splitk8" in s for s in served["shapes"][0]["M"]["1"]["rungs"])
    (whole,) = _device_run(monkeypatch, eq_class="wgmma-k16", shapes=split[:1])
    row = whole["shapes"][0]["M"]["1"]
    assert whole["class"] == "wgmma-k16" and "skinny_m64n32_s18_bf16" in " ".join(row["rungs"])
    assert not any("splitk" in s for s in row["rungs"]) and "splitk8" in row["served"]  # what serves now: split 8
    (entry,) = _device_run(monkeypatch, eq_class="wgmma-k16-split8", shapes=split)
    assert [s["name"] for s in entry["shapes"]] == ["d1024 x_proj"]  # K 64 is outside the split class's region
    assert "class wgmma-k16-split8 does not serve (N 256, K 64) here; not measured" in capsys.readouterr().out


def test_a_rung_off_its_class_bits_is_dropped_and_the_run_fails(monkeypatch, tmp_path, capsys):
    off = "gemm_bi_nn_sm90a_wgmma_skinny_m64n32_s18_bf16"
    (entry,) = _device_run(monkeypatch, off=off)
    assert list(entry["dropped"]) == [off] and "at d64 x_proj M 1" in entry["dropped"][off]
    assert all(off not in row["rungs"] for s in entry["shapes"] for row in s["M"].values())
    results = {"gpu": "CPU stand-in", "date": "d", "inner": 10, "reps": 5, "tie": 0.02, "entries": [entry]}
    args = tr.parse_args(["--bundle", "b", "--key", "k", "--out", str(tmp_path), "--no-record"])
    assert tr.emit(results, args, 0.0) == 1
    assert f"DROPPED {off}" in capsys.readouterr().out


def test_a_launch_the_runtime_refuses_leaves_that_rung_out_and_the_run_goes_on(monkeypatch, capsys):
    wg1 = f"{P}wg1_bf16"
    (entry,) = _device_run(monkeypatch, refuse=wg1)
    rows = [(s["name"], int(m), row) for s in entry["shapes"] for m, row in s["M"].items()]
    assert len(rows) == 6 and not entry["dropped"]
    assert all((wg1 in row["rungs"]) == (m <= 64) for _name, m, row in rows)
    assert f"{wg1} refused at d64 x_proj M=300" in capsys.readouterr().out
