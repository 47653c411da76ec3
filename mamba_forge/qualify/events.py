"""The worker protocol: the events a qualification worker streams on stdout, one JSON object per line.

Defined once, here: the worker (worker.py) writes each event with ``to_json_line()``; the parent
(supervise.py) reads every line with :func:`from_json_line`, the one parser, which refuses a line that is not
an event of this protocol (unknown event, unknown or missing field, wrong type) with a :class:`ProtocolError`.

    hello, fatal               the worker opened the device (or could not)
    module, module_error       a group's module loaded (or not)
    start, check, result       one symbol: begun, a check passed or failed (also the heartbeat), its verdict
    fault, timeout             the symbol in flight broke the context or hung (the worker then exits)
    done                       every group finished
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from functools import cache
from typing import ClassVar, Union


class ProtocolError(ValueError):
    """A worker line that is not an event of the protocol."""


# ---- records carried inside events ------------------------------------------------------------------------


@dataclass
class CheckResult:
    """One check of one symbol, as the qualified manifest records it (QCheck)."""

    name: str
    passed: bool
    digest: str = ""
    detail: str = ""


@dataclass
class LiveResources:
    """What the driver reports for the loaded kernel (attributes, occupancy at the declared shape)."""

    registers: int
    static_smem: int
    local_bytes: int
    max_threads: int
    blocks_per_sm: int = 0


@dataclass
class WorkerDevice:
    """The device a worker opened."""

    name: str
    cc: str  # "9.0"
    sm_count: int
    driver_version: int
    optin_smem: int = 0
    uuid: str = ""
    ordinal: int = 0


UNKNOWN_DEVICE = WorkerDevice(name="unknown", cc="?", sm_count=0, driver_version=0)  # no worker ever said hello


# ---- events -----------------------------------------------------------------------------------------------


class _Event:
    event: ClassVar[str]

    def to_json_line(self) -> str:
        return json.dumps({"event": self.event, **asdict(self)}) + "\n"  # type: ignore[call-overload]


@dataclass
class Hello(_Event):
    event: ClassVar[str] = "hello"
    device: WorkerDevice
    pid: int | None = None


@dataclass
class Fatal(_Event):
    event: ClassVar[str] = "fatal"
    reason: str
    result: str = ""  # the CUresult name


@dataclass
class ModuleLoaded(_Event):
    event: ClassVar[str] = "module"
    module: str
    target: str
    load: str  # "cubin" or "ptx"


@dataclass
class ModuleError(_Event):
    event: ClassVar[str] = "module_error"
    module: str
    target: str
    reason: str
    result: str = ""


@dataclass
class Start(_Event):
    event: ClassVar[str] = "start"
    symbol: str
    module: str
    target: str


@dataclass
class CheckDone(_Event):
    """One check finished: progress, and the heartbeat that tells the parent the worker is alive."""

    event: ClassVar[str] = "check"
    symbol: str
    name: str
    passed: bool


@dataclass
class SymbolResult(_Event):
    """The verdict on one symbol (also the record the parent keeps, amends and assembles)."""

    event: ClassVar[str] = "result"
    STATUSES: ClassVar[tuple[str, ...]] = ("admitted", "rejected")
    symbol: str
    module: str
    target: str
    status: str
    check: str = ""  # the check that decided a rejection
    reason: str = ""
    checks: list[CheckResult] = field(default_factory=list)
    seed: int | None = None
    block: list[int] | None = None
    dynamic_smem: int | None = None
    resources: LiveResources | None = None
    params: list[list[int]] = field(default_factory=list)  # the live ABI census: [offset, size] per parameter
    seconds: float | None = None

    @classmethod
    def rejected(cls, symbol: str, module: str, target: str, check: str, reason: str) -> SymbolResult:
        return cls(symbol, module, target, "rejected", check, reason)

    @property
    def admitted(self) -> bool:
        return self.status == "admitted"

    def reject(self, check: str, reason: str) -> None:
        self.status, self.check, self.reason = "rejected", check, reason


@dataclass
class Fault(_Event):
    event: ClassVar[str] = "fault"
    symbol: str
    reason: str
    result: str = ""


@dataclass
class Timeout(_Event):
    event: ClassVar[str] = "timeout"
    symbol: str
    reason: str
    seconds: float = 0.0


@dataclass
class Done(_Event):
    event: ClassVar[str] = "done"


Event = Union[Hello, Fatal, ModuleLoaded, ModuleError, Start, CheckDone, SymbolResult, Fault, Timeout, Done]  # noqa: UP007
EVENTS: dict[str, type] = {cls.event: cls for cls in typing.get_args(Event)}


# ---- the one parser ---------------------------------------------------------------------------------------


def from_json_line(line: str) -> Event:
    """Parse one line from a worker; ProtocolError says what is wrong with it."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"a JSON {type(data).__name__}, not an object")
    tag = data.pop("event", None)
    cls = EVENTS.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ProtocolError(f"unknown event {tag!r}")
    ev = _build(cls, data, tag)
    if isinstance(ev, SymbolResult) and ev.status not in SymbolResult.STATUSES:
        raise ProtocolError(f"result.status: {ev.status!r} is not one of {list(SymbolResult.STATUSES)}")
    return ev


@cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _build(cls: type, data: dict, where: str):
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {unknown}")
    values = {}
    for name, f in known.items():
        if name in data:
            values[name] = _convert(_hints(cls)[name], data[name], f"{where}.{name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ProtocolError(f"{where}: missing field {name!r}")
    return cls(**values)


def _convert(tp, value, where: str):
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):  # X | None
        if value is None:
            return None
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
        origin = typing.get_origin(tp)
    if is_dataclass(tp):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {value!r:.60}")
        return _build(tp, value, where)  # type: ignore[arg-type]
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list, got {value!r:.60}")
        (item,) = typing.get_args(tp)
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(tp)
    if ok is None:
        raise TypeError(f"{where}: the protocol has no reader for {tp!r}")  # a field type added above without one
    if not ok:
        raise ProtocolError(f"{where}: expected {tp.__name__}, got {value!r:.60}")
    return float(value) if tp is float else value


__all__ = [
    "EVENTS", "UNKNOWN_DEVICE", "CheckDone", "CheckResult", "Done", "Event", "Fatal", "Fault", "Hello", "LiveResources",
    "ModuleError", "ModuleLoaded", "ProtocolError", "Start", "SymbolResult", "Timeout", "WorkerDevice", "from_json_line",
]
