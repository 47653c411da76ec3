"""CLI conventions of issue 13: `report` readable at 80 columns, `report --diff` digest counts, progress lines
off a terminal, one `--json` envelope validated against the shipped schemas, `--dry-run`, `build --module`,
completion, plain help text, the exit-code table per command, and `qualify --out`/`--build` checked up front."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
import tomli_w
from runtime_support import signed_tiny

from mamba_forge import schemas
from mamba_forge.cli import main
from mamba_forge.cli.cmd_qualify import auto_qualify_jobs
from mamba_forge.runtime import signing

ROOT = Path(__file__).resolve().parents[1]
H200_TOML = ROOT / "manifests" / "h200.toml"
HEX64 = re.compile(r"\b[0-9a-f]{64}\b")


@pytest.fixture(autouse=True)
def _isolated(cli_consoles, tmp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    # what a person sees on an 80-column terminal (no colour codes); off a terminal the report is one line per item
    cli_consoles(80, force_terminal=True, color_system=None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return signed_tiny(tmp_path_factory.mktemp("conv"), build_manifest=True, table=False)


def _admitted(build: Path, every: bool = False) -> int:
    from mamba_forge.core.schema import BuildManifest
    from mamba_forge.manifest.toml_io import read

    bm = read(build / "manifest.toml", BuildManifest)
    return sum(every or s.verdict.status == "admitted" for _, s in bm.symbols())


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def envelope(capsys, *argv, schema: str | None = None):
    rc, out, err = run(capsys, *argv, "--json")
    doc = json.loads(out)  # the whole of stdout is one JSON document
    name = schema or schemas.file_name(doc["command"])
    jsonschema.validate(doc, json.loads(schemas.shipped(name)))
    jsonschema.validate(doc, json.loads(schemas.shipped("envelope")))
    assert doc["ok"] is (rc == 0)
    return rc, doc, err


def one_line(err: str) -> bool:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err


def _h200_body() -> dict:
    body, _ = signing.split(H200_TOML.read_bytes())
    return tomllib.loads(body.decode())


def _write_body(path: Path, body: dict) -> Path:
    path.write_text(tomli_w.dumps(body))
    return path


# ---- 1. report at 80 columns ----------------------------------------------------------------------------------


def test_report_of_the_committed_manifest_fits_80_columns(capsys):
    rc, out, _ = run(capsys, "report", H200_TOML)
    lines = out.splitlines()
    assert rc == 0 and len(lines) <= 110 and "…" not in out
    assert max(len(ln) for ln in lines) <= 80
    assert not HEX64.search(out)  # digests only behind --digests
    assert "Fixed" in out and "Sm120" in out and "--symbols GLOB" in out


def test_every_rejected_name_is_shown_whole_at_80_columns(capsys, tmp_path):
    body = _h200_body()
    already = sum(s.get("status") == "rejected" for s in body["symbols"][8:])  # the committed manifest's own
    long_names = []
    for s in body["symbols"][:7]:
        s.update(status="rejected", check="batch", reason=f"{s['name']}: row 3 differs between batch 1 and 64")
        long_names.append(s["name"])
    longest = "x" * 95  # longer than a line: folded, never cut
    body["symbols"][7].update(name=longest, status="rejected", check="smem", reason="too much shared memory")
    p = _write_body(tmp_path / "rej.toml", body)
    rc, out, _ = run(capsys, "report", p)
    assert rc == 0 and "…" not in out and max(len(ln) for ln in out.splitlines()) <= 80
    assert len(out.splitlines()) <= 110
    for name in long_names:
        assert name in out
    assert longest in "".join(ln.strip() for ln in out.splitlines())
    assert f"rejected ({8 + already})" in out


def test_symbols_and_digests_only_when_asked(capsys):
    rc, out, _ = run(capsys, "report", H200_TOML, "--symbols", "softplus_forward_bf16")
    assert rc == 0 and "regs 48" in out and "checks: admission correctness" in out and not HEX64.search(out)
    rc, out, _ = run(capsys, "report", H200_TOML, "--symbols", "softplus_forward_bf16", "--digests")
    assert rc == 0 and HEX64.search(out) and "…" not in out
    rc, out, _ = run(capsys, "report", H200_TOML, "--kernels", "softplus*")
    assert rc == 0 and "│ Fixed " in out and "│ TriadSm80 " not in out  # the summary counts only matching symbols
    for flag in ("--symbols", "--kernels"):
        rc, out, err = run(capsys, "report", H200_TOML, flag, "nothing_like_this*")
        assert rc == 2 and out == "" and one_line(err) and "matches no symbol" in err


# ---- 2. report --diff ----------------------------------------------------------------------------------------


def test_diff_counts_digest_changes_unless_asked(capsys, tmp_path):
    a = _write_body(tmp_path / "a.toml", _h200_body())
    body = _h200_body()
    for s in body["symbols"]:
        for c in s.get("checks", []):
            if c.get("digest"):
                c["digest"] = "0" * 64
    body["symbols"][0]["resources"]["registers"] += 1
    b = _write_body(tmp_path / "b.toml", body)
    changed = sum(any(c.get("digest") for c in s.get("checks", [])) for s in body["symbols"])
    rc, out, _ = run(capsys, "report", "--diff", a, b)
    assert rc == 1 and f"{changed:,} symbols changed digest" in out
    assert "registers" in out and len(out.splitlines()) < 20 and "0" * 64 not in out
    rc, out, _ = run(capsys, "report", "--diff", a, b, "--digests")
    assert rc == 1 and out.count("0" * 64) >= changed
    rc, doc, _ = envelope(capsys, "report", "--diff", a, b)
    assert rc == 1 and doc["result"]["digest_changed_symbols"] == changed and doc["ok"] is False
    rc, out, _ = run(capsys, "report", "--diff", a, a)
    assert rc == 0 and "no differences" in out
    rc, out, err = run(capsys, "report", "--diff", tmp_path / "missing.toml", a)
    assert rc == 2 and out == "" and one_line(err)
    (tmp_path / "junk.toml").write_text("kind = 'nope'\n")
    rc, out, err = run(capsys, "report", "--diff", a, tmp_path / "junk.toml")
    assert rc == 2 and out == "" and one_line(err)


# ---- 3. progress ---------------------------------------------------------------------------------------------


def test_progress_lines_off_a_terminal():
    from rich.console import Console

    from mamba_forge import progress

    c = Console(record=True, width=80, force_terminal=False)
    with progress.Progress("build", 2, c) as p:
        assert p.mode == "lines"
        p.started("Fixed sm_90a")
        assert p.finished("Fixed sm_90a", seconds=41.23) == "[1/2] Fixed sm_90a 41.2 s"
        p.finished("Sm120 sm_90a", tag="cached")
    assert c.export_text().splitlines() == ["[1/2] Fixed sm_90a 41.2 s", "[2/2] Sm120 sm_90a cached"]
    q = Console(record=True, width=80)
    with progress.Progress("build", 1, q, quiet=True) as p:
        p.finished("x", seconds=1.0)
        p.note("hidden")
    assert q.export_text() == ""
    assert progress.choose_mode(Console(force_terminal=True), quiet=False) == "bar"


def test_build_prints_one_line_per_program_and_q_silences(capsys, tiny, tmp_path):
    rc, out, err = run(capsys, "build", "--catalog", tiny.cat, "--out", tmp_path / "o", "--arch", "sm_90a,sm_80")
    assert rc == 0
    assert re.search(r"^\[1/2\] Tiny sm_(90a|80) (cached|[0-9.]+ s)( \(about \d+ s left\))?$", err, re.M), err
    assert re.search(r"^\[2/2\] Tiny sm_(90a|80)", err, re.M)
    rc, out, err = run(capsys, "build", "--catalog", tiny.cat, "--out", tmp_path / "o", "--arch", "sm_90a", "-q")
    assert rc == 0 and out == "" and err == ""


# ---- 4. --json and its schemas ---------------------------------------------------------------------------------


def test_shipped_schemas_are_the_generated_ones():
    gen = schemas.generate()
    folder = Path(schemas.__file__).parent
    assert sorted(p.stem for p in folder.glob("*.json")) == sorted(gen)
    for name, schema in gen.items():
        assert schemas.shipped(name) == schemas.dumps(schema), f"{name}.json is stale: python scripts/gen_schemas.py"
        jsonschema.Draft202012Validator.check_schema(schema)
    qm = gen["qualify"]["$defs"]["QualifiedManifest"]  # generated from the records, not written by hand
    assert "symbols" in qm["properties"] and qm["additionalProperties"] is False


def test_every_command_json_validates(capsys, tiny, tmp_path):
    assert envelope(capsys, "build", "--catalog", tiny.cat, "--out", tmp_path / "b", "--arch", "sm_90a")[0] == 0
    assert envelope(capsys, "build", "--catalog", tiny.cat, "--out", tmp_path / "d", "--dry-run")[0] == 0
    for target in (tiny.build / "manifest.toml", tiny.manifest, H200_TOML):
        assert envelope(capsys, "report", target)[0] == 0
    assert envelope(capsys, "verify", tiny.manifest, "--key", tiny.pub)[0] == 0
    bundle = tmp_path / "h200.tar.gz"
    assert envelope(capsys, "bundle", tiny.manifest, "--build", tiny.build, "-o", bundle, "--key", tiny.pub)[0] == 0
    index = tmp_path / "index.toml"
    rc, doc, _ = envelope(capsys, "merge", bundle, "-o", index, "--sign-key", tiny.key_path, "--key", tiny.pub)
    assert rc == 0 and doc["result"]["path"] == str(index)
    assert envelope(capsys, "report", index)[0] == 0
    assert envelope(capsys, "keygen", "--out", tmp_path / "k", "--name", "x")[0] == 0
    assert envelope(capsys, "env")[0] == 0
    for sub in ("dir", "size", "clean"):
        assert envelope(capsys, "cache", sub)[1]["command"] == f"cache {sub}"
    assert envelope(capsys, "cache", "prune", "--max-size", "1G")[0] == 0
    assert envelope(capsys, "schema")[1]["result"]["names"] == schemas.names()
    assert envelope(capsys, "schema", "verify")[1]["result"]["title"] == "mamba-forge verify --json"
    rc, doc, _ = envelope(capsys, "qualify", "--build", tiny.build, "--dry-run")
    assert rc == 0 and doc["result"]["symbols"] == _admitted(tiny.build) > 0
    # --jobs 0 (the default): one worker per two CPUs, 2 to 8; an explicit count is kept
    assert doc["result"]["jobs_per_gpu"] == auto_qualify_jobs()
    rc, doc, _ = envelope(capsys, "qualify", "--build", tiny.build, "--dry-run", "-j", "3")
    assert rc == 0 and doc["result"]["jobs_per_gpu"] == 3


def test_auto_qualify_jobs_bounds():
    assert [auto_qualify_jobs(n) for n in (1, 2, 4, 6, 16, 17, 128)] == [2, 2, 2, 3, 8, 8, 8]


@pytest.mark.parametrize(("argv", "code"), [
    (["report", "missing.toml"], 2), (["verify", "missing.toml"], 2), (["build", "--arch", "sm_1"], 2),
    (["cache", "prune"], 2), (["qualify", "--level", "slow"], 2), (["schema", "nope"], 2),
    (["build", "--no-such-option"], 2), (["keygen", "--name", "../x"], 2),
])
def test_json_errors_are_envelopes_too(capsys, argv, code):
    rc, doc, err = envelope(capsys, *argv, schema="envelope")
    assert rc == code and doc["ok"] is False and doc["result"]["exit_code"] == code and doc["result"]["error"]
    assert one_line(err)


def test_verify_failure_json(capsys, tiny):
    rc, doc, _ = envelope(capsys, "verify", tiny.manifest)  # no trusted key: the check fails
    assert rc == 1 and doc["result"]["exit_code"] == 1 and "not trusted" in doc["result"]["error"]


# ---- 5/6. --dry-run and --module ---------------------------------------------------------------------------------


def test_dry_runs_write_no_memo_into_an_existing_cache(capsys, tiny, tmp_path, monkeypatch):
    """The memos kept in the cache (loaded catalog, compiler identity, parsed TOML) are read by a dry run, never
    written; the same commands without --dry-run write them (the control)."""
    from mamba_forge.core import tomlmemo

    cache = tmp_path / "memo-cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(cache))
    monkeypatch.setattr(tomlmemo, "MIN_BYTES", 1)  # the tiny build manifest is memoised too
    from mamba_forge.build import nvrtc

    nvrtc.library_identity.cache_clear()
    try:
        argv = ["build", "--catalog", tiny.cat, "--out", tmp_path / "o", "--arch", "sm_90a"]
        rc, _, err = run(capsys, *argv, "--dry-run")
        assert rc == 0, err
        rc, _, err = run(capsys, "qualify", "--build", tiny.build, "--catalog", tiny.cat, "--dry-run")
        assert rc == 0, err
        assert [p for p in cache.rglob("*") if p.is_file()] == [] and not (tmp_path / "o").exists()
        rc, _, err = run(capsys, "report", tiny.build / "manifest.toml")  # the control: a read that memoises
        assert rc == 0 and [p for p in cache.rglob("*") if p.is_file() and p.parent.name != "locks"], err
    finally:
        nvrtc.library_identity.cache_clear()


def test_build_dry_run_writes_nothing(capsys, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(tmp_path / "fresh-cache"))
    rc, out, err = run(capsys, "build", "--catalog", tiny.cat, "--out", tmp_path / "o", "--arch", "sm_90a,sm_80",
                       "--dry-run")
    n = _admitted(tiny.build, every=True)
    assert rc == 0 and f"would compile 2 program(s), {2 * n} symbol(s)" in out and "0 hit(s), 2 to compile" in out
    assert "nothing written" in out
    assert not (tmp_path / "o").exists() and not (tmp_path / "fresh-cache").exists()
    rc, out, err = run(capsys, "build", "--catalog", tiny.cat, "--out", tmp_path / "o", "--arch", "sm_1", "--dry-run")
    assert rc == 2 and one_line(err) and not (tmp_path / "o").exists()


def test_build_dry_run_sees_cache_hits(capsys, tiny, tmp_path):
    assert run(capsys, "build", "--catalog", tiny.cat, "--out", tmp_path / "o", "--arch", "sm_90a", "-q")[0] == 0
    rc, doc, _ = envelope(capsys, "build", "--catalog", tiny.cat, "--out", tmp_path / "o2", "--arch", "sm_90a",
                          "--dry-run")
    assert rc == 0 and doc["result"]["cache"]["hits"] == 1 and doc["result"]["jobs"][0]["cached"] is True
    assert not (tmp_path / "o2").exists()


def test_build_module_filter(capsys, tmp_path):
    basic = ROOT / "tests" / "fixtures" / "build_basic" / "catalog.toml"
    rc, doc, _ = envelope(capsys, "build", "--catalog", basic, "--out", tmp_path / "o", "--arch", "sm_90a",
                          "--module", "Basic", "--dry-run")
    assert rc == 0 and {j["module"] for j in doc["result"]["jobs"]} == {"Basic"}
    rc, out, err = run(capsys, "build", "--catalog", basic, "--out", tmp_path / "o", "--module", "Nope")
    assert rc == 2 and one_line(err) and "no such module kind" in err and not (tmp_path / "o").exists()


def test_qualify_dry_run_without_a_gpu(capsys, tiny, tmp_path, monkeypatch):
    from mamba_forge.gpu import driver as cu

    def no_gpu():
        raise cu.CudaError("cuInit", "CUDA_ERROR_NO_DEVICE")

    monkeypatch.setattr(cu, "device_count", no_gpu)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "qualify", "--build", tiny.build, "--catalog", tiny.cat, "--dry-run", "--level", "full")
    assert rc == 0 and f"would launch 1 group(s), {_admitted(tiny.build)} symbol(s)" in out and "sm_90a" in out
    assert not (tmp_path / "manifests").exists() and not (tmp_path / "build").exists()
    rc, out, err = run(capsys, "qualify", "--build", tiny.build, "--dry-run", "--module", "Nope")
    assert rc == 2 and one_line(err)
    rc, out, err = run(capsys, "qualify", "--dry-run")  # no GPU and no build: nothing to plan from
    assert rc == 2 and one_line(err)


# ---- 7/8. completion and help ---------------------------------------------------------------------------------


def test_show_completion_prints_a_script(capsys, monkeypatch):
    monkeypatch.setenv("SHELL", "/bin/bash")
    rc, out, _ = run(capsys, "--show-completion", "bash")
    assert rc == 0 and "complete" in out and "_completion" in out


COMMANDS = [[], ["build"], ["report"], ["verify"], ["merge"], ["bundle"], ["qualify"], ["keygen"], ["env"],
            ["schema"], ["cache"], ["cache", "dir"], ["cache", "size"], ["cache", "clean"], ["cache", "prune"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a) or "main")
def test_help_is_in_plain_words(capsys, argv):
    rc, out, _ = run(capsys, *argv, "-h")
    assert rc == 0 and "Usage:" in out
    for python in ("list[", "str]", "Path]", "NoneType", "Optional", "INTEGER", "FLOAT"):
        assert python not in out, (argv, python)
    assert not re.search(r"<(list|str|int|float|bool|path|Path)\b", out), argv
    if not argv:
        assert "Exit codes" in out and "bad input" in out and "--show-completion" in out


# ---- 9. the exit-code table, per command --------------------------------------------------------------------------


def test_exit_codes_per_command(capsys, tiny, tmp_path):
    def rc(*argv):
        return run(capsys, *argv)[0]

    bm = tiny.build / "manifest.toml"
    # report: 0 ok, 2 bad file; --diff: 0 equal, 1 different
    assert rc("report", bm) == 0 and rc("report", tmp_path / "none.toml") == 2
    assert rc("report", "--diff", tiny.manifest, tiny.manifest) == 0 and rc("report", "--diff", bm, tiny.manifest) == 1
    # verify: 0 ok, 1 tampered, 2 missing file
    tampered = tmp_path / "t.toml"
    tampered.write_bytes(tiny.manifest.read_bytes().replace(b"NVIDIA H200", b"NVIDIA H201"))
    assert rc("verify", tiny.manifest, "--key", tiny.pub) == 0
    assert rc("verify", tampered, "--key", tiny.pub, "--build", tiny.build) == 1
    assert rc("verify", tmp_path / "none.toml", "--key", tiny.pub) == 2
    # build: 0 ok, 2 bad arch / bad catalog
    assert rc("build", "--catalog", tiny.cat, "--out", tmp_path / "b", "--arch", "sm_90a", "-q") == 0
    assert rc("build", "--arch", "sm_1", "--out", tmp_path / "x") == 2
    assert rc("build", "--catalog", tmp_path / "none.toml", "--out", tmp_path / "x") == 2
    # bundle and merge: 0 ok, 1 the manifest does not verify, 2 a missing input
    assert rc("bundle", tiny.manifest, "--build", tiny.build, "-o", tmp_path / "a.tar.gz", "--key", tiny.pub) == 0
    assert rc("bundle", tiny.manifest, "--build", tiny.build, "-o", tmp_path / "u.tar.gz") == 1
    assert rc("bundle", tmp_path / "none.toml", "--build", tiny.build, "-o", tmp_path / "n.tar.gz") == 2
    assert rc("merge", tmp_path / "a.tar.gz", "-o", tmp_path / "i.toml", "--sign-key", tiny.key_path,
              "--key", tiny.pub) == 0
    assert rc("merge", tmp_path / "none.toml", "-o", tmp_path / "j.toml", "--sign-key", tiny.key_path) == 2
    # keygen: 0 ok, 2 an existing pair or a bad name
    assert rc("keygen", "--out", tmp_path / "k") == 0 and rc("keygen", "--out", tmp_path / "k") == 2
    assert rc("keygen", "--out", tmp_path / "k", "--name", "a/b") == 2
    # cache and env: 0 ok, 2 bad input
    assert rc("cache", "size") == 0 and rc("cache", "prune", "--max-size", "lots") == 2 and rc("env") == 0
    # schema: 0 ok, 2 unknown
    assert rc("schema", "build") == 0 and rc("schema", "nope") == 2
    assert not (tmp_path / "x").exists() and not (tmp_path / "n.tar.gz").exists()


# ---- 10. qualify --out and --build before any work ----------------------------------------------------------------


def _no_gpu_allowed(monkeypatch):
    from mamba_forge.gpu import driver as cu

    def touched():
        raise AssertionError("the GPU was opened before the paths were checked")

    monkeypatch.setattr(cu, "device_count", touched)


@pytest.mark.parametrize("case", ["folder", "file-as-folder", "input", "catalog-input", "bad-build", "no-build"])
def test_qualify_refuses_bad_paths_before_any_work(capsys, tiny, tmp_path, monkeypatch, case):
    _no_gpu_allowed(monkeypatch)
    before = sorted(p.name for p in tiny.build.iterdir())
    (tmp_path / "a-file").write_text("x")
    argv = ["qualify", "--build", tiny.build, "--catalog", tiny.cat]
    if case == "folder":
        argv += ["--out", tmp_path]
    elif case == "file-as-folder":
        argv += ["--out", tmp_path / "a-file" / "m.toml"]
    elif case == "input":
        argv += ["--out", tiny.build / "manifest.toml"]
    elif case == "catalog-input":
        argv += ["--out", tiny.cat]
    elif case == "bad-build":
        argv[2] = tmp_path / "a-file"
    else:
        argv[2] = tmp_path / "empty"
        (tmp_path / "empty").mkdir()
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "" and one_line(err), err
    assert sorted(p.name for p in tiny.build.iterdir()) == before
    assert (tmp_path / "a-file").read_text() == "x"


def test_envelope_keys_are_exactly_four(capsys):
    rc, doc, _ = envelope(capsys, "cache", "dir")
    assert rc == 0 and set(doc) == {"schema_version", "command", "ok", "result"} and doc["schema_version"] == 1


