"""Standard output that fails as one line, and text from the user shown safely.

A full disk (`> /dev/full`) or a reader that quit (`| head -1`) makes a write to stdout raise OSError anywhere in a
command, or only at the interpreter's last flush; click turns a broken pipe into a silent exit 1 and anything else
into a traceback. GuardedStdout turns every failed write or flush into StdoutFailed (not an OSError, so click lets
it through), which main() reports as one `error:` line on stderr.
"""

from __future__ import annotations

import errno
import io

from mamba_forge.core import errors

_SHOWN = 300  # characters of one echoed value


class StdoutFailed(Exception):  # noqa: N818 - reads as what happened, like typer.Exit
    def __init__(self, cause: OSError):
        self.cause = cause
        super().__init__(str(cause))

    def message(self) -> str:
        if isinstance(self.cause, BrokenPipeError) or self.cause.errno == errno.EPIPE:
            return "stdout was closed before the output was written (a reader such as `head` quit); output cut short"
        reason = self.cause.strerror or type(self.cause).__name__
        return f"cannot write to stdout: {reason}; output cut short"


class GuardedStdout:
    """A text stream around sys.stdout whose write and flush raise StdoutFailed instead of OSError; the rest
    (isatty, fileno, encoding, buffer...) is the stream's own, so rich and click treat it as the real one."""

    def __init__(self, stream):
        self._stream = stream if stream is not None else ClosedStdout()

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise StdoutFailed(exc) from None

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutFailed(exc) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class SilentStderr:
    """A text stream around sys.stderr that drops what it cannot write (a full disk, a closed pipe or
    descriptor): with nowhere left to say anything the command goes on, and its exit code still tells."""

    def __init__(self, stream):
        self._stream = stream if stream is not None else ClosedStdout()

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class ClosedStdout(io.TextIOBase):
    """What sys.stdout is when file descriptor 1 was closed (`mamba-forge ... >&-`, where Python sets it to
    None): every write fails as a closed descriptor would."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")


def printable(value: object, limit: int = _SHOWN) -> str:
    """`value` as one line a terminal shows as-is (mamba_forge.core.errors.printable: control characters and escape
    sequences written as Python escapes), bounded to `limit` characters for an echoed CLI value."""
    return errors.printable(value, limit=limit)
