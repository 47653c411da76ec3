"""Rejections grouped by the class of their reason (report/classes.py): the pure check -> class table, every check
the build and the qualifier can decide with has a class, and the qualify summary and `report` (text, markdown,
JSON) over a synthetic manifest holding a rejection of every class."""

from __future__ import annotations

import io
import json
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomli_w
from rich.console import Console

from mamba_forge.core.codec import from_dict
from mamba_forge.core.schema import QualifiedManifest
from mamba_forge.report import classes as K
from mamba_forge.report.qualify import rejection_lines, render_qualify_summary
from mamba_forge.runtime import signing

ROOT = Path(__file__).resolve().parent.parent
H200_TOML = ROOT / "manifests" / "h200.toml"

# one deciding check per class (the synthetic manifest rejects one symbol with each)
ONE_PER_CLASS = {
    "fault": "fault", "timeout": "timeout", "bounds": "bounds", "input written": "input-written",
    "uninitialized": "uninitialized", "incorrect": "correctness", "in-place-unsafe": "in-place",
    "nondeterministic": "repeat",
    "batch-variant": "batch", "placement-variant": "placement", "split-variant": "split",
    "route-inequivalent": "route-equivalence",
    "sanitizer": "sanitize", "resource": "registers", "ABI": "abi", "static policy": "static-tokens",
    "build": "compile", "harness": "harness", "other": "a-check-nobody-knows",
}


@pytest.mark.parametrize(("check", "cls"), [
    *((c, k) for k, c in ONE_PER_CLASS.items()),
    ("load", "fault"), ("stream", "nondeterministic"), ("neighbour", "nondeterministic"),
    ("address", "nondeterministic"), ("graph", "nondeterministic"), ("cross-device", "nondeterministic"),
    ("pdl", "nondeterministic"), ("pdl-wait", "static policy"),
    ("smem", "resource"), ("spills", "resource"), ("stack", "resource"), ("occupancy", "resource"),
    ("block", "resource"), ("exports", "ABI"), ("float-atomics", "static policy"), ("reference", "harness"),
    ("spec", "harness"), ("untested", "harness"), ("", "other"), ("Placement", "other"),
])
def test_reason_class(check, cls):
    assert K.reason_class(check) == cls


def test_the_classes_are_the_ones_the_table_uses_and_all_listed():
    assert set(K.CHECK_CLASS.values()) | {"other"} == set(K.CLASSES)
    assert set(ONE_PER_CLASS) == set(K.CLASSES)


_DECIDING = [
    re.compile(r'\b(?:reject|fail|no)\(\s*"([a-z-]+)"'),
    re.compile(r'\bcheck\s*=\s*"([a-z-]+)"'),
    re.compile(r'SymbolResult\.rejected\([^()]*?,\s*"([a-z-]+)"'),
    re.compile(r'\bCHECK\s*=\s*"([a-z-]+)"'),
    re.compile(r'\bAdmission\(False,\s*"([a-z-]+)"'),
]


def test_every_check_that_decides_a_rejection_has_a_class():
    """A grep over the build's admission and the qualifier for the check names they reject with: a new check
    would otherwise fall into 'other' unseen."""
    found = set()
    for folder in ("qualify", "build"):
        for p in (ROOT / "mamba_forge" / folder).glob("*.py"):
            text = p.read_text()
            for rx in _DECIDING:
                found.update(rx.findall(text))
    found.discard("")
    assert {"placement", "timeout", "abi", "compile", "static-tokens", "sanitize", "route-equivalence", "split"} <= found
    unclassed = sorted(c for c in found if K.reason_class(c) == "other")
    assert unclassed == []


def _rejected(n_per_class: int = 1):
    return [SimpleNamespace(name=f"{cls.replace(' ', '_')}_{i}", module="Fixed", target="sm_90a", check=check,
                            reason=f"because {check}")
            for i in range(n_per_class) for cls, check in reversed(list(ONE_PER_CLASS.items()))]


def test_groups_come_in_class_order_with_their_symbols_in_order():
    groups = K.group_rejections(_rejected(2))
    assert [c for c, _ in groups] == list(K.CLASSES)
    assert all([s.name for s in members] == [members[0].name, members[0].name[:-1] + "1"] for _, members in groups)
    assert K.class_counts(groups) == {c: 2 for c in K.CLASSES}
    assert K.counts_line(groups).startswith("38 rejected: 2 fault, 2 timeout, 2 bounds, 2 input written, ")
    assert K.group_rejections([]) == []


def test_rejection_lines_count_per_class_first_and_honour_the_limit():
    lines = rejection_lines(_rejected(), limit=5)
    assert lines[0] == (2, K.counts_line(K.group_rejections(_rejected())))
    assert lines[1] == (2, "fault (1)") and lines[2] == (4, "fault_0 (Fixed/sm_90a) [fault] because fault")
    assert sum(1 for ind, _ in lines if ind == 4) == 5
    assert lines[-1] == (2, "and 14 more rejected (mamba-forge report)")
    assert rejection_lines([]) == []


def _synthetic_body() -> dict:
    """The committed H200 manifest, its first symbols rejected one per class."""
    body, _ = signing.split(H200_TOML.read_bytes())
    doc = tomllib.loads(body.decode())
    for s, (cls, check) in zip(doc["symbols"], ONE_PER_CLASS.items(), strict=False):
        s.update(status="rejected", check=check, reason=f"{s['name']}: rejected as {cls}")
    return doc


def test_the_qualify_summary_groups_by_class():
    m = from_dict(QualifiedManifest, _synthetic_body())
    buf = io.StringIO()
    render_qualify_summary(m, Console(file=buf, width=200))
    out = buf.getvalue()
    already = sum(1 for s in m.symbols[len(ONE_PER_CLASS):] if s.status == "rejected")
    assert f"{len(ONE_PER_CLASS) + already} rejected: 1 fault, 1 timeout, 1 bounds" in out
    pos = [out.index(f"  {cls} (") for cls in K.CLASSES]
    assert pos == sorted(pos)  # the classes in order, each with its symbols under it
    assert "placement-variant (1)" in out and "[placement]" in out


def test_report_text_markdown_and_json_group_by_class(tmp_path, capsys, monkeypatch):
    from mamba_forge.cli import main

    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))
    p = tmp_path / "synthetic.toml"
    p.write_text(tomli_w.dumps(_synthetic_body()))
    assert main(["report", str(p), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["result"]
    # grouped by class, in the classes' order (the committed manifest may hold rejections of its own)
    classes = [r["class"] for r in data["rejected"]]
    assert [c for i, c in enumerate(classes) if i == 0 or c != classes[i - 1]] == list(K.CLASSES)
    assert all(data["rejected_by_class"][c] >= 1 for c in K.CLASSES)
    assert all(r["class"] == K.reason_class(r["check"]) for r in data["rejected"])
    assert main(["report", str(p), "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "| class | symbol | module | check | reason |" in md and "| placement-variant | `" in md
    assert main(["report", str(p)]) == 0
    text = capsys.readouterr().out
    assert "rejected: 1 fault, 1 timeout" in text.replace("\n", " ")
