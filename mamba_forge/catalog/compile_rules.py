"""What a catalog may hand the compiler, checked before anything compiles: its options come from an allow list,
and its sources and headers include other files only by a literal, relative name (no '/', no '..', no macro).

Why: NVRTC opens any path an `#include` names (absolute, `../..`, `/proc/self/environ`) and any folder an option
names (`-I`, `-include`, `--pre-include`), and its log quotes the lines it choked on, so a hostile catalog could
copy a file of this machine, or its environment, into the build manifest. So every include is found by a scan
that errs on the side of refusing (a `#include` in a comment or a string counts too), its name must be plain, and
the build (`build/builder.py`) refuses a name that is neither one of the module's in-memory headers nor a file of
the pinned CUDA headers. The compiler log that reaches the manifest is redacted as well (:func:`redact_log`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

MAX_INCLUDE_NAME = 200

# A plain relative include name: components of safe characters, none starting with '.' (so no '..', no hidden).
_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"
SAFE_INCLUDE_NAME = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_GAP = r"(?:[ \t\f\v]|/\*.*?\*/)*"  # blanks and block comments (a directive may hold them between its tokens)
# Every directive that opens a file, wherever it appears (a comment or a string too: the scan errs on refusing).
_DIRECTIVE = re.compile(rf"(?:#|%:){_GAP}(include_next|include|import|embed)\b", re.S)
_QUERY = re.compile(r"\b(__has_include_next|__has_include|__has_embed)\b")
_OPERAND = re.compile(rf"{_GAP}(?:\"([^\"\n]*)\"|<([^>\n]*)>)", re.S)
_QUERY_OPERAND = re.compile(rf"{_GAP}\({_GAP}(?:\"([^\"\n]*)\"|<([^>\n]*)>)", re.S)


class IncludeRefused(ValueError):
    """An include the rules refuse; the message names the directive and why."""


def _spliced(text: str) -> str:
    return text.replace("\\\r\n", "").replace("\\\n", "")


def include_names(text: str) -> list[str]:
    """Every file name the text's include directives and `__has_include` queries name, after checking each is a
    literal, plain relative name. Raises IncludeRefused for a computed (macro) include, an absolute path, '..',
    or any other character a header name does not need. The scan of a text is done once per process (the
    catalog's load and each module's build scan the same shared headers: 11 modules, 283 scans)."""
    return list(_include_names(text))


@functools.lru_cache(maxsize=1024)
def _include_names(text: str) -> tuple[str, ...]:  # a refusal is not cached: it is raised again, scanning again
    text = _spliced(text)
    names = []
    for pattern, operand, what in ((_DIRECTIVE, _OPERAND, "#{}"), (_QUERY, _QUERY_OPERAND, "{}")):
        for m in pattern.finditer(text):
            directive = what.format(m.group(1))
            op = operand.match(text, m.end())
            if op is None:
                rest = text[m.end(): m.end() + 40].strip().split("\n")[0]
                raise IncludeRefused(f"{directive} {rest!r} is not a literal \"name\" or <name> "
                                     "(a computed include could name any file)")
            names.append(check_include_name(op.group(1) if op.group(1) is not None else op.group(2), directive))
    return tuple(names)


def check_include_name(name: str, directive: str = "#include") -> str:
    if len(name) > MAX_INCLUDE_NAME or not SAFE_INCLUDE_NAME.fullmatch(name):
        shown = name if len(name) <= 60 else name[:60] + "…"
        raise IncludeRefused(f"{directive} {shown!r} is not a plain relative header name (no absolute path, no "
                             "'..', no leading '.', letters, digits and _ . + - only)")
    return name


# ---- options -------------------------------------------------------------------------------------------------

_MACRO = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
_MACRO_VALUE = r"[A-Za-z0-9_.+-]{0,64}"
_BOOL = r"(?:true|false)"
# The allow list: exact shapes, nothing that names a path (no -I, -include, --pre-include, -isystem, --pch, --time,
# --ptxas-options, -Xptxas), nothing the build itself sets per target (-arch).
OPTION_SHAPES = tuple(
    re.compile(p)
    for p in (
        rf"(?:-D|--define-macro=){_MACRO}(?:={_MACRO_VALUE})?",
        rf"(?:-U|--undefine-macro=){_MACRO}",
        r"--?extra-device-vectorization",
        r"--?use_fast_math",
        r"-lineinfo|--generate-line-info",
        r"--?restrict",
        r"-default-device|--device-as-default-execution-space",
        rf"--?(?:ftz|prec-div|prec-sqrt|fmad)={_BOOL}",
        r"--?maxrregcount=[1-9][0-9]{0,2}",
        r"--?std=c\+\+(?:17|20)",
        r"--?dopt=(?:on|off)",
        r"-w|--disable-warnings",
        r"--?diag-(?:suppress|warn|error)=[0-9]{1,5}(?:,[0-9]{1,5}){0,31}",
    )
)


def option_problem(option: object) -> str | None:
    """Why an option is refused, or None when it is on the allow list."""
    if not isinstance(option, str):
        return f"option {option!r} is not a string"
    if any(p.fullmatch(option) for p in OPTION_SHAPES):
        return None
    shown = option if len(option) <= 60 else option[:60] + "…"
    return (f"option {shown!r} is not allowed (catalog options may define macros -DNAME[=VALUE] and set known "
            "code-generation flags; nothing that names a file or folder, such as -I or -include)")


# ---- the compiler log ----------------------------------------------------------------------------------------

_DIAGNOSTIC = re.compile(r"^(?P<file>\S[^\n]*?)\((?P<line>\d+)\): (?P<rest>.*)$")
_SUMMARY = re.compile(r"^\d+ (?:catastrophic )?errors? detected in the compilation of \"[A-Za-z0-9_.+-]{1,200}\"\.$")
_SAFE_LINES = {"Compilation terminated.",
               'Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"'}
REDACTED = "(redacted: a diagnostic about a file outside the catalog)"


def redact_log(log: str, known_file: Callable[[str], bool]) -> str:
    """The compiler log with every diagnostic about a file that `known_file` does not accept dropped, its quoted
    source lines and message included (they could hold a secret), and every other line kept only when it has a
    known, harmless shape. Diagnostics about the catalog's own files are kept whole."""
    out: list[str] = []
    keep = False  # whether the current diagnostic's continuation lines (quoted source, caret) are kept
    for line in log.splitlines():
        m = _DIAGNOSTIC.match(line)
        if m:
            keep = known_file(m.group("file"))
            if keep:
                out.append(line)
            elif not out or out[-1] != REDACTED:
                out.append(REDACTED)
        elif not line.strip():
            out.append("")
        elif keep and line[:1].isspace():
            out.append(line)
        elif _SUMMARY.match(line) or line in _SAFE_LINES:
            keep = False
            out.append(line)
        elif not out or out[-1] != REDACTED:
            keep = False
            out.append(REDACTED)
    return "\n".join(out)


def unknown_includes(names: Iterable[str], known: Callable[[str], bool]) -> list[str]:
    return sorted({n for n in names if not known(n)})
