"""The runtime loader on the CPU: real signatures, real cubins from a tiny catalog, a fake GPU backend.
Every refusal is checked to load nothing (no module handed to the driver, no context made current)."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from runtime_fakes import FakeCAI
from runtime_support import (
    H200,
    REJECTED,
    FakeBackend,
    keypair,
    qualified_body,
    sign_body,
    signed_tiny,
)

from mamba_forge.core.codec import from_dict, runtime_table_bytes
from mamba_forge.core.schema import QualifiedManifest
from mamba_forge.manifest.bundle import write_bundle, write_index
from mamba_forge.runtime import (
    ArtifactRefused,
    DeviceMismatch,
    LaunchRefused,
    ManifestRefused,
    SignatureRefused,
    SymbolUnavailable,
    launch,
    load,
    signing,
    streams,
)
from mamba_forge.runtime import verify as rt_verify
from mamba_forge.runtime.sources import runtime_table_path
from mamba_forge.runtime.trust import trusted_keys
from mamba_forge.runtime.verify import open_verified


def _table(body: dict) -> bytes:
    """The canonical runtime table of a plain qualified body."""
    return runtime_table_bytes(from_dict(QualifiedManifest, body))


pytestmark = pytest.mark.usefixtures("isolated_trust")  # tests/conftest.py: only keys a test passes are trusted


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return signed_tiny(tmp_path_factory.mktemp("tiny"))  # as the qualifier writes it: h200.runtime.json beside


def _write(tiny, tmp_path, body=None, doc=None, name="m.toml"):
    """A manifest in a copy of the build folder (so tests can break artifacts without touching the fixture)."""
    import shutil

    build = tmp_path / "build"
    if not build.exists():
        shutil.copytree(tiny.build, build)
    p = build / name
    p.write_bytes(doc if doc is not None else sign_body(body, tiny.priv))
    if doc == tiny.doc:  # the fixture's manifest under another name: its runtime table goes along
        runtime_table_path(p).write_bytes(runtime_table_path(tiny.manifest).read_bytes())
    return p


def test_load_is_lazy_and_checks_bytes_before_the_driver(tiny):
    fake = FakeBackend()
    k = load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake)
    assert fake.loaded == [] and fake.activated == [0]
    f = k.function("scale_bf16")
    cubin = next(a for a in tiny.body["artifacts"] if a["code"] == "cubin")
    assert fake.loaded == [cubin["sha256"]]
    assert (f.name, f.requested, f.block, f.dynamic_smem) == ("scale_bf16", "scale_bf16", (128, 1, 1), 0)
    assert f.params == [[0, 8], [8, 8], [16, 4], [24, 8]]
    assert fake.smem == {"scale_bf16": 0}  # the qualified limit is set explicitly
    k.function("scale_f16")
    assert len(fake.loaded) == 1  # same module: loaded once
    assert k.load_all() == 1
    assert set(k.admitted()) == {"scale", "scale_f32", "scale_bf16", "scale_f16", "slow_copy_bf16"}


def test_typed_holders(tiny):
    k = load(tiny.manifest, trusted_keys=[tiny.pub], backend=FakeBackend())
    scale = k.typed("scale")
    assert scale.dtypes == ("f32", "bf16", "f16") and not scale.half_only
    assert scale.get("f32").name == "scale_f32"  # the dtype-named symbol, not the bare alias
    assert scale.get("bf16").name == "scale_bf16"
    slow = k.typed("slow_copy")
    assert slow.half_only and slow.get("bf16").name == "slow_copy_bf16"
    with pytest.raises(SymbolUnavailable, match="family slow_copy has no f32 variant"):
        slow.get("f32")
    with pytest.raises(SymbolUnavailable, match="family nope has no symbols"):
        k.typed("nope")


def test_rejected_symbol_carries_its_recorded_reason(tiny):
    k = load(tiny.manifest, trusted_keys=[tiny.pub], backend=FakeBackend())
    with pytest.raises(SymbolUnavailable) as e:
        k.function("fast_copy_bf16", follow_fallback=False)
    check, reason = REJECTED["fast_copy_bf16"]
    assert e.value.reason == reason and e.value.check == check
    assert reason in str(e.value) and "rejected" in str(e.value)
    with pytest.raises(SymbolUnavailable, match="not in the manifest"):
        k.function("no_such_kernel")


def test_fallbacks_are_followed_in_order_and_reported_once(tiny):
    fake = FakeBackend()
    k = load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake)
    with pytest.warns(RuntimeWarning, match="fast_copy_bf16 is unavailable .* using its fallback slow_copy_bf16"):
        f = k.function("fast_copy_bf16")
    assert (f.name, f.requested) == ("slow_copy_bf16", "fast_copy_bf16")  # mid_copy_bf16 is rejected: skipped
    assert k.fallbacks == {"fast_copy_bf16": "slow_copy_bf16"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert k.function("fast_copy_bf16").name == "slow_copy_bf16"  # no second report
    # typed holders follow the same fallbacks
    assert k.typed("fast_copy").get("bf16").name == "slow_copy_bf16"
    # nothing admitted along the chain: one error naming every reason
    with pytest.raises(SymbolUnavailable) as e:
        k.function("fast_copy_f16")
    for name in ("fast_copy_f16", "mid_copy_f16", "slow_copy_f16"):
        assert REJECTED[name][1] in str(e.value)


def test_bad_signature_is_refused_and_nothing_loads(tiny, tmp_path):
    doc = bytearray(tiny.doc)
    at = doc.index(b'"scale_bf16"')
    doc[at + 1] = ord("S")
    p = _write(tiny, tmp_path, doc=bytes(doc))
    fake = FakeBackend()
    with pytest.raises(SignatureRefused, match="does not match"):
        load(p, trusted_keys=[tiny.pub], backend=fake)
    assert fake.loaded == [] and fake.activated == []


def test_untrusted_key_and_unsigned_are_refused(tiny, tmp_path):
    other, other_pub, other_kid = keypair(tmp_path / "k", "other")
    p = _write(tiny, tmp_path, doc=sign_body(tiny.body, other))
    with pytest.raises(SignatureRefused, match="not trusted"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())
    assert load(p, trusted_keys=[other_pub], backend=FakeBackend()).verified.signature.key_id == other_kid
    # the user's trust folder counts as trusted
    p2 = _write(tiny, tmp_path, doc=tomli_w.dumps(tiny.body).encode(), name="unsigned.toml")
    with pytest.raises(SignatureRefused, match="not signed"):
        load(p2, trusted_keys=[tiny.pub], backend=FakeBackend())


def test_user_trust_folder_is_trusted(tiny, tmp_path, monkeypatch):
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "release.pub").write_bytes(tiny.pub.read_bytes())
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(trust))
    assert load(tiny.manifest, backend=FakeBackend()).verified.signature.key_id == tiny.kid
    with pytest.raises(SignatureRefused, match="not trusted"):
        load(tiny.manifest, backend=FakeBackend(), default_keys=False)


def test_non_canonical_signature_table_is_refused(tiny, tmp_path):
    # TOML reads a tab like a space: verification demands the canonical bytes of the table
    doc = tiny.doc.replace(b'\nalgorithm = "ed25519"', b'\nalgorithm =\t"ed25519"')
    with pytest.raises(signing.SignatureError, match="canonical"):
        signing.verify(doc, trusted_keys([tiny.pub], defaults=False))
    p = _write(tiny, tmp_path, doc=doc)
    with pytest.raises(SignatureRefused, match="canonical"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())


def test_artifact_hash_mismatch_is_refused_before_the_driver(tiny, tmp_path):
    p = _write(tiny, tmp_path, doc=tiny.doc)
    cubin = p.parent / "sm_90a" / "Tiny.cubin"
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, different bytes
    cubin.write_bytes(bytes(data))
    fake = FakeBackend()
    k = load(p, trusted_keys=[tiny.pub], backend=fake)
    with pytest.raises(ArtifactRefused, match="does not match its sha256"):
        k.function("scale_f32")
    assert fake.loaded == []


def test_artifact_size_change_and_missing_artifact_are_refused_at_load(tiny, tmp_path):
    p = _write(tiny, tmp_path, doc=tiny.doc)
    cubin = p.parent / "sm_90a" / "Tiny.cubin"
    cubin.write_bytes(cubin.read_bytes() + b"\0")
    with pytest.raises(ArtifactRefused, match="bytes, the manifest says"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())
    cubin.unlink()
    fake = FakeBackend()
    with pytest.raises(ArtifactRefused, match="Tiny.cubin is missing"):
        load(p, trusted_keys=[tiny.pub], backend=fake)
    assert fake.activated == []


def test_admitted_symbol_without_artifact_is_incomplete(tiny, tmp_path):
    body = dict(tiny.body, artifacts=[a for a in tiny.body["artifacts"] if a["code"] != "cubin"])
    p = _write(tiny, tmp_path, body=body)
    with pytest.raises(ArtifactRefused, match="lists no cubin"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "NVIDIA H100 80GB HBM3"}, "qualified on NVIDIA H200, but device 0 is NVIDIA H100"),
        ({"cc": (8, 9)}, "compute capability 9.0, but device 0 has 8.9"),
        ({"sm_count": 114}, "132 SMs, but device 0 has 114"),
        ({"driver_version": 12080}, "driver is 12080; update the driver"),
    ],
)
def test_wrong_device_is_refused(tiny, change, message):
    fake = FakeBackend(info=replace(H200, **change))
    with pytest.raises(DeviceMismatch, match=message):
        load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake)
    assert fake.activated == [] and fake.loaded == []


def test_newer_driver_is_accepted(tiny):
    for version in (13000, 13020, 14000):
        load(tiny.manifest, trusted_keys=[tiny.pub], backend=FakeBackend(info=replace(H200, driver_version=version)))


def test_expired_and_inconsistent_manifests_are_refused(tiny, tmp_path):
    p = _write(tiny, tmp_path, body=dict(tiny.body, expires="2020-01-01T00:00:00Z"))
    with pytest.raises(ManifestRefused, match="expired"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())
    p = _write(tiny, tmp_path, doc=sign_body(tiny.body, tiny.priv, development_key=True), name="dev.toml")
    with pytest.raises(ManifestRefused, match="development_key"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())
    p = _write(tiny, tmp_path, body=dict(tiny.body, schema_version=2), name="v2.toml")
    with pytest.raises(ManifestRefused, match="schema_version 2"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())
    bad = [dict(a, path="../escape.cubin") if a["code"] == "cubin" else a for a in tiny.body["artifacts"]]
    p = _write(tiny, tmp_path, body=dict(tiny.body, artifacts=bad), name="escape.toml")
    with pytest.raises(ManifestRefused, match="unsafe path"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())


def test_check_only_artifacts_do_not_serve(tiny, tmp_path):
    arts = [dict(a, role="check") for a in tiny.body["artifacts"]]
    p = _write(tiny, tmp_path, body=dict(tiny.body, artifacts=arts))
    k = load(p, trusted_keys=[tiny.pub], backend=FakeBackend())
    assert k.admitted() == []
    with pytest.raises(SymbolUnavailable, match="only to check arithmetic"):
        k.function("scale_f32")


class FakeStream:
    cuda_stream = 0x5150


def test_positional_launch_types_arguments_from_the_param_records(tiny):
    fake = FakeBackend()
    k = load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake)
    f = k.function("scale_f32")
    x = FakeCAI([1000], ptr=0x7F0000002000)
    launch(f, grid=(8,), block=(128,), args=(0x7F0000001000, x, 2.5, 1000), stream=FakeStream())
    rec = fake.launches[-1]
    assert rec["grid"] == (8, 1, 1) and rec["block"] == (128, 1, 1) and rec["shared_mem"] == 0
    assert rec["stream"] == 0x5150
    assert rec["raw"] == [struct.pack("<Q", 0x7F0000001000), struct.pack("<Q", 0x7F0000002000), struct.pack("<f", 2.5),
                          struct.pack("<q", 1000)]
    launch(f, (2,), f.block, (0x10, 0x20, np.float32(1.0), np.int64(-3)))  # numpy scalars are numbers
    assert fake.launches[-1]["raw"][2:] == [struct.pack("<f", 1.0), struct.pack("<q", -3)]
    # no stream, raw addresses only: the per-thread default stream, never the legacy stream 0
    assert fake.launches[-1]["stream"] == streams.CU_STREAM_PER_THREAD


def test_launch_takes_a_driver_layer_stream_by_its_handle(tiny):
    """A mamba_forge.gpu Stream reaches the backend as its raw handle (the CUDA stream protocol), not as the
    address of the binding's storage."""
    from mamba_forge.gpu import driver as cu

    fake = FakeBackend()
    f = load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake).function("scale_bf16")
    launch(f, grid=(1,), block=(128,), args=(0x10, 0x20, 1.0, 4), stream=cu.Stream.wrap(0x7A5C))
    assert fake.launches[-1]["stream"] == 0x7A5C


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"args": (1, 2, 3.0)}, "takes 4 arguments, 3 were given"),
        ({"block": (256,)}, "qualified with block"),
        ({"shared_mem": 1024}, "qualified with 0 bytes of dynamic shared memory"),
        ({"grid": (0,)}, "dimension below 1"),
        ({"grid": (1, 70000)}, "exceeds the CUDA limits"),
        ({"args": (1, 2, FakeCAI([4]), 4)}, r"argument 2 \(a\) of scale_f32 is a FakeCAI"),
        ({"args": (1, 2, 1e39, 4)}, "overflows the f32 parameter"),
        ({"args": (1, 2, 1.0, True)}, r"argument 3 \(n\) of scale_f32 is a bool"),
        ({"args": (1, 2, 1.0, 4.0)}, r"argument 3 \(n\) of scale_f32 is a float \(4.0\); the parameter is i64"),
        ({"args": (1, 2, 1.0, 1 << 64)}, "does not fit i64"),
        ({"args": (1, "x", 1.0, 4)}, "of type str is neither a tensor nor an int address"),
        ({"args": (np.zeros(4, np.float32), 2, 1.0, 4)}, "lives in cpu memory"),
        ({"args": (FakeCAI([4], "<f2"), 2, 1.0, 4)}, "is f16; the parameter is f32"),
        ({"args": (FakeCAI([4], device=1), 2, 1.0, 4)}, "is on device 1; the kernels are loaded on device 0"),
        ({"args": (FakeCAI([4], readonly=True), 2, 1.0, 4)}, "read-only but the kernel writes it"),
        ({"stream": object()}, "is not a CUDA stream"),
        ({"stream": True}, "stream is a bool"),
    ],
)
def test_launch_refusals(tiny, kwargs, message):
    fake = FakeBackend()
    f = load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake).function("scale_f32")
    call = {"grid": (1,), "block": (128,), "args": (1, 2, 1.0, 4), **kwargs}
    with pytest.raises(LaunchRefused, match=message):
        launch(f, **call)
    assert fake.launches == []


