"""Leaks through the compiler: a catalog that makes NVRTC open a file of this machine (`#include "/etc/passwd"`,
`../../etc/passwd`, `/proc/self/environ`, `-include`, `-I /etc`) would see its lines quoted in the compiler log,
and so in build/manifest.toml. Every such include or option is refused when the catalog loads (one line, exit 2,
nothing compiled, no manifest); a name that is plain but resolves to no catalog or CUDA header is refused before
the build compiles; and the log that reaches the manifest is redacted even when the checks are bypassed. A planted
secret (in a file and in the environment) never reaches manifest.toml, stdout or stderr."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from harden_support import cli, one_line_error

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.compile_rules import (
    REDACTED,
    IncludeRefused,
    check_include_name,
    include_names,
    option_problem,
    redact_log,
)
from mamba_forge.catalog.model import load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.core.errors import CatalogError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "build_basic"
SECRET = "MF-SECRET-7f3a9c1e-DO-NOT-LEAK"
BASIC_SOURCE = (FIXTURE / "src" / "basic.cu").read_text()


def _catalog(tmp_path: Path, *, source_prefix: str = "", header_prefix: str = "", options: list | None = None) -> Path:
    cat = tmp_path / "cat"
    shutil.copytree(FIXTURE, cat)
    if source_prefix:
        (cat / "src" / "basic.cu").write_text(source_prefix + "\n" + BASIC_SOURCE)
    if header_prefix:
        h = cat / "include" / "fx" / "scale.cuh"
        h.write_text(header_prefix + "\n" + h.read_text())
    if options is not None:
        root = cat / "catalog.toml"
        opts = ", ".join(json.dumps(o) for o in options)  # a TOML basic string takes JSON's escapes
        root.write_text(root.read_text().replace('families = ["basic.toml"]',
                                                 f'families = ["basic.toml"]\noptions = [{opts}]'))
    return cat / "catalog.toml"


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("secret") / "secret.h"
    p.write_text(f"{SECRET} = 1;\nint {SECRET.replace('-', '_')};\n")
    return p


def _targets(secret: Path) -> list[str]:
    depth = "../" * 12
    return ["/etc/passwd", f"{depth}etc/passwd", "/proc/self/environ", str(secret), depth + str(secret).lstrip("/"),
            "./secret.h", ".hidden.h", "fx/../../../etc/passwd", "a\\..\\b.h", "fx//scale.cuh"]


DIRECTIVES = [
    '#include "{}"', "#include <{}>", '#  include "{}"', '%:include "{}"', '# /* c */ include "{}"',
    '#include_next "{}"', '#embed "{}"', '#import "{}"', '#if __has_include("{}")\n#endif', "#inc\\\nlude <{}>",
]


# every directive x every target in a source; every directive x half the targets in a header
LOAD_CASES = [(w, d, t) for w in ("source", "header") for d in DIRECTIVES for t in range(10)
              if w == "source" or t % 2 == 0]


@pytest.mark.parametrize(("where", "directive", "target"), LOAD_CASES)
def test_an_include_of_a_file_outside_the_catalog_is_refused_at_load(tmp_path, secret_file, where, directive, target):
    line = directive.format(_targets(secret_file)[target])
    cat = _catalog(tmp_path, **{f"{where}_prefix": line})
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)
    msg = str(info.value)
    assert "\n" not in msg and "root:x:0" not in msg and SECRET not in msg
    assert "not a plain relative header name" in msg or "not a literal" in msg


@pytest.mark.parametrize("line", [
    "#define P </etc/passwd>\n#include P", "#define Q(x) #x\n#include Q(/etc/passwd)", "#include",
    '#include_next SECRET_PATH', "#if __has_include(NAME)\n#endif", '#embed /etc/passwd',
])
def test_a_computed_include_is_refused(tmp_path, line):
    with pytest.raises(CatalogError, match="not a literal"):
        load_catalog(_catalog(tmp_path, source_prefix=line))


@pytest.mark.parametrize("name", ["fx/scale.cuh", "cuda_bf16.h", "crt/host_defines.h", "a-b+c.d/e_f.hpp"])
def test_plain_include_names_pass(name):
    assert check_include_name(name) == name
    assert include_names(f'#include "{name}"\n#include <{name}>\n') == [name, name]


def test_a_comment_that_mentions_an_include_errs_on_refusing():
    with pytest.raises(IncludeRefused):
        include_names('// never #include "/etc/passwd"\n')
    with pytest.raises(IncludeRefused):
        include_names('const char* s = "#include </proc/self/environ>";\n')


def test_a_comment_naming_include_without_an_operand_is_refused():
    with pytest.raises(IncludeRefused, match="not a literal"):
        include_names("// #include is how headers come in\n")


HOSTILE_OPTIONS = [
    "-include", "-include=/etc/passwd", "--pre-include=/etc/passwd", "-I/etc", "-I", "-I/proc/self", "-I.",
    "--include-path=/etc", "-isystem/etc", "--system-include=/etc", "-arch=sm_80", "--gpu-architecture=sm_80",
    "--ptxas-options=-v", "-Xptxas=-O0", "--time=/tmp/mf-time.csv", "--fdevice-time-trace=/tmp/t.json",
    "--create-pch=/tmp/x.pch", "--use-pch=/etc/passwd", "--pch-dir=/etc", "-DX=/etc/passwd", '-DX="a"',
    "-DX=$(id)", "-D X", "-D", "-DX=a b", "-D1X", "", " -DX", "-DX\n-I/etc", "--maxrregcount=0",
    "--std=c++98", "-G --use_fast_math", "-lineinfo=/etc", "--dopt=maybe", "-DX=" + "9" * 65,
]


@pytest.mark.parametrize("option", HOSTILE_OPTIONS)
def test_an_option_off_the_allow_list_is_refused_at_load(tmp_path, option):
    assert option_problem(option) is not None
    with pytest.raises(CatalogError) as info:
        load_catalog(_catalog(tmp_path, options=[option]))
    assert "is not allowed" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("option", [
    "--extra-device-vectorization", "-DFOO", "-DFOO=1", "-DMF_X=1.5f", "--define-macro=A_B=-3", "-UFOO",
    "--use_fast_math", "-lineinfo", "--ftz=false", "--prec-div=true", "--maxrregcount=128", "-std=c++20",
    "--diag-suppress=20,177", "-w",
])
def test_an_allowed_option_passes(tmp_path, option):
    assert option_problem(option) is None
    assert option in load_catalog(_catalog(tmp_path, options=[option])).modules[0].options


def test_the_built_in_catalog_options_are_allowed():
    from mamba_forge.catalog.model import default_catalog_path

    cat = load_catalog(default_catalog_path())
    assert all(option_problem(o) is None for m in cat.modules for o in m.options)
    assert "--extra-device-vectorization" in cat.modules[0].options


# ---- through the CLI: one line, exit 2, nothing leaked, nothing written -----------------------------------------

CLI_CASES = [
    ("source", '#include "/proc/self/environ"'), ("source", '#include "../../../../../../../../proc/self/environ"'),
    ("header", '#include "/proc/self/environ"'), ("source", '#include "{secret}"'), ("header", "#include <{secret}>"),
    ("option", "-include/proc/self/environ"), ("option", "-I/proc/self"), ("option", "--pre-include={secret}"),
]


@pytest.mark.parametrize(("where", "what"), CLI_CASES)
def test_the_cli_refuses_with_one_line_and_leaks_nothing(tmp_path, secret_file, where, what):
    what = what.format(secret=secret_file)
    if where == "option":
        cat = _catalog(tmp_path, options=[what])
    else:
        cat = _catalog(tmp_path, **{f"{where}_prefix": what})
    out = tmp_path / "out"
    rc, stdout, stderr = cli("build", "--catalog", cat, "--arch", "sm_80", "--out", out, "--no-cache",
                             env={"MAMBA_FORGE_SIGNING_KEY": SECRET})
    assert rc == 2 and one_line_error(stderr), stderr
    assert SECRET not in stdout + stderr and "root:x:0" not in stdout + stderr
    assert not (out / "manifest.toml").exists() and not out.exists()


# ---- at build time: a plain name that is no catalog or CUDA header is refused before NVRTC looks on disk -------


@pytest.mark.parametrize("name", ["secret.h", "passwd", "mf/secret.h", "environ"])
def test_a_plain_name_found_only_on_disk_is_refused_before_compiling(tmp_path, secret_file, monkeypatch, name):
    planted = tmp_path / "cwd" / name
    planted.parent.mkdir(parents=True)
    planted.write_text(secret_file.read_text())
    monkeypatch.chdir(planted.parent if "/" not in name else tmp_path / "cwd")
    cat = load_catalog(_catalog(tmp_path, source_prefix=f'#include "{name}"'))  # plain: passes the load rule
    out = tmp_path / "out"
    req = BuildRequest(cat, [get_target("sm_80")], out, jobs=1, cache_location=None)
    with pytest.raises(CatalogError, match="neither a header of the module's include folders nor a CUDA header"):
        build(req)
    assert not (out / "sm_80").exists()


def test_a_source_swapped_after_load_is_checked_again(tmp_path):
    cat_path = _catalog(tmp_path)
    cat = load_catalog(cat_path)
    src = cat_path.parent / "src" / "basic.cu"
    src.write_text('#include "/etc/passwd"\n' + BASIC_SOURCE)  # after the catalog passed
    with pytest.raises(CatalogError, match="not a plain relative header name"):
        build(BuildRequest(cat, [get_target("sm_80")], tmp_path / "out", jobs=1, cache_location=None))


# ---- defence in depth: the log that reaches the manifest is redacted even with every include check off --------


@pytest.fixture(scope="module")
def bypassed_build(tmp_path_factory, secret_file):
    """A build whose include checks are switched off (as if a new NVRTC trick got past them): the secret file and
    the environment (through /proc/self/environ, MAMBA_FORGE_SIGNING_KEY set) reach NVRTC and its log."""
    import mamba_forge.catalog.sources as sources

    root = tmp_path_factory.mktemp("bypass")
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(sources, "include_names", lambda text: [])
        mp.setenv("MAMBA_FORGE_SIGNING_KEY", SECRET)
        prefix = f'#include "{secret_file}"\n#include "/proc/self/environ"\n#include "../../../../../../etc/passwd"'
        cat = load_catalog(_catalog(root, source_prefix=prefix))
        out = root / "out"
        manifest = build(BuildRequest(cat, [get_target("sm_80")], out, jobs=1, cache_location=None))
    finally:
        mp.undo()
    from mamba_forge.manifest import toml_io

    toml_io.write(out / "manifest.toml", manifest)
    return manifest, out


def test_a_bypassed_include_still_leaks_nothing_into_the_manifest(bypassed_build):
    manifest, out = bypassed_build
    (mod,) = manifest.modules
    assert mod.status == "failed" and REDACTED in mod.log_head
    text = (out / "manifest.toml").read_text()
    assert SECRET not in text and SECRET.replace("-", "_") not in text and "root:x:0" not in text
    assert all(SECRET not in s.verdict.reason for s in mod.symbols)


def test_the_raw_nvrtc_log_does_quote_the_secret(secret_file):
    """The control: without redaction NVRTC's log holds the secret (so the test above proves the redaction)."""
    from mamba_forge.build import nvrtc

    res = nvrtc.compile_program(f'#include "{secret_file}"\n', "p.cu", ["-arch=sm_80"], {}, want_ptx=False)
    assert not res.ok and SECRET in res.log
    assert SECRET not in redact_log(res.log, lambda f: f == "p.cu")


