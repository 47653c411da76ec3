"""What every command module shares: the two consoles, the common options and the small input checks.

The consoles live on the package (`mamba_forge.cli.out`, `.err`, created on first use so `mamba-forge -h` never
imports rich); tests swap them there, so commands reach them through stdout() and stderr() at call time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mamba_forge.core.errors import ForgeError

if TYPE_CHECKING:
    from rich.console import Console

MAX_JOBS = 256  # --jobs: a bound before any pool is sized (an unbounded count would fork until the machine stops)
MAX_TIMEOUT_S = 3600.0  # --timeout: nan and inf fail its max as well


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout (schema: mamba-forge schema).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress, notes or tables; the exit code only.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Say what would run, and why, with counts; write nothing.")]
KeyOpt = Annotated[
    list[Path] | None,
    typer.Option("--key", metavar="PUB", help="Trusted public key file or folder of *.pub (besides manifests/keys "
                 "and your trust folder); repeatable."),
]


def stdout() -> Console:
    from mamba_forge import cli

    return cli.out


def stderr() -> Console:
    from mamba_forge import cli

    return cli.err


SAY_LIMIT = 1 << 20  # a line on stdout is never cut for length (a path, a long list): only escaped


def say(line: str) -> None:
    """One line for a person on stdout (never with --json), control characters escaped (errors.printable): a
    line names paths and names from outside, and a newline or an escape sequence in one must neither start a
    line of its own nor reach the terminal. Text of several lines goes through say_lines."""
    from mamba_forge.cli.streams import printable

    stdout().print(printable(line, SAY_LIMIT), markup=False, highlight=False, soft_wrap=True)


def say_lines(lines) -> None:
    """Each of `lines` as its own say() line."""
    for line in lines:
        say(line)


def say_err(line: str) -> None:
    """One line for a person on stderr (notes, warnings), control characters escaped: notes echo environment
    variables and paths."""
    from mamba_forge.cli.streams import printable

    stderr().print(printable(line, 4000), markup=False, highlight=False, soft_wrap=True)


def bad_input(exc: ForgeError) -> ForgeError:
    """A failure to read an input as bad input (exit 2), keeping its message."""
    return ForgeError(exc.message, hint=exc.hint)


def must_exist(path: Path, what: str, hint: str) -> None:
    if not (path.exists() or path.is_symlink()):
        raise ForgeError(f"{what} not found: {path}", hint=hint)


def plural(n: int, word: str) -> str:
    """'1 program', '2 programs'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def article(word: str) -> str:
    """'an Ampere', 'a Hopper': by the first letter, which is what the names here need (no 'an hour' cases)."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"