def test_bundles_load(tiny, tmp_path):
    keys = trusted_keys([tiny.pub], defaults=False)
    tgz = write_bundle(tiny.manifest, tmp_path / "h200.tar.gz", keys=keys, build=tiny.build)
    folder = write_bundle(tiny.manifest, tmp_path / "h200-bundle", keys=keys, build=tiny.build)
    for b in (tgz, folder):
        fake = FakeBackend()
        k = load(b, trusted_keys=[tiny.pub], backend=fake)
        k.function("scale_f16")
        assert len(fake.loaded) == 1
    (folder / "stray.bin").write_bytes(b"x")
    with pytest.raises(ArtifactRefused, match="does not name: stray.bin"):
        load(folder, trusted_keys=[tiny.pub], backend=FakeBackend())


def test_index_picks_the_device_entry(tiny, tmp_path):
    h100 = replace(H200, name="NVIDIA H100 80GB HBM3", sm_count=132)
    body_h100 = qualified_body(tiny.bm, tiny.cat, device=h100)
    p1 = _write(tiny, tmp_path, doc=tiny.doc, name="h200.toml")
    p2 = _write(tiny, tmp_path, body=body_h100, name="h100.toml")
    keys = trusted_keys([tiny.pub], defaults=False)
    index = write_index([p1, p2], p1.parent / "index.toml", tiny.priv, keys=keys)
    for dev in (H200, h100):
        k = load(index, trusted_keys=[tiny.pub], backend=FakeBackend(info=dev))
        assert k.manifest.device.name == dev.name
    with pytest.raises(DeviceMismatch, match="no manifest for NVIDIA A100"):
        load(index, trusted_keys=[tiny.pub], backend=FakeBackend(info=replace(H200, name="NVIDIA A100", cc=(8, 0))))
    # an entry changed after merging (even re-signed by a trusted key) no longer matches the index
    p2.write_bytes(sign_body(dict(body_h100, level="fullx"), tiny.priv))  # same size, other bytes
    with pytest.raises(ArtifactRefused, match="h100.toml in index folder .* does not match its sha256 in the index"):
        load(index, trusted_keys=[tiny.pub], backend=FakeBackend(info=h100))


