"""No module over 400 lines (issue 28): every mamba_forge/**/*.py and every benchmarks/*.py script. A module that
grows past the limit is split along a seam into cohesive modules (re-exporting what other code imports), not
allowed an exception here."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def oversized(files: list[Path], limit: int = MAX_LINES) -> list[str]:
    """'path: N lines' for each file over `limit` lines, longest first."""
    counts = [(len(f.read_text(encoding="utf-8").splitlines()), f) for f in files]
    return [f"{f.relative_to(ROOT).as_posix()}: {n} lines" for n, f in sorted(counts, reverse=True) if n > limit]


def _modules() -> list[Path]:
    return sorted((ROOT / "mamba_forge").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))


def test_no_module_is_over_400_lines():
    files = _modules()
    assert len(files) > 100  # not vacuous: the package and the benchmark scripts were found
    assert oversized(files) == [], f"split these modules (at most {MAX_LINES} lines each)"


def test_the_check_names_a_module_over_the_limit():
    # the checker itself reports: with a lower limit, the longest modules are listed by path and count
    found = oversized(_modules(), limit=300)
    assert found and all(" lines" in line and line.split(":")[0].endswith(".py") for line in found)
