"""`report` (build and qualified manifests, --json, --format markdown, --diff), `verify` and `merge`: outputs
and exit codes, through the CLI's entry point."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
from runtime_support import (
    H200,
    REJECTED,
    qualified_body,
    sign_body,
    signed_tiny,
)

from mamba_forge.cli import main
from mamba_forge.runtime import signing


@pytest.fixture(autouse=True)
def _isolated_trust(isolated_trust, monkeypatch):  # tests/conftest.py's, and no signing key from the environment
    monkeypatch.delenv(signing.KEY_ENV, raising=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return signed_tiny(tmp_path_factory.mktemp("rvm"), build_manifest=True, table=False)


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ---- verify -------------------------------------------------------------------------------------------------


def test_verify_ok_and_json(tiny, capsys):
    rc, out, err = run(capsys, "verify", tiny.manifest, "--key", tiny.pub)
    assert rc == 0 and err == ""
    assert out.startswith(f"ok: {tiny.manifest}: signature by key {tiny.kid[:16]}")
    assert "5 admitted symbol(s) for NVIDIA H200" in out and len(out.strip().splitlines()) == 1
    rc, out, _ = run(capsys, "verify", tiny.manifest, "--key", tiny.pub, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["ok"] is True and doc["command"] == "verify"
    assert {k: v for k, v in doc["result"].items() if k != "summary"} == {
        "path": str(tiny.manifest), "kind": "qualified", "key_id": tiny.kid, "development_key": False}


def test_verify_refusals_exit_1_with_one_line(tiny, tmp_path, capsys):
    rc, out, err = run(capsys, "verify", tiny.manifest)  # no trusted key
    assert rc == 1 and out == "" and "which is not trusted" in err and len(err.strip().splitlines()) == 1
    build = tmp_path / "build"
    shutil.copytree(tiny.build, build)
    cubin = build / "sm_90a" / "Tiny.cubin"
    data = bytearray(cubin.read_bytes())
    data[100] ^= 0xFF
    cubin.write_bytes(bytes(data))
    rc, out, err = run(capsys, "verify", build / "h200.toml", "--key", tiny.pub)
    assert rc == 1 and "Tiny.cubin" in err and "does not match its sha256" in err
    rc, out, _ = run(capsys, "verify", build / "h200.toml", "--key", tiny.pub, "--json")
    assert rc == 1 and json.loads(out)["ok"] is False and "sha256" in json.loads(out)["result"]["error"]
    # the original artifacts, named with --build, verify
    rc, _, _ = run(capsys, "verify", build / "h200.toml", "--key", tiny.pub, "--build", tiny.build)
    assert rc == 0
    rc, _, err = run(capsys, "verify", tmp_path / "nothing.toml", "--key", tiny.pub)
    assert rc == 2 and "not found" in err  # a missing input is bad input


# ---- report ---------------------------------------------------------------------------------------------------


def test_report_build_manifest_still_works(tiny, capsys):
    rc, out, _ = run(capsys, "report", tiny.build / "manifest.toml")
    assert rc == 0 and "Tiny" in out
    rc, out, _ = run(capsys, "report", tiny.build / "manifest.toml", "--json")
    data = json.loads(out)["result"]
    assert rc == 0 and data["summary"][0]["module"] == "Tiny" and data["rejected"] == []
    rc, _, err = run(capsys, "report", tiny.build / "manifest.toml", "--format", "markdown")
    assert rc == 2 and "qualified manifests and indexes" in err


def test_report_qualified_text_json_markdown(tiny, capsys):
    rc, out, _ = run(capsys, "report", tiny.manifest)
    assert rc == 0 and "qualified on NVIDIA H200" in out
    flat = " ".join(out.split())
    for _check, reason in REJECTED.values():
        assert " ".join(reason.split()) in flat
    assert f"signed by key {tiny.kid[:16]}" in out
    rc, out, _ = run(capsys, "report", tiny.manifest, "--json")
    data = json.loads(out)["result"]
    assert data["summary"] == [{"module": "Tiny", "target": "sm_90a", "role": "qualify", "admitted": 5, "rejected": 5,
                                "other": 0}]
    assert {r["symbol"]: (r["check"], r["reason"]) for r in data["rejected"]} == REJECTED
    # grouped by the class of their reason, in the report's class order, with a count per class
    assert [(r["class"], r["symbol"]) for r in data["rejected"]] == [
        ("fault", "mid_copy_f16"), ("timeout", "slow_copy_f16"), ("incorrect", "fast_copy_bf16"),
        ("nondeterministic", "fast_copy_f16"), ("resource", "mid_copy_bf16")]
    assert data["rejected_by_class"] == {"fault": 1, "timeout": 1, "incorrect": 1, "nondeterministic": 1, "resource": 1}
    assert data["device"]["name"] == H200.name and data["signature"]["key_id"] == tiny.kid
    cubin = next(a for a in data["artifacts"] if a["code"] == "cubin")
    assert cubin["sha256"] == next(a["sha256"] for a in tiny.body["artifacts"] if a["code"] == "cubin")
    sym = next(s for s in data["symbols"] if s["symbol"] == "scale_bf16")
    assert sym["resources"]["max_threads"] == 128 and sym["checks"][0]["name"] == "repeat"
    rc, out, _ = run(capsys, "report", tiny.manifest, "--format", "markdown")
    assert rc == 0 and out.startswith("# mamba-forge kernels qualified on NVIDIA H200")
    assert "## Rejected" in out and "| incorrect | `fast_copy_bf16` | Tiny/sm_90a | correctness |" in out
    assert "5 rejected: 1 fault, 1 timeout, 1 incorrect, 1 nondeterministic, 1 resource." in out
    assert "| Tiny | sm_90a | qualify | 5 | 5 | 0 |" in out
    rc, _, err = run(capsys, "report", tiny.manifest, "--format", "html")
    assert rc == 2 and "unknown --format" in err


def test_report_diff(tiny, tmp_path, capsys):
    b = copy.deepcopy(tiny.body)
    syms = {s["name"]: s for s in b["symbols"]}
    syms["scale_f16"].update(status="rejected", check="batch", reason="scale_f16: row 3 differs between batch 1 and 64")
    syms["mid_copy_bf16"].update(status="admitted", check="", reason="")
    syms["scale_bf16"]["resources"]["registers"] += 8
    syms["mid_copy_f16"]["pdl_max_blocks"] = 64  # now launched with programmatic dependent launch on small grids
    syms["scale"]["checks"][0]["digest"] = "0" * 64
    b["symbols"] = [s for s in b["symbols"] if s["name"] != "slow_copy_f16"]
    b["symbols"].append(dict(syms["scale_f32"], name="scale_new"))
    b["artifacts"][0] = dict(b["artifacts"][0], sha256="f" * 64)
    pb = tmp_path / "b.toml"
    pb.write_bytes(sign_body(b, tiny.priv))
    rc, out, _ = run(capsys, "report", "--diff", tiny.manifest, pb, "--json")  # from A to B
    assert rc == 1  # they differ: exit 1, like diff(1)
    d = json.loads(out)["result"]
    assert d["changed"] is True
    assert d["added"] == ["Tiny/sm_90a/scale_new"] and d["removed"] == ["Tiny/sm_90a/slow_copy_f16"]
    assert [x["symbol"] for x in d["newly_rejected"]] == ["Tiny/sm_90a/scale_f16"]
    assert d["newly_rejected"][0]["reason"].startswith("scale_f16: row 3")
    assert [x["symbol"] for x in d["newly_admitted"]] == ["Tiny/sm_90a/mid_copy_bf16"]
    assert d["resource_changes"] == [{"symbol": "Tiny/sm_90a/mid_copy_f16", "field": "pdl_max_blocks", "old": 0,
                                      "new": 64},
                                     {"symbol": "Tiny/sm_90a/scale_bf16", "field": "registers",
                                      "old": syms["scale_bf16"]["resources"]["registers"] - 8,
                                      "new": syms["scale_bf16"]["resources"]["registers"]}]
    assert [x["symbol"] for x in d["digest_changes"]] == ["Tiny/sm_90a/scale"]
    assert [x["path"] for x in d["artifact_changes"]] == [b["artifacts"][0]["path"]]
    rc, out, _ = run(capsys, "report", "--diff", tiny.manifest, pb)
    assert rc == 1 and "newly rejected (1)" in out and "scale_f16: admitted -> rejected" in out
    rc, out, _ = run(capsys, "report", "--diff", tiny.manifest, tiny.manifest, "--json")
    assert rc == 0 and json.loads(out)["result"]["changed"] is False
    rc, out, _ = run(capsys, "report", "--diff", tiny.manifest, tiny.manifest)
    assert rc == 0 and "no differences" in out
    # a build manifest against its qualified manifest: the same artifacts, no digest change
    rc, out, _ = run(capsys, "report", "--diff", tiny.build / "manifest.toml", tiny.manifest, "--json")
    d = json.loads(out)["result"]
    assert rc == 1 and d["artifact_changes"] == [] and len(d["newly_rejected"]) == len(REJECTED)
    assert d["resource_changes"] == [] and d["digest_changes"] == []  # registers/max_threads agree


# ---- merge --------------------------------------------------------------------------------------------------------


def _second_manifest(tiny, folder):
    h100 = qualified_body(tiny.bm, tiny.cat, device=H200.__class__(0, "NVIDIA H100 80GB HBM3", (9, 0), 132, 12080))
    p = folder / "h100.toml"
    p.write_bytes(sign_body(h100, tiny.priv))
    return p


def test_merge_writes_a_signed_index_that_verifies(tiny, tmp_path, capsys, monkeypatch):
    shutil.copytree(tiny.build, tmp_path / "b")
    h200 = tmp_path / "b" / "h200.toml"
    h100 = _second_manifest(tiny, tmp_path / "b")
    index = tmp_path / "b" / "index.toml"
    rc, out, err = run(capsys, "merge", h200, h100, "-o", index, "--sign-key", tiny.key_path, "--key", tiny.pub)
    assert rc == 0, err
    body, sig = signing.verify(index.read_bytes(), {tiny.kid: signing.parse_public(tiny.pub.read_text())})
    import tomllib

    data = tomllib.loads(body.decode())
    assert data["kind"] == "index" and [e["device_name"] for e in data["entries"]] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert {e["path"] for e in data["entries"]} == {"h100.toml", "h200.toml"}
    rc, out, _ = run(capsys, "verify", index, "--key", tiny.pub)
    assert rc == 0 and "index of 2 manifest(s)" in out
    rc, out, _ = run(capsys, "report", index)
    assert rc == 0 and "release index" in out and "NVIDIA H100" in out
    rc, out, _ = run(capsys, "report", index, "--format", "markdown")
    assert rc == 0 and out.startswith("# mamba-forge release index") and "| NVIDIA H200 | 9.0 | 132 | quick | `h200.toml` |" in out
    # the key from the environment (CI secret)
    monkeypatch.setenv(signing.KEY_ENV, tiny.key_path.read_text())
    rc, _, err = run(capsys, "merge", h200, "-o", tmp_path / "b" / "index2.toml", "--key", tiny.pub)
    assert rc == 0, err


def test_merge_refusals(tiny, tmp_path, capsys):
    shutil.copytree(tiny.build, tmp_path / "b")
    h200 = tmp_path / "b" / "h200.toml"
    rc, _, err = run(capsys, "merge", h200, "-o", tmp_path / "b" / "i.toml", "--key", tiny.pub)
    assert rc == 2 and "no signing key" in err
    rc, _, err = run(capsys, "merge", h200, "-o", tmp_path / "b" / "i.toml", "--sign-key", tiny.key_path)
    assert rc == 1 and "not trusted" in err  # inputs are verified before they are indexed
    dup = tmp_path / "b" / "h200-again.toml"
    dup.write_bytes(h200.read_bytes())
    rc, _, err = run(capsys, "merge", h200, dup, "-o", tmp_path / "b" / "i.toml", "--sign-key", tiny.key_path,
                     "--key", tiny.pub)
    assert rc == 1 and "one manifest per device" in err
    assert not (tmp_path / "b" / "i.toml").exists()
    # an index whose entry was swapped afterwards fails verify
    rc, _, _ = run(capsys, "merge", h200, "-o", tmp_path / "b" / "ok.toml", "--sign-key", tiny.key_path, "--key", tiny.pub)
    assert rc == 0
    h200.write_bytes(sign_body(dict(tiny.body, level="fullx"), tiny.priv))
    rc, _, err = run(capsys, "verify", tmp_path / "b" / "ok.toml", "--key", tiny.pub)
    assert rc == 1 and "sha256 in the index" in err


@pytest.mark.parametrize("argv", [["-h"], ["build", "-h"], ["report", "-h"], ["verify", "-h"], ["qualify", "-h"]])
def test_short_help_option(capsys, argv):
    rc, out, err = run(capsys, *argv)
    assert rc == 0 and "Usage:" in out and "--help" in out and not err


def test_an_unknown_short_option_is_bad_input(capsys):
    rc, _, err = run(capsys, "build", "-Z")
    assert rc == 2 and "Traceback" not in err
