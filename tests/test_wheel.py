"""The package as a user gets it: `pip wheel .` carries the catalog, the kernel sources and the release keys;
installed into a fresh venv outside the checkout, `mamba-forge build`, `verify` and the runtime import work, and
only the keys shipped inside the package are trusted."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import runtime_support
from runtime_support import build_tiny, keypair, qualified_body, sign_body

ROOT = Path(__file__).resolve().parent.parent
_EMPTY_ZIP = b"PK\x05\x06" + b"\0" * 18
RELEASE_KEYS = sorted((ROOT / "manifests" / "keys").glob("*.pub"))


def _key_id(pub: Path) -> str:
    from mamba_forge.runtime import signing

    return signing.key_id(signing.parse_public(pub.read_text()))


RELEASE_KEY_ID = _key_id(RELEASE_KEYS[0])  # the one shipped release key (tests below demand exactly one)
# never copied into the throwaway source tree: VCS and build output, and private material (.keys) on dev machines
TOP_LEVEL_IGNORED = {".git", "build", "dist", ".venv", ".pytest_cache", ".ruff_cache", ".whl", ".keys", ".artifacts",
                     ".gl"}  # not mamba_forge/build


def _copy_ignore(folder: str, names: list[str]) -> set[str]:
    top = TOP_LEVEL_IGNORED if Path(folder) == ROOT else set()
    return {n for n in names if n in top or n == "__pycache__" or n.endswith(".egg-info")}


def test_every_subpackage_is_in_the_wheel_list():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mamba_forge").rglob("__init__.py")}
    assert on_disk <= listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    assert listed - on_disk == {"mamba_forge._kernels", "mamba_forge._keys"}


def _write_fixture_catalog(root: Path) -> Path:
    """runtime_support's tiny catalog (its families declare qualification dims)."""
    return runtime_support.write_tiny_catalog(root)


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user who installed the wheel: no PYTHONPATH onto a checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return res


def _outer_package_dirs() -> list[str]:
    """The site-packages of the interpreter running the tests (the venv the user made, not the base Python's)."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    dirs = [paths["purelib"], paths["platlib"]]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def _see_outer_packages(venv: Path) -> None:
    """The wheel's dependencies (typer, rich, the nvidia library wheels, ...) from the outer environment, with no
    network: each top-level entry of its site-packages linked into the new venv's site-packages. Not a .pth path
    line: cuda.pathfinder looks for libnvrtc only under site.getsitepackages(). Not `venv --system-site-packages`
    either: that exposes the base interpreter's packages, which lack them on a fresh machine. Left out: the
    checkout's own editable install (mamba_forge*, __editable__*), every .pth file, and what the venv already has
    (its own pip; another pip's metadata beside it would confuse it)."""
    (site,) = (venv / "lib").glob("python3*/site-packages")
    for outer in _outer_package_dirs():
        for entry in sorted(Path(outer).iterdir()):
            name = entry.name
            if (name.startswith(("mamba_forge", "__editable__", "_distutils_hack")) or name == "__pycache__"
                    or name.endswith(".pth") or name.split("-")[0] in ("pip", "setuptools")
                    or (site / name).exists()):
                continue
            (site / name).symlink_to(entry)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin folder, wheel path, a folder outside the checkout) with the wheel of this source installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy: `pip wheel` writes build/ and *.egg-info into the tree it builds
    shutil.copytree(ROOT, src, ignore=_copy_ignore)
    env = _clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    res = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", ".", "-w", str(tmp / "out")],
               src, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (wheel,) = (tmp / "out").glob("mamba_forge-*.whl")
    venv = tmp / "venv"
    res = _run([sys.executable, "-m", "venv", str(venv)], tmp, env)
    assert res.returncode == 0, res.stderr
    _see_outer_packages(venv)
    res = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], tmp, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    away = tmp / "elsewhere"
    away.mkdir()
    return venv / "bin", wheel, away


def test_wheel_carries_the_package_data(installed):
    _, wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mamba_forge/_kernels/catalog.toml" in names
    assert "mamba_forge/_kernels/fixed/activation.cu" in names
    assert "mamba_forge/_kernels/include/mf/common.cuh" in names
    assert len(RELEASE_KEYS) == 1 and f"mamba_forge/_keys/{RELEASE_KEYS[0].name}" in names
    shipped = {p.relative_to(ROOT / "kernels").as_posix() for p in (ROOT / "kernels").rglob("*")
               if p.suffix in (".toml", ".cu", ".cuh")}
    assert {f"mamba_forge/_kernels/{s}" for s in shipped} <= names
    assert not any(n.startswith(("kernels/", "manifests/", "tests/")) for n in names)


def test_wheel_venv_sees_the_outer_venv_not_the_base_python(installed):
    bin_dir, _, away = installed
    cfg = (bin_dir.parent / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    res = _run([str(bin_dir / "python"), "-c", "import sys, typer, mamba_forge; print(mamba_forge.__file__)"], away,
               _clean_env())
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()).is_relative_to(bin_dir.parent), res.stdout  # the wheel, not the checkout


