"""Hostile GEMM route files (`[catalog] routes = [...]`, mamba_forge/catalog/routes.py): generated mutations of
the qualify fixture's valid route file either load or raise one CatalogError line, within bounded time, and never
another exception; through the CLI (`build --catalog ... --dry-run`) a refused one exits 2 with one line and
writes nothing. `qualify --kernels` globs that match nothing exit 2 before any GPU is touched."""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import pytest
from harden_support import cli, one_line_error

from mamba_forge.catalog.model import load_catalog
from mamba_forge.core.errors import CatalogError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "qualify_negative"
VALID = (FIXTURE / "routes.toml").read_text()

# replacement values a mutation may put in place of a token of the valid file
HOSTILE = ['"*"', '"[!"', '"' + "x" * 5000 + '"', "-1", "0", "4097", "1e309", "true", "[]", "{}", '"nn"', '"tf32"',
           '"{dtype}"', '"{name}"', '"../x"', '"\\u0000"', "[1, 0]", "[0, 0]", "[65, 1]", "{ q = 1 }", "{ n = 0 }",
           '"control_gemm_chain"', '"pairwise_gemm"', '"control_row_sum"', "inf", "nan", '"a b"']
TOKEN = r'"[^"\n]*"|-?\d+|\[[^\[\]\n]*\]|\{[^{}\n]*\}'
CASES = 160


def _mutations(seed: int) -> list[str]:
    import re

    rng = random.Random(seed)
    spots = [m.span() for m in re.finditer(TOKEN, VALID)]
    out = []
    for _ in range(CASES):
        text = VALID
        for a, b in sorted(rng.sample(spots, rng.randint(1, 3)), reverse=True):
            text = text[:a] + rng.choice(HOSTILE) + text[b:]
        if rng.random() < 0.2:  # a structural cut: a truncated or doubled file
            text = text[: rng.randrange(len(text))] if rng.random() < 0.5 else text + "\n" + text
        out.append(text)
    return out


@pytest.fixture(scope="module")
def catalog_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("routes") / "cat"
    shutil.copytree(FIXTURE, root)
    return root


@pytest.mark.parametrize("seed", range(4))
def test_mutated_route_files_load_or_refuse_in_one_line(catalog_copy, seed):
    outcomes = {"loaded": 0, "refused": 0}
    for text in _mutations(seed):
        (catalog_copy / "routes.toml").write_text(text)
        t0 = time.perf_counter()
        try:
            cat = load_catalog(catalog_copy / "catalog.toml")
        except CatalogError as exc:
            msg = str(exc)
            assert msg and "\n" not in msg.strip() and "Traceback" not in msg, msg[:300]
            assert len(msg) < 2000, f"{len(msg)}-character error"
            outcomes["refused"] += 1
        else:  # what loads obeys the rules: every class serves every M, names exist
            for r in cat.routes:
                for c in r.classes:
                    assert any((x.m_min, x.m_max) == (1, 0) for x in c.rungs)
                    assert all(x.symbol in cat.symbols for x in c.rungs)
            outcomes["loaded"] += 1
        assert time.perf_counter() - t0 < 5
    assert outcomes["refused"] > CASES // 2, outcomes  # the mutations are mostly hostile: most must be refused


@pytest.mark.parametrize("text", [
    '[[route]]\nlayout = "nn"\na = "f32"\nb = "f32"\nc = "f32"\nclasses = [{ name = "x", rungs = [{ symbols = "nope" }] }]\n',
    "[[route]]\n" * 3,
    "route = [" * 200,
])
def test_a_refused_route_file_stops_the_build_with_exit_2(tmp_path, text):
    root = tmp_path / "cat"
    shutil.copytree(FIXTURE, root)
    (root / "routes.toml").write_text(text)
    out = tmp_path / "out"
    rc, stdout, err = cli("build", "--catalog", root / "catalog.toml", "--arch", "sm_90a", "--out", out, "--dry-run")
    assert rc == 2, (rc, err)
    assert one_line_error(err), err
    assert not out.exists()


def test_qualify_kernels_that_match_nothing_exit_2_before_the_gpu(tmp_path):
    from runtime_support import build_tiny, write_tiny_catalog

    cat = write_tiny_catalog(tmp_path / "cat")
    build_tiny(cat, tmp_path / "build", tmp_path / "cache")
    for glob in ("zz_*", "", "x" * 300):
        rc, _out, err = cli("qualify", "--build", tmp_path / "build", "--catalog", cat, "--kernels", glob,
                            "--out", tmp_path / "q" / "m.toml")
        assert rc == 2, (glob[:10], rc, err)
        assert one_line_error(err), err
        assert not (tmp_path / "q").exists()
