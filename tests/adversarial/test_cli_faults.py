"""The CLI against a hostile environment (issue #27): a stdout that cannot be written (a full disk, a reader that
quit, a closed descriptor), job counts no machine has, and control characters or escape sequences in the values
an error line echoes. Each ends in one `error:` line on stderr and exit 2: no traceback, no raw escape reaching
the terminal. Run in-process (main(argv) with sys.stdout swapped) to stay fast; a few cases run a real process
against /dev/full, a pipe with no reader and a closed descriptor, where the interpreter's last flush counts too."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harden_support import make_fixture, one_line_error
from runtime_support import write_tiny_catalog

from mamba_forge.cli import main
from mamba_forge.cli.common import MAX_JOBS
from mamba_forge.cli.streams import printable

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "manifests" / "h200.toml"


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return make_fixture(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def tiny_cat(tmp_path_factory):
    return write_tiny_catalog(tmp_path_factory.mktemp("faults-cat") / "cat")


@pytest.fixture(autouse=True)
def _isolated(cli_consoles, tmp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(tmp_path / "cache"))
    cli_consoles()  # the real consoles: they write to whatever sys.stdout is now


class _Failing(io.TextIOBase):
    """A stdout whose write or flush fails with `exc` (a full disk fails at flush when output is buffered)."""

    def __init__(self, exc: OSError, on: str):
        self.exc, self.on, self.written = exc, on, []

    def write(self, text: str) -> int:
        if self.on == "write":
            raise self.exc
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        if self.on == "flush" and self.written:
            raise self.exc

    def isatty(self) -> bool:
        return False


FAULTS = {
    "full-on-write": lambda: _Failing(OSError(errno.ENOSPC, "No space left on device"), "write"),
    "full-on-flush": lambda: _Failing(OSError(errno.ENOSPC, "No space left on device"), "flush"),
    "pipe-on-write": lambda: _Failing(BrokenPipeError(errno.EPIPE, "Broken pipe"), "write"),
    "pipe-on-flush": lambda: _Failing(BrokenPipeError(errno.EPIPE, "Broken pipe"), "flush"),
    "closed": lambda: None,  # what Python makes sys.stdout when descriptor 1 is closed
}
SAID = {"full": "cannot write to stdout: No space left on device", "pipe": "stdout was closed before",
        "closed": "cannot write to stdout: stdout is closed"}

# commands that print to stdout and need no GPU; "FX" stands for the signed tiny fixture (quicker to read than
# manifests/h200.toml), "PUB" for its key
COMMANDS = {
    "schema": ["schema"],
    "schema-name": ["schema", "build"],
    "schema-json": ["schema", "--json"],
    "report": ["report", "FX"],
    "report-json": ["report", "FX", "--json"],
    "report-markdown": ["report", "FX", "--format", "markdown"],
    "report-diff": ["report", "--diff", "FX", "FX"],
    "verify": ["verify", "FX", "--key", "PUB"],
    "verify-json": ["verify", "FX", "--key", "PUB", "--json"],
    "version": ["--version"],
    "help": ["-h"],
    "report-help": ["report", "-h"],
    "cache-dir": ["cache", "dir"],
    "cache-dir-json": ["cache", "dir", "--json"],
    "env-json": ["env", "--json"],
}


def _argv(args: list, request) -> list[str]:
    if "FX" in args:
        fx = request.getfixturevalue("fx")
        args = [fx.manifest if a == "FX" else fx.pub if a == "PUB" else a for a in args]
    return [str(a) for a in args]


def _run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("command", COMMANDS)
def test_unwritable_stdout_is_one_line_and_exit_2(command, fault, request, capsys, monkeypatch):
    argv = _argv(COMMANDS[command], request)
    monkeypatch.setattr(sys, "stdout", FAULTS[fault]())
    rc, err = _run(argv, capsys)
    assert rc == 2, err
    assert one_line_error(err), err
    assert SAID[fault.split("-")[0]] in err


def test_a_writable_stdout_still_gets_the_output(fx, capsys):
    assert _run(["verify", str(fx.manifest), "--key", str(fx.pub)], capsys)[0] == 0
    rc = main(["schema"])
    out = capsys.readouterr()
    assert rc == 0 and "build" in out.out.split() and out.err == ""


def _process(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mamba_forge.cli", *args], stderr=subprocess.PIPE, text=True,
                          timeout=60, **kw)


def test_real_dev_full():
    with open("/dev/full", "w") as full:
        r = _process(["schema", "build"], stdout=full)
    assert r.returncode == 2 and one_line_error(r.stderr), r.stderr
    assert "No space left on device" in r.stderr


def test_real_pipe_whose_reader_quit(fx):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: EPIPE, as `| head -1` gives a long report
    try:
        r = _process(["report", str(fx.manifest), "--symbols", "*"], stdout=write)
    finally:
        os.close(write)
    assert r.returncode == 2 and one_line_error(r.stderr), r.stderr
    assert "stdout was closed" in r.stderr


def test_real_closed_stdout():
    r = _process(["schema"], stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert r.returncode == 2 and one_line_error(r.stderr), r.stderr
    assert "stdout is closed" in r.stderr


BAD_JOBS = ["99999999999999999999", str(MAX_JOBS + 1), "-1", "1e3", "0x10", "", "nan", "4.5"]


@pytest.mark.parametrize("value", BAD_JOBS)
@pytest.mark.parametrize("command", ["build", "qualify"])
def test_jobs_out_of_range_is_refused_naming_the_range(command, value, tiny_cat, capsys):
    argv = [command, "--jobs", value, "--dry-run"] + (["--catalog", str(tiny_cat)] if command == "build" else [])
    rc, err = _run(argv, capsys)
    assert rc == 2 and one_line_error(err), err
    assert "--jobs" in err
    if value.lstrip("-").isdigit():
        assert str(MAX_JOBS) in err or "greater than or equal" in err


@pytest.mark.parametrize("value", ["1", str(MAX_JOBS)])
def test_jobs_in_range_is_taken(value, tiny_cat, capsys):
    rc, err = _run(["build", "--catalog", str(tiny_cat), "--jobs", value, "--dry-run", "-q", "--arch", "sm_90a"],
                   capsys)
    assert rc == 0, err


HOSTILE = {
    "csi": "a\x1b[31mred\x1b[0m",
    "clear": "x\x1b[2J\x1b[H",
    "osc-title": "t\x1b]0;owned\x07",
    "newline": "one\ntwo",
    "cr": "shown\rhidden",
    "c1-csi": "c1\x9b31m",
    "bidi": "abc\u202etxt.exe",
    "backspace": "ab\x08\x08cd",
    "del": "d\x7fe",
}
# where a value comes back in an error line
POSITIONS = {
    "report-path": lambda v, fx: ["report", f"/nonexistent/{v}.toml"],
    "verify-path": lambda v, fx: ["verify", f"/nonexistent/{v}.toml"],
    "report-kernels": lambda v, fx: ["report", str(fx.manifest), "--kernels", f"{v}*"],
    "build-kernels": lambda v, fx: ["build", "--catalog", str(fx.root / "cat" / "catalog.toml"), "--kernels",
                                    f"{v}*", "--dry-run", "--arch", "sm_90a"],
    "schema-name": lambda v, fx: ["schema", v],
    "qualify-device": lambda v, fx: ["qualify", "--device", v],
}


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("value", HOSTILE)
def test_echoed_values_are_escaped(position, value, fx, capsys):
    raw = HOSTILE[value]
    rc, err = _run(POSITIONS[position](raw, fx), capsys)
    assert rc == 2 and one_line_error(err), repr(err)
    line = err.rstrip("\n")
    assert line.isprintable(), repr(line)  # no raw ESC, CR, newline, C1, bidi override or DEL reaches the terminal
    assert printable(raw) in line, repr(line)


def test_printable_keeps_plain_text_and_bounds_long_values():
    assert printable("softplus_bf16 ünïcode/path.toml") == "softplus_bf16 ünïcode/path.toml"
    assert printable("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert printable("x" * 1000).endswith("... (1000 characters)") and len(printable("x" * 1000)) < 330


# a stderr that cannot be written: nothing left to say anything on, so the command goes on and its exit code tells
STDERR_CASES = {
    "report-missing": (["report", "/nonexistent/m.toml"], 2),
    "schema-unknown": (["schema", "no-such-schema"], 2),
    "jobs-usage": (["build", "--jobs", "99999999999999999999"], 2),
    "verify-readme": (["verify", str(ROOT / "README.md")], 2),
    "verify-ok": (["verify", "FX", "--key", "PUB"], 0),
    "report-ok": (["report", "FX"], 0),
}


@pytest.mark.parametrize("fault", ["full-on-write", "pipe-on-write", "closed"])
@pytest.mark.parametrize("case", STDERR_CASES)
def test_unwritable_stderr_keeps_the_exit_code(case, fault, request, capsys, monkeypatch):
    args, code = STDERR_CASES[case]
    argv = _argv(args, request)
    monkeypatch.setattr(sys, "stderr", FAULTS[fault]())
    capsys.readouterr()
    assert main(argv) == code
