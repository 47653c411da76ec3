"""Errors that reach the user as one line: what is wrong and what to do."""


class ForgeError(Exception):
    """A user-facing failure. The CLI prints str(err) on one line and exits with `exit_code`."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}; {hint}")


class CatalogError(ForgeError):
    """The catalog is malformed: names the file, the entry and the problem."""


class BuildError(ForgeError):
    """The build could not run at all (not: a module failed to compile, which is a recorded verdict)."""


class ManifestError(ForgeError):
    """A manifest cannot be read, or does not verify."""

    exit_code = 1


PRINTABLE_MAX = 200  # longest quoted value in an error line; a longer one is cut and marked


def printable(value: object, *, limit: int = PRINTABLE_MAX) -> str:
    """`value` as text safe to put in one error line: control and other non-printable characters escaped the
    way repr() writes them (ESC -> '\\x1b', newline -> '\\n', so no escape sequence reaches a terminal and the
    message stays one line), cut to `limit` characters. Used wherever a message quotes a user-supplied name."""
    text = value if isinstance(value, str) else str(value)
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text)} characters)"
    return text
