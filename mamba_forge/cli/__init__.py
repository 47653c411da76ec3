"""The `mamba-forge` command line: parse, call a stage, render. No pipeline logic lives here.

Errors reach the user as one line on stderr (``error: what is wrong; what to do``), never a traceback, with the
one exit-code table below (EXIT_CODES; README and `mamba-forge -h` show it). `--json` on every command prints
one envelope on stdout (cli_json.py); progress goes to stderr through progress.py.

One module per command group (cmd_build, cmd_report, cmd_verify, cmd_qualify; env and cache in cli_env.py); this
one holds the app, the entry point and the two consoles. Every command imports its stage inside its body, and the
consoles (rich) are made on first use, so `mamba-forge -h` imports typer and little else.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from mamba_forge import __version__
from mamba_forge import cli_json as js
from mamba_forge.cli import cmd_build, cmd_qualify, cmd_report, cmd_verify
from mamba_forge.cli.cmd_qualify import _qualify_with_progress  # noqa: F401 - tests drive the progress rendering
from mamba_forge.cli.streams import GuardedStdout, SilentStderr, StdoutFailed, printable
from mamba_forge.core.errors import ForgeError

try:  # typer >= 0.28 vendors its own click; older typer uses click itself
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as _click_exc

EXIT_CODES = {
    0: "ok (report --diff: the manifests are the same)",
    1: "a check failed: a manifest does not verify, a mandatory module did not compile, report --diff found "
       "differences",
    2: "bad input: a missing or unreadable file, a bad option, path or glob, no usable GPU, a stdout that cannot "
       "be written; the one-line message says what to do",
}
EPILOG = "\b\nExit codes (every command):\n" + "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items())

# Help in plain words: typer >= 0.29 prints each argument's Python type beside it (`MANIFEST <list[Path]>`); the
# metavar already says what to pass, so the type is left out (tests/test_cli_conventions.py checks every -h).
if hasattr(getattr(typer, "core", None), "TyperArgument") and hasattr(typer.core.TyperArgument, "display_type_rich"):
    typer.core.TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]

app = typer.Typer(
    name="mamba-forge",
    help="Build, qualify, sign and load deterministic Mamba SSM CUDA kernels.",
    epilog=EPILOG,
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def __getattr__(name: str):
    """`out` and `err`, the rich consoles of stdout and stderr, made on first use (tests replace them)."""
    if name in ("out", "err"):
        from rich.console import Console

        console = Console(stderr=name == "err")
        globals()[name] = console
        return console
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"mamba-forge {__version__}\n")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


for _command in (cmd_build.build, cmd_report.report, cmd_verify.verify, cmd_verify.merge, cmd_verify.bundle,
                 cmd_qualify.qualify, cmd_verify.keygen, cmd_verify.schema):
    app.command()(_command)

from mamba_forge.cli_env import register as _register_env_and_cache  # noqa: E402 - needs `app` above

_register_env_and_cache(app)


_LINE = 4000  # characters of one error line


def _say_error(message: str) -> None:
    """The one `error:` line, escaped (a stderr that cannot take it: SilentStderr drops it)."""
    sys.modules[__name__].err.print(f"error: {printable(message, _LINE)}", markup=False, highlight=False,
                                    soft_wrap=True)


_stdout_failed = False  # entry() then points fd 1 at /dev/null so the interpreter's last flush cannot fail


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and turns every user-facing error into one line and an exit code (and, with
    --json, an envelope with ok false). A stdout that cannot be written (full disk, closed pipe) is one line on
    stderr and exit 2; a stderr that cannot be written is ignored (the exit code still tells)."""
    global _stdout_failed
    if argv is None:
        argv = sys.argv[1:]
    if not argv:
        argv = ["--help"]
    js.start(argv)
    real, real_err = sys.stdout, sys.stderr
    guarded, silent = GuardedStdout(real), SilentStderr(real_err)
    sys.stdout, sys.stderr = guarded, silent
    _stdout_failed = False
    try:
        rc = _run(argv)
        if not _stdout_failed:
            guarded.flush()  # block-buffered off a terminal: a full disk often shows only here
    except StdoutFailed as exc:
        _stdout_failed = True
        _say_error(exc.message())
        rc = 2
    finally:
        if sys.stdout is guarded:
            sys.stdout = real
        if sys.stderr is silent:
            sys.stderr = real_err
    return rc


def _run(argv: list[str]) -> int:
    def fail(message: str, code: int) -> int:
        global _stdout_failed
        _say_error(message)
        try:
            js.emit_error(printable(message, _LINE), code)
        except StdoutFailed:  # the error is said; a second line about stdout would only bury it
            _stdout_failed = True
        return code

    try:
        rc = app(args=argv, standalone_mode=False)
    except ForgeError as exc:
        return fail(str(exc), exc.exit_code)
    except _click_exc.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "mamba-forge"
        return fail(f"{exc.format_message().rstrip('.')}; see `{cmd} --help`", 2)
    except typer.Abort:
        return fail("aborted", 130)
    except typer.Exit as exc:
        rc = exc.exit_code
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    except SystemExit as exc:  # typer's --show-completion and --install-completion end this way
        rc = exc.code if isinstance(exc.code, int) else 0
    rc = rc if isinstance(rc, int) else 0
    if rc:
        js.emit_error("failed; see the error on stderr", rc)  # only when the command printed no envelope
    return rc


def entry() -> None:
    rc = main()
    if _stdout_failed and sys.stdout is not None:  # what is left in its buffer would fail again at exit, noisily
        import os

        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
    sys.exit(rc)
