"""`--json` output: one envelope on stdout for every command, errors included, and nothing else on stdout.

    {"schema_version": 1, "command": "report", "ok": true, "result": {...}}
    {"schema_version": 1, "command": "verify", "ok": false, "result": {"error": "...", "exit_code": 1}}

`ok` is true exactly when the command exits 0. The schemas: mamba_forge/schemas (`mamba-forge schema NAME`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

GROUPS = ("cache",)  # commands with subcommands: the envelope names both words ("cache prune")


@dataclass
class _State:
    active: bool = False
    command: str = "mamba-forge"
    emitted: bool = False


state = _State()


def command_of(argv: list[str]) -> str:
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        return "mamba-forge"
    return " ".join(words[:2]) if words[0] in GROUPS and len(words) > 1 else words[0]


def start(argv: list[str]) -> None:
    """Before the command runs: whether --json was given (before any `--`), and the command's name."""
    head = argv[: argv.index("--")] if "--" in argv else argv
    state.active, state.command, state.emitted = "--json" in head, command_of(head), False


def envelope(command: str, ok: bool, result) -> dict:
    from mamba_forge.schemas import SCHEMA_VERSION  # here: importing the schemas costs `mamba-forge -h` ~10 ms

    return {"schema_version": SCHEMA_VERSION, "command": command, "ok": ok, "result": result}


def emit(result, *, ok: bool = True) -> None:
    """The command's one JSON document on stdout."""
    sys.stdout.write(json.dumps(envelope(state.command, ok, result), indent=1, default=str) + "\n")
    state.emitted = True


def emit_error(message: str, exit_code: int) -> None:
    """The envelope of a refusal, unless the command already printed its own (a result with ok false)."""
    if state.active and not state.emitted:
        emit({"error": message, "exit_code": exit_code}, ok=False)