def test_layout_agrees_with_the_qualified_models(tiny):
    """The fixture (and so the loader's reading) matches mamba_forge.manifest.qualified's pydantic models."""
    qualified = pytest.importorskip("mamba_forge.manifest.qualified")
    body, _ = signing.split(tiny.doc)
    m = qualified.parse_body(body)
    assert m.device.name == "NVIDIA H200" and len(m.symbols) == len(tiny.body["symbols"])


def test_runtime_imports_stay_light():
    code = (
        "import sys, mamba_forge.runtime as r; r.load; r.CudaBackend(); "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'typer', 'rich', 'click', 'numpy', 'tomli_w', 'elftools', 'ml_dtypes')); "
        "ours = sorted(m for m in sys.modules if m.startswith('mamba_forge')); print(heavy); print(ours)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[]", f"the runtime pulled in {out[0]}"
    # below the runtime only the standard-library core (records, codec, bounded reads, errors) and the driver layer
    allowed = {"mamba_forge", "mamba_forge.core", "mamba_forge.core.fsio", "mamba_forge.core.schema",
               "mamba_forge.core.schema_build", "mamba_forge.core.record",
               "mamba_forge.core.codec", "mamba_forge.core.safety", "mamba_forge.core.errors", "mamba_forge.core.vocab",
               "mamba_forge.gpu", "mamba_forge.gpu.driver", "mamba_forge.gpu.core", "mamba_forge.gpu.graph",
               "mamba_forge.gpu.launcher", "mamba_forge.runtime"}
    assert {m for m in eval(out[1]) if not m.startswith("mamba_forge.runtime.")} <= allowed
    # the keyword launch (contract, expressions, streams, packing, tensors, args) and the torch ops load on first use
    runtime = {m for m in eval(out[1]) if m.startswith("mamba_forge.runtime.")}
    assert runtime == {f"mamba_forge.runtime.{m}" for m in
                       ("backend", "errors", "families", "kernel", "loader", "memo", "signing", "sources", "trust",
                        "verify")}, runtime


