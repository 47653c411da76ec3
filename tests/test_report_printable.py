"""`report` prints manifests it has not verified: every string from one (device name, rejection reasons, names,
paths, a compile log) reaches the terminal escaped (errors.printable) and on its own line, in text off and on a
terminal, in --format markdown and in --diff; --json keeps the strings as they are (JSON escapes them itself)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import tomli_w

from mamba_forge.cli import main
from mamba_forge.runtime import signing

H200_TOML = Path(__file__).resolve().parent.parent / "manifests" / "h200.toml"
DEVICE = "NVIDIA\x1b]0;pwned\x07 H200\nerror: forged"
REASON = "\x1b[2J\nok: forged"
RAW = ("\x1b]", "\x07", "\x1b[2J")  # never in the output (a terminal gets rich's own styles, nothing more)


def _body() -> dict:
    """The committed H200 manifest, cut to its first 40 symbols (the whole one takes seconds to write)."""
    body, _ = signing.split(H200_TOML.read_bytes())
    doc = tomllib.loads(body.decode())
    doc["symbols"] = doc["symbols"][:40]
    keep = {(s["module"], s["target"]) for s in doc["symbols"]}
    doc["artifacts"] = [a for a in doc["artifacts"] if (a["module"], a["target"]) in keep]
    doc["routes"] = []
    return doc


def _hostile(doc: dict) -> dict:
    doc["device"]["name"] = DEVICE
    s = doc["symbols"][0]
    s.update(status="rejected", check="correctness", reason=REASON)
    return doc


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("printable")
    good, bad = tmp / "good.toml", tmp / "bad.toml"
    good.write_text(tomli_w.dumps(_body()))
    bad.write_text(tomli_w.dumps(_hostile(_body())))
    return good, bad


def _clean(out: str) -> None:
    assert not any(r in out for r in RAW), out[:2000]
    lines = out.splitlines()
    assert not any(ln.lstrip("#| -").startswith(("ok: forged", "error: forged")) for ln in lines)


def _report(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("terminal", [False, True])
def test_text_escapes_the_device_name_and_reasons(manifests, cli_consoles, capsys, terminal):
    cli_consoles(width=400, force_terminal=terminal)
    rc, out = _report(capsys, "report", manifests[1])
    assert rc == 0
    _clean(out)
    assert "NVIDIA\\x1b]0;pwned\\x07 H200\\nerror: forged" in out
    assert "\\x1b[2J\\nok: forged" in out


def test_markdown_escapes_them(manifests, cli_consoles, capsys):
    cli_consoles()
    rc, out = _report(capsys, "report", manifests[1], "--format", "markdown")
    assert rc == 0
    _clean(out)
    assert "# mamba-forge kernels qualified on NVIDIA\\x1b]0;pwned\\x07 H200\\nerror: forged\n" in out
    assert "\\x1b[2J ok: forged |" in out  # the table cell: its newline a space (as before), its ESC escaped


def test_json_keeps_the_strings(manifests, cli_consoles, capsys):
    cli_consoles()
    rc, out = _report(capsys, "report", manifests[1], "--json")
    assert rc == 0 and "\x1b" not in out
    result = json.loads(out)["result"]
    assert result["device"]["name"] == DEVICE and result["rejected"][0]["reason"] == REASON


def test_diff_escapes_the_reasons(manifests, cli_consoles, capsys):
    cli_consoles(width=400)
    rc, out = _report(capsys, "report", "--diff", manifests[0], manifests[1], "--digests")
    assert rc == 1
    _clean(out)
    assert "\\x1b[2J\\nok: forged" in out


def test_an_index_escapes_its_entries(tmp_path, cli_consoles, capsys):
    ix = {"schema_version": 1, "kind": "index", "manifest_version": 1, "created": "2026-01-01T00:00:00Z",
          "expires": "2099-01-01T00:00:00Z", "tool_version": "0.1\x1b[31m",
          "entries": [{"path": "h200.toml", "sha256": "0" * 64, "size": 1, "device_name": DEVICE, "cc": "9.0",
                       "sm_count": 132}]}
    p = tmp_path / "index.toml"
    p.write_text(tomli_w.dumps(ix))
    for terminal in (False, True):
        cli_consoles(width=400, force_terminal=terminal)
        rc, out = _report(capsys, "report", p)
        assert rc == 0
        _clean(out)
        assert "\\x07" in out
    rc, out = _report(capsys, "report", p, "--format", "markdown")
    assert rc == 0
    _clean(out)


def test_a_build_manifest_escapes_reasons_names_and_its_log(tmp_path, cli_consoles, capsys):
    from mamba_forge.core.codec import from_dict, to_dict
    from mamba_forge.core.schema import BuildManifest

    sym = {"name": "k\x1b[31m", "family": "f", "block": [128, 1, 1], "dynamic_smem": 0, "deterministic": True,
           "verdict": {"status": "rejected", "reason": REASON, "check": "registers"}}
    mod = {"kind": "Fixed\x07", "target": "sm_90a", "role": "qualify", "mandatory": False, "status": "failed",
           "log_head": "line one \x1b]0;pwned\x07\nline two", "options": [], "source_sha256": "0" * 64,
           "cache_key": "0" * 64, "symbols": [sym]}
    m = from_dict(BuildManifest, {"tool_version": "0.1", "catalog": "cat\nerror: forged", "catalog_sha256": "0" * 64,
                                  "state_capacity": 1, "targets": ["sm_90a"], "modules": [mod],
                                  "toolchain": {"nvrtc_version": "12", "library": {}, "header_sha256": {},
                                                "base_options": []}})
    p = tmp_path / "manifest.toml"
    p.write_text(tomli_w.dumps(to_dict(m)))
    for terminal in (False, True):
        cli_consoles(width=400, force_terminal=terminal)
        rc, out = _report(capsys, "report", p, "--symbols", "k*")
        assert rc == 0
        _clean(out)
        assert "\\x1b[2J\\nok: forged" in out and "cat\\nerror: forged" in out
        assert "line one \\x1b]0;pwned\\x07\nline two" in out  # the log keeps its lines, each escaped


def test_a_check_that_ran_on_nothing_reads_not_run(tmp_path, capsys):
    """The qualifier records a placement check with no placement run as not passed (no pass where nothing was
    compared); report says so as 'not run', and a failed check still as FAILED."""
    doc = _body()
    s = doc["symbols"][0]
    checks = s["checks"]
    at = next(i for i, c in enumerate(checks) if c["name"] == "placement")
    checks[at].update(passed=False, detail="not run: no placement could be run")
    other = next(i for i, c in enumerate(checks) if i != at)
    checks[other].update(passed=False, detail="bitwise different")
    path = tmp_path / "m.toml"
    path.write_text(tomli_w.dumps(doc))
    rc, out = _report(capsys, "report", path, "--symbols", s["name"])
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("checks:"))
    assert "placement (not run)" in line and line.count("(FAILED)") == 1, line
    rc, out = _report(capsys, "report", path, "--symbols", s["name"], "--digests")
    assert any(ln.strip().startswith("placement not run") for ln in out.splitlines()), out
