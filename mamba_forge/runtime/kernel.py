"""A loaded kernel and its launches: :class:`Kernel` (one admitted symbol of a verified manifest, called with keyword
arguments: the checked launch of its signed contract) and :func:`launch` (the positional path for power users: you
compute the grid; the block and dynamic shared memory must be the qualified ones).

    kernels.softplus_forward.bf16(y=y, x=x)                                          # Kernel.__call__
    launch(kernels.function("softplus_forward_bf16"), grid, block, (y, x, n))        # positional

Kernels (runtime/loader.py) makes them; ``from mamba_forge.runtime.loader import Kernel, launch`` and
``mamba_forge.runtime.launch`` still name them. The keyword launch (runtime/contract.py, runtime/streams.py,
gpu/launcher.py) and the positional typer (runtime/args.py) are imported on a kernel's first call.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from mamba_forge.core.schema import Param, RuntimeSymbol
from mamba_forge.runtime.errors import LaunchRefused

GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclass
class Kernel:
    """A loaded, admitted symbol: call it with keyword arguments (the checked launch of its signed contract)."""

    name: str  # the symbol that serves (a fallback's name when one was followed)
    requested: str  # the name asked for
    module: str
    target: str
    family: str
    dtype: str
    block: tuple[int, int, int]
    dynamic_smem: int
    params: list[list[int]]  # [offset, size] per parameter (the ABI census)
    max_threads: int
    symbol: RuntimeSymbol = field(repr=False)  # type: ignore[valid-type] # the serving record: Params, grid, dims
    handle: object = field(repr=False)
    backend: object = field(repr=False)
    ordinal: int = 0  # the device the kernels are loaded on
    # grids of at most this many blocks launch with programmatic dependent launch (the record's pdl_max_blocks
    # where the target has it, sm_90+; else 0: never)
    pdl_max_blocks: int = 0
    _call: object = field(default=None, init=False, repr=False, compare=False)  # (args, packer, streams, locate), compiled
    _packer: object = field(default=None, init=False, repr=False, compare=False)
    _positional: object = field(default=None, init=False, repr=False, compare=False)  # (typer, packer, resolve)
    _maps_ident: object = field(default=None, init=False, repr=False, compare=False)  # runtime/gemm.py's map cache key

    @property
    def param_specs(self) -> list[Param]:
        """The parameters' names, types, dtypes, roles and shapes, in ABI order."""
        return list(self.symbol.params)

    @property
    def contract(self):
        """The compiled launch contract (runtime.contract.Contract): what the keyword call checks and derives."""
        from mamba_forge.runtime.contract import contract

        return contract(self.symbol)

    @property
    def _locate(self):
        """address -> device ordinal through the backend (None when it cannot say): for arrays that do not say
        their device (a Numba array's __cuda_array_interface__ has no device)."""
        return getattr(self.backend, "pointer_device", None)

    def _compile(self):
        from mamba_forge.runtime.streams import default_stream, stream_handle

        c = self.contract
        self._call = (c.args, c.packer, default_stream, stream_handle, self._locate)
        return self._call

    def __call__(self, /, *positional, stream=None, **kwargs) -> None:
        """bind (check every argument, derive dims and grid) -> resolve the stream -> pack -> launch.

        stream: None = the tensors' framework's current stream (torch, CuPy), else the per-thread default stream;
        or a torch/CuPy stream, an object with __cuda_stream__, a mamba_forge Stream, an int handle."""
        if positional:
            raise LaunchRefused(f"{self.name} takes keyword arguments ({', '.join(self.contract.accepted)}); "
                                "for positional arguments use launch(fn, grid, block, args)")
        self._launch(kwargs, stream)

    def _launch(self, kwargs: dict, stream, null: str = "") -> None:
        """The keyword launch; `null`: the one pointer that may be None (contract.bind: the GEMM bias)."""
        args, packer, default_stream, stream_handle, locate = self._call or self._compile()
        ordinal = self.ordinal
        if not on_this_thread(ordinal):
            current_on_this_thread(self)
        values, grid, block, smem, owner = args(kwargs, ordinal, locate, null)  # every check (contract.bind's)
        handle = default_stream(owner, ordinal) if stream is None else stream_handle(stream)  # streams.resolve_stream
        params = packer.fill(values)
        try:
            pdl = self.pdl_max_blocks
            if pdl and grid[0] * grid[1] * grid[2] <= pdl:
                self.backend.launch(self.handle, grid, block, params, smem, handle, pdl=True)
            else:
                self.backend.launch(self.handle, grid, block, params, smem, handle)
        finally:
            packer.release(params)  # the driver copied the parameters when it enqueued the launch

    def _compile_positional(self):
        from mamba_forge.runtime.args import positional_typer
        from mamba_forge.runtime.streams import resolve_stream

        self._positional = (positional_typer(self.symbol.params, self._locate), self.packer(), resolve_stream)
        return self._positional

    def packer(self):
        """The parameter packer of this symbol's layout (the positional path's; the contract has its own)."""
        if self._packer is None:
            from mamba_forge.runtime.args import param_packer

            self._packer = param_packer(self.symbol.params)
        return self._packer