def test_runtime_import_defers_everything_heavy(tiny):
    """`import mamba_forge.runtime` pulls in none of typer, rich, pydantic, numpy or cryptography (nor logging,
    tarfile or the driver): its names resolve on first use. Taking `load` from it imports what every load needs
    (cryptography's Ed25519 for the signature), still none of the others."""
    heavy = ("pydantic", "typer", "rich", "click", "numpy", "cryptography", "tomli_w", "elftools", "ml_dtypes",
             "cuda", "logging", "tarfile")
    code = (
        "import sys, json\n"
        f"heavy = {heavy!r}\n"
        "def pulled(): return sorted({m.split('.')[0] for m in sys.modules} & set(heavy))\n"
        "before = set(sys.modules)\n"
        "import mamba_forge.runtime as r\n"
        "bare = sorted(m for m in set(sys.modules) - before if m.startswith('mamba_forge'))\n"
        "a = pulled()\n"
        "from mamba_forge.runtime import load, launch, Kernels\n"
        "b = pulled()\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from runtime_support import FakeBackend\n"
        "load(sys.argv[2], trusted_keys=[sys.argv[3]], backend=FakeBackend())\n"
        "print(json.dumps([bare, a, b, pulled()]))\n"
    )
    preloaded = set(subprocess.run([sys.executable, "-c", "import sys; print(*sys.modules)"], capture_output=True,
                                   text=True, check=True).stdout.split())  # what the interpreter has before us
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(tiny.manifest), str(tiny.pub)],
                         capture_output=True, text=True, check=True).stdout
    bare, at_import, with_load, after_load = json.loads(out.splitlines()[-1])
    assert bare == ["mamba_forge", "mamba_forge.runtime", "mamba_forge.runtime.errors"], bare
    assert [m for m in at_import if m not in preloaded] == [], at_import
    assert [m for m in with_load if m not in preloaded] == ["cryptography", "logging", "tarfile"], with_load
    assert set(after_load) - preloaded <= {"cryptography", "logging", "tarfile", "tomli_w"}, after_load  # tomli_w:
    # the test's own runtime_support, not the load