LOGS = [
    (f'/etc/passwd(1): error: this declaration has no storage class\n  {SECRET}\n  ^\n\n1 error detected in the '
     'compilation of "p.cu".\n', ["1 error detected"]),
    (f'src/a.cu(3): error: identifier "x" is undefined\n  x = 1;\n  ^\n\n/proc/self/environ(1): error: '
     f'identifier "{SECRET}" is undefined\n  KEY={SECRET}\n  ^\n', ["src/a.cu(3)", "  x = 1;"]),
    (f"nvrtc: error: unknown option {SECRET}\n", []),
    (f"Remark: {SECRET}\n", []),
    (f'secret.h(2): warning #177-D: variable "{SECRET}" was declared but never referenced\n  int {SECRET};\n', []),
    (f'/tmp/{SECRET}(1): catastrophic error: cannot open source file\n', []),
    (f'src/a.cu(1): error: x\n  ok\n{SECRET}\n', ["src/a.cu(1)", "  ok"]),
]


@pytest.mark.parametrize(("log", "kept"), LOGS)
def test_redact_log_drops_every_line_about_a_foreign_file(log, kept):
    red = redact_log(log, lambda f: f in {"src/a.cu", "p.cu"})
    assert SECRET not in red
    for line in kept:
        assert line in red


def test_the_environment_is_not_in_the_compiler_log_of_a_good_build(tmp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_SIGNING_KEY", SECRET)
    cat = load_catalog(_catalog(tmp_path))
    m = build(BuildRequest(cat, [get_target("sm_80")], tmp_path / "out", jobs=1, cache_location=None))
    assert m.modules[0].status == "compiled"
    assert all(SECRET.encode() not in p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert os.environ["MAMBA_FORGE_SIGNING_KEY"] == SECRET
