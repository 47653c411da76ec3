"""Where a manifest is decoded: a `kind` of the wrong type (a list, a table, a number, a bool) or an unknown one is
one SchemaError/ManifestError line (exit 2 from `report`), never a TypeError; a recorded driver version that is
negative or absurd is refused by the schema; a file name with control characters is escaped in the message."""

from __future__ import annotations

import pytest
from harden_support import cli, one_line_error

from mamba_forge.core.codec import document_record, from_dict
from mamba_forge.core.schema import (
    MAX_DRIVER_VERSION,
    BuildManifest,
    IndexEntry,
    QDevice,
    QualifiedManifest,
    ReleaseIndex,
    SchemaError,
)

RECORDS = {"build": BuildManifest, "qualified": QualifiedManifest, "index": ReleaseIndex}
BAD_KINDS = ['["qualified"]', "[]", '{ a = 1 }', "1", "true", "1.5", '"Qualified"', '"qualified "', '""',
             '"\\u001b[2J"', "[[1]]", '["build", "index"]']


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_report_on_a_bad_kind_is_one_line(tmp_path, kind):
    path = tmp_path / "m.toml"
    path.write_text(f"schema_version = 1\nkind = {kind}\n")
    code, out, err = cli("report", path)
    assert code == 2 and one_line_error(err) and "kind" in err and "\x1b" not in err, err


@pytest.mark.parametrize("kind", [["qualified"], {"a": 1}, 1, True, None, "other", ("build",)])
def test_document_record_refuses_without_type_error(kind):
    with pytest.raises(SchemaError, match="kind: expected one of"):
        document_record({"kind": kind}, RECORDS, where="x.toml")


def test_document_record_names_the_class():
    assert document_record({"kind": "index"}, RECORDS) is ReleaseIndex
    with pytest.raises(SchemaError):
        document_record(["kind"], RECORDS)


DEVICE = {"name": "NVIDIA H200", "cc": "9.0", "sm_count": 132, "driver_version": 13000}
BAD_DRIVERS = [-1, -13000, -(2**63), MAX_DRIVER_VERSION + 1, 2**63, 10**30]


@pytest.mark.parametrize("version", BAD_DRIVERS)
def test_absurd_driver_version_refused_by_the_schema(version):
    with pytest.raises(SchemaError, match="driver_version"):
        from_dict(QDevice, {**DEVICE, "driver_version": version}, where="m.toml")
    entry = {"path": "h200.toml", "sha256": "0" * 64, "size": 1, "device_name": "H200", "cc": "9.0",
             "sm_count": 132, "driver_version": version}
    with pytest.raises(SchemaError, match="driver_version"):
        from_dict(IndexEntry, entry, where="index.toml")


@pytest.mark.parametrize("version", [0, 12080, 13000, MAX_DRIVER_VERSION])
def test_real_driver_versions_load(version):
    assert from_dict(QDevice, {**DEVICE, "driver_version": version}).driver_version == version


@pytest.mark.parametrize("name", ["a\x1b[2Jb.toml", "x\ny.toml", "bell\x07.toml", "nul\x7f.toml"])
def test_schema_error_escapes_control_characters_in_the_file_name(name):
    with pytest.raises(SchemaError) as info:
        from_dict(QDevice, {**DEVICE, "driver_version": -1}, where=name)
    msg = str(info.value)
    assert msg.isprintable() and ("\\x" in msg or "\\n" in msg), msg