def test_sha256_of_loaded_bytes_matches_the_manifest(tiny):
    fake = FakeBackend()
    load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake).function("scale")
    cubin = tiny.build / "sm_90a" / "Tiny.cubin"
    assert fake.loaded == [hashlib.sha256(cubin.read_bytes()).hexdigest()]


# ---- the runtime table -----------------------------------------------------------------------------------


def test_load_reads_the_runtime_table_not_the_toml(tiny, monkeypatch):
    keys = trusted_keys([tiny.pub], defaults=False)
    full = open_verified(tiny.manifest, keys=keys)  # full verification: parses the TOML, compares the projection
    assert full.runtime_table == runtime_table_bytes(full.manifest)

    def no_toml(*_a, **_k):
        raise AssertionError("the loader parsed the whole manifest")

    monkeypatch.setattr(rt_verify, "_parse_body", no_toml)
    k = load(tiny.manifest, trusted_keys=[tiny.pub], backend=FakeBackend())
    assert not hasattr(k.manifest, "toolchain") and all(not hasattr(s, "checks") for s in k.manifest.symbols)
    assert k.function("scale_bf16").params == [[0, 8], [8, 8], [16, 4], [24, 8]]
    assert set(k.admitted()) == {"scale", "scale_f32", "scale_bf16", "scale_f16", "slow_copy_bf16"}


