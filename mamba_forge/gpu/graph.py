"""Events (ordering and timing) and CUDA graphs (a stream capture, instantiated for replay)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mamba_forge.gpu.core import bindings, check

if TYPE_CHECKING:
    from mamba_forge.gpu.driver import Stream


class Event:
    def __init__(self, timing: bool = True):
        d = bindings()
        flags = int(d.CUevent_flags.CU_EVENT_DEFAULT if timing else d.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.handle = check("cuEventCreate", d.cuEventCreate(flags))

    def record(self, stream: Stream) -> None:
        check("cuEventRecord", bindings().cuEventRecord(self.handle, stream.handle))

    def synchronize(self) -> None:
        check("cuEventSynchronize", bindings().cuEventSynchronize(self.handle))

    def elapsed_ms(self, later: Event) -> float:
        return float(check("cuEventElapsedTime", bindings().cuEventElapsedTime(self.handle, later.handle)))

    def destroy(self) -> None:
        if self.handle is not None:
            check("cuEventDestroy", bindings().cuEventDestroy(self.handle))
            self.handle = None


class Graph:
    """A stream capture, instantiated for replay."""

    def __init__(self, graph, exec_):
        self.graph, self.exec = graph, exec_

    @classmethod
    def capture(cls, stream: Stream, body: Callable[[], object]) -> Graph:
        """Capture what `body` enqueues on `stream` (thread-local mode: other threads' work is not captured)."""
        d = bindings()
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check("cuStreamBeginCapture", d.cuStreamBeginCapture(stream.handle, mode))
        try:
            body()
        finally:
            graph = check("cuStreamEndCapture", d.cuStreamEndCapture(stream.handle))
        exec_ = check("cuGraphInstantiate", d.cuGraphInstantiate(graph, 0))
        return cls(graph, exec_)

    def launch(self, stream: Stream) -> None:
        check("cuGraphLaunch", bindings().cuGraphLaunch(self.exec, stream.handle))

    def destroy(self) -> None:
        d = bindings()
        if self.exec is not None:
            check("cuGraphExecDestroy", d.cuGraphExecDestroy(self.exec))
            self.exec = None
        if self.graph is not None:
            check("cuGraphDestroy", d.cuGraphDestroy(self.graph))
            self.graph = None