def _dims(v, what: str) -> tuple[int, int, int]:
    if type(v) is tuple and len(v) == 3:  # the common spelling, checked inline
        x, y, z = v
        if type(x) is int and type(y) is int and type(z) is int and x >= 1 and y >= 1 and z >= 1:
            return v
    t = (v,) if isinstance(v, int) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, int) and not isinstance(x, bool) for x in t):
        raise LaunchRefused(f"{what} must be 1 to 3 integers, got {v!r}")
    t = t + (1,) * (3 - len(t))
    if any(x < 1 for x in t):
        raise LaunchRefused(f"{what} {t} has a dimension below 1")
    return t  # type: ignore[return-value]


def _owner(args: Sequence) -> str:
    """The framework of the first tensor argument ('' when every argument is a number or bytes)."""
    for a in args:
        if not isinstance(a, (int, float, bytes, bytearray, memoryview)):
            return type(a).__module__.partition(".")[0]
    return ""


_THREAD = threading.local()  # the device whose context this thread made current (current_on_this_thread)


def on_this_thread(ordinal: int) -> bool:
    """Whether this thread already made device `ordinal`'s context current (current_on_this_thread)."""
    return getattr(_THREAD, "ordinal", None) == ordinal


def current_on_this_thread(fn: Kernel) -> None:
    """Make fn's device context current on the calling thread, once per thread and device. The loader makes it
    current on the thread that loads; a launch from another thread (torch's autograd engine runs backward on a
    thread of its own, where a backward that starts with our kernels finds no current context: the driver answers
    CUDA_ERROR_INVALID_CONTEXT) makes it current there first."""
    activate = getattr(fn.backend, "activate", None)
    if activate is not None:
        activate(fn.ordinal)
    _THREAD.ordinal = fn.ordinal


def launch(fn: Kernel, grid, block, args: Sequence, shared_mem: int | None = None, stream=None) -> None:
    """Launch a loaded kernel positionally (the power user's path: you compute the grid; int addresses pass
    unchecked). Arguments are typed by the symbol's Param records (args.positional_typer: typed_params' checks,
    compiled once per kernel); the block must be the
    qualified one, and dynamic shared memory the qualified figure (None: that figure). stream: as the keyword call's
    (None: the tensors' framework's current stream, else the per-thread default stream, never legacy 0)."""
    if not isinstance(fn, Kernel):
        raise LaunchRefused(f"launch takes a Kernel from Kernels.function(), not {type(fn).__name__}")
    g, b = _dims(grid, "grid"), _dims(block, "block")
    if g[0] > GRID_LIMITS[0] or g[1] > GRID_LIMITS[1] or g[2] > GRID_LIMITS[2]:
        raise LaunchRefused(f"grid {g} exceeds the CUDA limits {GRID_LIMITS}")
    if b != fn.block:
        raise LaunchRefused(f"{fn.name} was qualified with block {fn.block}; block {b} was not")
    if fn.max_threads and b[0] * b[1] * b[2] > fn.max_threads:
        raise LaunchRefused(f"block {b} exceeds {fn.name}'s {fn.max_threads} threads")
    if shared_mem is None:
        shared_mem = fn.dynamic_smem
    if not isinstance(shared_mem, int) or isinstance(shared_mem, bool) or shared_mem != fn.dynamic_smem:
        raise LaunchRefused(
            f"{fn.name} was qualified with {fn.dynamic_smem} bytes of dynamic shared memory; {shared_mem!r} was asked"
        )
    if type(args) is not list and type(args) is not tuple:
        args = list(args)
    if not fn.params and args:
        raise LaunchRefused(f"{fn.name} has no recorded parameter layout, so its arguments cannot be typed")
    if not on_this_thread(fn.ordinal):
        current_on_this_thread(fn)
    typed, packer, resolve = fn._positional or fn._compile_positional()
    values = typed(args, fn.name, fn.ordinal)
    handle = resolve(stream, _owner(args), fn.ordinal)
    params = packer.fill(values)
    try:
        if fn.pdl_max_blocks and g[0] * g[1] * g[2] <= fn.pdl_max_blocks:  # as the keyword call decides
            fn.backend.launch(fn.handle, g, b, params, shared_mem, handle, pdl=True)
        else:
            fn.backend.launch(fn.handle, g, b, params, shared_mem, handle)
    finally:
        packer.release(params)  # the driver copied the parameters when it enqueued the launch