def test_runtime_table_changed_or_missing_is_refused(tiny, tmp_path):
    p = _write(tiny, tmp_path, doc=tiny.doc, name="h200.toml")
    table = runtime_table_path(p)
    good = table.read_bytes()
    fake = FakeBackend()
    flipped = good.replace(b'"status":"rejected"', b'"status":"admitted"', 1)  # same size, a rejected symbol served
    assert len(flipped) == len(good) and flipped != good
    for data, message in ((flipped, "does not match the size and sha256 signed"), (good + b" ", "does not match")):
        table.write_bytes(data)
        with pytest.raises(ArtifactRefused, match=message):
            load(p, trusted_keys=[tiny.pub], backend=fake)
    table.unlink()
    with pytest.raises(ArtifactRefused, match="names a runtime table, but .*h200.runtime.json is missing"):
        load(p, trusted_keys=[tiny.pub], backend=fake)
    with pytest.raises(ArtifactRefused, match="is missing"):  # full verification demands it as well
        open_verified(p, keys=trusted_keys([tiny.pub], defaults=False))
    assert fake.loaded == [] and fake.activated == []
    table.write_bytes(good)
    load(p, trusted_keys=[tiny.pub], backend=fake).function("scale")


def _sign_with_table(tiny, body: dict, table: bytes, name: str, tmp_path):
    """A manifest whose signed head binds `table`, whatever it holds (a faulty signer)."""
    bound = {**body, "runtime_table_sha256": hashlib.sha256(table).hexdigest(), "runtime_table_size": len(table)}
    p = _write(tiny, tmp_path, body=bound, name=name)
    runtime_table_path(p).write_bytes(table)
    return p


