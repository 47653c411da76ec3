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
