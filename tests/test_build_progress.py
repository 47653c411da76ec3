"""`mamba-forge build` progress (issue #26): a header line first, naming targets, programs, symbols and cache hits,
then one line per finished program with an estimate of what remains; nothing with -q. Through the CLI off a
terminal (a log or a pipe), on the tiny catalog of tests/runtime_support.py."""

from __future__ import annotations

import re

import pytest
from runtime_support import write_tiny_catalog

from mamba_forge.cli import main
from mamba_forge.progress import Progress, about


class _Lines:
    """A console stand-in that keeps what it is asked to print."""

    is_terminal = False

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **kw) -> None:
        self.lines.append(text)


@pytest.fixture(scope="module")
def cat(tmp_path_factory):
    return write_tiny_catalog(tmp_path_factory.mktemp("progress") / "cat")


@pytest.fixture(autouse=True)
def _log_console(cli_consoles):
    cli_consoles(80)


def _build(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["build", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


UNIT = re.compile(r"^\[(\d)/2\] Tiny sm_(90a|80) (\d+\.\d s|cached)( \(about \d+ (s|min) left\))?$")


def test_header_first_then_a_line_per_program_with_an_estimate(cat, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(tmp_path / "cache"))
    rc, out, err = _build(capsys, "--catalog", cat, "--arch", "sm_90a,sm_80", "--out", tmp_path / "b", "-j", "1")
    assert rc == 0, err
    lines = err.splitlines()
    assert lines[0] == ("build: 2 programs, 20 symbols for 2 targets (sm_90a, sm_80); 0 cached, 2 to compile "
                        "with 1 worker (about 5 s, a first guess)"), lines
    units = [UNIT.match(line) for line in lines[1:]]
    assert all(units) and [m.group(1) for m in units] == ["1", "2"], lines
    assert units[0].group(3).endswith(" s") and units[0].group(4), lines[1]  # timed, with what remains
    assert units[1].group(4) is None, lines[2]  # nothing left after the last one
    assert "built 2 programs, 20 symbols" in out

    # the same build again: every program a cache hit, said in the header; no estimate (nothing to compile)
    rc, out, err = _build(capsys, "--catalog", cat, "--arch", "sm_90a,sm_80", "--out", tmp_path / "b2", "-j", "1")
    assert rc == 0, err
    lines = err.splitlines()
    assert lines[0] == "build: 2 programs, 20 symbols for 2 targets (sm_90a, sm_80); 2 cached, 0 to compile"
    assert lines[1:] == ["[1/2] Tiny sm_90a cached", "[2/2] Tiny sm_80 cached"]

    # -q: no header, no unit lines, no table
    rc, out, err = _build(capsys, "--catalog", cat, "--arch", "sm_90a,sm_80", "--out", tmp_path / "b3", "-q")
    assert (rc, out, err) == (0, "", "")


def test_header_counts_the_selection_and_json_keeps_stdout_clean(cat, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(tmp_path / "cache"))
    rc, out, err = _build(capsys, "--catalog", cat, "--arch", "sm_90a", "--kernels", "scale_*", "--out",
                          tmp_path / "b", "-j", "1", "--json")
    assert rc == 0, err
    header = err.splitlines()[0]
    assert re.fullmatch(r"build: 1 program, (\d+) symbols for 1 target \(sm_90a\); 0 cached, 1 to compile with "
                        r"1 worker \(about \d+ s, a first guess\)", header), header
    assert int(re.search(r"(\d+) symbols", header).group(1)) < 10  # the --kernels selection, not the catalog
    assert out.lstrip().startswith("{") and "build:" not in out


def test_estimate_uses_the_prior_then_the_mean_of_finished_units():
    con = _Lines()
    with Progress("build", 5, con, mode="lines") as p:
        p.begin("header", timed=4, workers=2, prior_s=10.0)
        assert p.remaining_s() == 20.0  # 4 units, 2 at a time, 10 s each
        p.finished("A cached", tag="cached")  # a cache hit is not timed: the prior still stands
        p.finished("B", seconds=30.0)  # mean 30 s; 3 left, 2 at a time: 2 rounds
        p.finished("C", seconds=90.0)  # mean 60 s; 2 left: 1 round
        p.finished("D", seconds=60.0)
        p.finished("E", seconds=60.0)
    assert con.lines == ["header", "[1/5] A cached cached (about 20 s left)", "[2/5] B 30.0 s (about 1 min left)",
                         "[3/5] C 90.0 s (about 1 min left)", "[4/5] D 60.0 s (about 1 min left)", "[5/5] E 60.0 s"]


def test_weighted_estimate_counts_the_weight_left_not_the_units_left():
    """A build's programs weigh their symbols: two Fixed programs of 200 symbols first (60 s each), then small ones
    of 3. Counting units, the first line would say 60 s a unit x 2 rounds = 2 min for about 3 s of work (a cold
    default build said 'about 22 min left' with 4 left); by weight it says 0.3 s a symbol x 206 over 2 workers."""
    con = _Lines()
    with Progress("build", 4, con, mode="lines") as p:
        p.begin("header", timed=4, workers=2, prior_s=0.5, weight=406)
        assert p.remaining_s() == 0.5 * 406 / 2  # the prior is per symbol
        p.finished("Fixed a", seconds=60.0, weight=200)
        assert p.remaining_s() == pytest.approx(0.3 * 206 / 2)
        p.finished("Fixed b", seconds=60.0, weight=200)
        assert p.remaining_s() == pytest.approx(0.3 * 6 / 2)
        p.finished("Small a", seconds=1.0, weight=3)
        assert p.remaining_s() == pytest.approx(121.0 / 403 * 3)  # one unit left: one worker runs it
        p.finished("Small b", seconds=1.0, weight=3)
        assert p.remaining_s() is None
    assert con.lines[1] == "[1/4] Fixed a 60.0 s (about 30 s left)"


def test_no_estimate_without_begin_or_prior_and_nothing_when_off():
    con = _Lines()
    with Progress("qualify", 2, con, mode="lines") as p:  # the qualifier never calls begin: lines as before
        p.finished("G0", seconds=3.0)
        p.begin("header", timed=2, workers=1, prior_s=None)
        assert p.remaining_s() is not None  # one finished: its mean is the estimate
    assert con.lines == ["[1/2] G0 3.0 s", "header"]
    quiet = _Lines()
    with Progress("build", 2, quiet, quiet=True) as p:
        p.begin("header", timed=2, prior_s=5.0)
        p.finished("A", seconds=1.0)
        p.note("a note")
    assert quiet.lines == []
    with Progress("build", 1, None) as p:  # no console (`build -q` makes none): nothing to print to, nothing printed
        assert p.mode == "off"
        p.begin("header", timed=1, prior_s=5.0)
        p.finished("A", seconds=1.0)
    fresh = Progress("build", 2, _Lines(), mode="lines")
    fresh.begin("h", timed=2, prior_s=None)
    assert fresh.remaining_s() is None  # no prior, nothing finished: no figure made up


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "about 5 s"), (42, "about 40 s"), (58, "about 60 s"),
                                                (61, "about 1 min"), (389, "about 6 min"), (3599, "about 60 min"),
                                                (5400, "about 1.5 h")])
def test_about(seconds, text):
    assert about(seconds) == text