def test_runtime_table_must_be_the_projection_of_the_signed_body(tiny, tmp_path):
    keys = trusted_keys([tiny.pub], defaults=False)
    # a table that disagrees with the body's top-level keys is refused by the loader itself
    stale = _table({**tiny.body, "expires": "2099-12-31T00:00:00Z"})
    p = _sign_with_table(tiny, tiny.body, stale, "stale.toml", tmp_path)
    with pytest.raises(ManifestRefused, match="disagrees with its signed body on 'expires'"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())
    # one that differs deeper (a symbol's status) passes the loader's head check, never full verification
    body2 = {**tiny.body, "symbols": [dict(s, status="admitted", reason="") for s in tiny.body["symbols"]]}
    p2 = _sign_with_table(tiny, tiny.body, _table(body2), "deep.toml", tmp_path)
    with pytest.raises(ManifestRefused, match="is not the projection of its signed body"):
        open_verified(p2, keys=keys)
    # and the honest table passes both
    p3 = _sign_with_table(tiny, tiny.body, _table(tiny.body), "honest.toml", tmp_path)
    open_verified(p3, keys=keys)
    load(p3, trusted_keys=[tiny.pub], backend=FakeBackend()).function("scale")


def test_manifest_without_runtime_table_still_loads(tiny, tmp_path):
    p = _write(tiny, tmp_path, body=tiny.body, name="legacy.toml")  # signed without the table keys
    assert not runtime_table_path(p).exists()
    k = load(p, trusted_keys=[tiny.pub], backend=FakeBackend())
    assert hasattr(k.manifest, "toolchain") and k.function("scale").name == "scale"


def test_bundles_carry_the_runtime_table(tiny, tmp_path):
    import io
    import tarfile

    keys = trusted_keys([tiny.pub], defaults=False)
    tgz = write_bundle(tiny.manifest, tmp_path / "h200.tar.gz", keys=keys, build=tiny.build)
    with tarfile.open(tgz) as tar:
        names = tar.getnames()
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert names[:2] == ["manifest.toml", "runtime.json"]
    assert members["runtime.json"] == runtime_table_path(tiny.manifest).read_bytes()
    folder = write_bundle(tiny.manifest, tmp_path / "h200-bundle", keys=keys, build=tiny.build)
    assert (folder / "runtime.json").read_bytes() == members["runtime.json"]
    # a bundle that lost its runtime table is incomplete
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members.items():
            if name != "runtime.json":
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    bad = tmp_path / "lost.tar.gz"
    bad.write_bytes(raw.getvalue())
    with pytest.raises(ArtifactRefused, match="runtime.json in bundle .* is missing"):
        load(bad, trusted_keys=[tiny.pub], backend=FakeBackend())