def test_installed_wheel_builds_from_its_own_catalog(installed, tmp_path):
    bin_dir, _, away = installed
    cache = tmp_path / "cache"
    env = _clean_env(MAMBA_FORGE_CACHE=str(cache))
    res = _run([str(bin_dir / "mamba-forge"), "build", "--arch", "sm_90a", "--kernels", "softplus*",
                "--out", str(tmp_path / "b"), "-q"], away, env)
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = tomllib.loads((tmp_path / "b" / "manifest.toml").read_text())
    symbols = {s["name"] for m in manifest["modules"] for s in m["symbols"]}
    assert symbols and all(s.startswith("softplus") for s in symbols)
    assert manifest["targets"] == ["sm_90a"]


def test_installed_wheel_trusts_only_its_shipped_keys(installed, tmp_path):
    bin_dir, _, away = installed
    # a generic manifests/keys folder beside the install and in the working folder must not be trusted
    stray_priv, stray_pub, stray_id = keypair(away / "manifests" / "keys", "stray")
    site = next((bin_dir.parent / "lib").glob("python3*/site-packages"))
    (site / "manifests" / "keys").mkdir(parents=True)
    shutil.copy(stray_pub, site / "manifests" / "keys" / "stray.pub")
    code = ("import mamba_forge, mamba_forge.runtime; from mamba_forge.runtime.trust import release_keys_dir, "
            "trusted_keys; from mamba_forge.catalog.model import default_catalog_path; "
            "print(mamba_forge.__file__); print(release_keys_dir()); print(default_catalog_path()); "
            "print(' '.join(sorted(trusted_keys())))")
    env = _clean_env(MAMBA_FORGE_TRUST=str(tmp_path / "no-trust"))
    res = _run([str(bin_dir / "python"), "-c", code], away, env)
    assert res.returncode == 0, res.stderr
    pkg, keys_dir, catalog, ids = res.stdout.splitlines()
    assert Path(pkg).is_relative_to(site)
    assert Path(keys_dir) == site / "mamba_forge" / "_keys"
    assert Path(catalog) == site / "mamba_forge" / "_kernels" / "catalog.toml"
    assert ids.split() == [RELEASE_KEY_ID]
    # the project's own signed manifest verifies by signature against the shipped key alone
    code = ("import sys; from mamba_forge.runtime import signing; from mamba_forge.runtime.trust import trusted_keys;"
            " print(signing.verify(open(sys.argv[1], 'rb').read(), trusted_keys())[1].key_id)")
    res = _run([str(bin_dir / "python"), "-c", code, str(ROOT / "manifests" / "h200.toml")], away, env)
    assert res.returncode == 0 and res.stdout.strip() == RELEASE_KEY_ID, res.stderr


def test_installed_wheel_verifies_a_bundle(installed, tmp_path):
    bin_dir, _, away = installed
    cat = _write_fixture_catalog(tmp_path / "cat")
    bm = build_tiny(cat, tmp_path / "build", tmp_path / "cache")
    priv, pub, _ = keypair(tmp_path / "keys", "test")
    manifest = tmp_path / "m" / "tiny.toml"
    manifest.parent.mkdir()
    manifest.write_bytes(sign_body(qualified_body(bm, cat), priv))
    env = _clean_env(MAMBA_FORGE_TRUST=str(tmp_path / "no-trust"))
    mf = str(bin_dir / "mamba-forge")
    bundle = tmp_path / "tiny.tar.gz"
    res = _run([mf, "bundle", str(manifest), "--build", str(tmp_path / "build"), "-o", str(bundle), "--key", str(pub)],
               away, env)
    assert res.returncode == 0, res.stderr
    res = _run([mf, "verify", str(bundle), "--key", str(pub)], away, env)
    assert res.returncode == 0 and res.stdout.startswith("ok:"), res.stdout + res.stderr
    res = _run([mf, "verify", str(bundle)], away, env)  # the test key is not trusted without --key
    assert res.returncode == 1, res.stdout + res.stderr


def test_package_data_not_on_disk_is_refused(monkeypatch):
    import zipfile as zf

    from mamba_forge.core import resources
    from mamba_forge.core.errors import ForgeError

    # what a zipimport install hands back: a Traversable with no real folder for NVRTC to read
    monkeypatch.setattr(resources.resources, "files", lambda pkg: zf.Path(zf.ZipFile(io.BytesIO(_EMPTY_ZIP))))
    with pytest.raises(ForgeError, match="not on disk"):
        resources.data_folder(resources.KERNELS)


def test_missing_package_data_outside_a_checkout_is_refused(tmp_path, monkeypatch):
    from mamba_forge.core import resources
    from mamba_forge.core.errors import ForgeError

    site = tmp_path / "site-packages"
    (site / "mamba_forge").mkdir(parents=True)
    (site / "manifests" / "keys").mkdir(parents=True)  # a generic folder beside the install: never used
    monkeypatch.setattr(resources.resources, "files", lambda pkg: site / "mamba_forge")
    assert resources.source_checkout() is None
    with pytest.raises(ForgeError, match="manifests/keys/ data is missing"):
        resources.data_folder(resources.RELEASE_KEYS)
    (site / "mamba_forge" / "_keys").mkdir()
    assert resources.data_folder(resources.RELEASE_KEYS) == site / "mamba_forge" / "_keys"