@pytest.mark.parametrize(("path", "value", "problem"), [
    (("symbols", 1, "dynamic_smem"), "0", "symbols[1].dynamic_smem: expected int, got str"),
    (("symbols", 0, "params", 0, "zz_unknown"), 1, "symbols[0].params[0]: unknown key 'zz_unknown'"),
    (("symbols", 0, "params", 0, "kind"), "scalar", "symbols[0].params[0]: parameter 'y' of type ptr is a pointer, "
                                                    "not a scalar"),
])
def test_runtime_table_that_does_not_fit_the_schema_is_refused(tiny, tmp_path, path, value, problem):
    """A table bound by a (faulty) signer's hash is still read through the schema: one line naming the path."""
    import json

    table = json.loads(_table(tiny.body))
    node = table
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    data = json.dumps(table, sort_keys=True, separators=(",", ":")).encode()
    p = _sign_with_table(tiny, tiny.body, data, "bad.toml", tmp_path)
    fake = FakeBackend()
    with pytest.raises(ManifestRefused) as e:
        load(p, trusted_keys=[tiny.pub], backend=fake)
    assert str(e.value) == f"the runtime table of {p}: {problem}"
    assert fake.loaded == [] and fake.activated == []


def test_v1_manifest_is_refused_naming_its_version(tiny, tmp_path):
    p = _write(tiny, tmp_path, body=dict(tiny.body, manifest_version=1), name="v1.toml")
    with pytest.raises(ManifestRefused, match="has manifest_version 1; this loader reads 2"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())
    p = _write(tiny, tmp_path, body=dict(tiny.body, kind="build"), name="kind.toml")
    with pytest.raises(ManifestRefused, match="has kind 'build'; expected a qualified manifest or an index"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())


def test_head_and_table_must_agree_both_ways(tiny, tmp_path):
    """A top-level key the table holds but the signed head leaves out reads as its default, and must be it."""
    import json

    table = json.loads(_table(tiny.body))
    table["catalog"] = "other"  # the head leaves catalog out (default "")
    data = json.dumps(table, sort_keys=True, separators=(",", ":")).encode()
    p = _sign_with_table(tiny, tiny.body, data, "extra.toml", tmp_path)
    with pytest.raises(ManifestRefused, match="disagrees with its signed body on 'catalog'"):
        load(p, trusted_keys=[tiny.pub], backend=FakeBackend())


class LocatingBackend(FakeBackend):
    """A fake GPU whose driver places every address on one device (cuPointerGetAttribute DEVICE_ORDINAL)."""

    def __init__(self, where: int):
        super().__init__()
        self.where, self.asked = where, []

    def pointer_device(self, ptr: int) -> int:
        self.asked.append(ptr)
        return self.where


@pytest.mark.parametrize("path", ["keyword", "positional"])
def test_an_array_that_does_not_say_its_device_is_located_by_the_driver(tiny, path):
    """A Numba-like array (__cuda_array_interface__ only, no device): the backend's pointer_device places it;
    on another device, or where the driver does not know it (-1), or with a backend that cannot say, refused."""
    def call(backend, x):
        f = load(tiny.manifest, trusted_keys=[tiny.pub], backend=backend).function("scale_f32")
        y = FakeCAI([1000], cupy=False)
        if path == "keyword":
            f(y=y, x=x, a=2.0)
        else:
            launch(f, (8,), f.block, (y, x, 2.0, 1000))

    here = LocatingBackend(0)
    x = FakeCAI([1000], cupy=False)
    call(here, x)
    assert len(here.launches) == 1 and x.ptr in here.asked
    for backend, why in ((LocatingBackend(1), "is on device 1; the kernels are loaded on device 0"),
                         (LocatingBackend(-1), "is on an unknown device"),
                         (FakeBackend(), "is on an unknown device")):
        with pytest.raises(LaunchRefused, match=why):
            call(backend, FakeCAI([1000], cupy=False))
        assert backend.launches == []
