"""The Autograd dispatch-key kernel of the differentiable torch ops (runtime/torch.py registers one per op with a
formula): what ``torch.library.register_autograd`` registers, with a shorter no-grad path.

torch's generated kernel (torch/_library/autograd.py) answers a call that records no graph by re-entering the
dispatcher below autograd (``op.redispatch``), which boxes the arguments again and calls the op's Python
implementation a second time through C++. Where nothing sits between autograd and the backend (no Python mode or
tensor subclass: fake tensors, FunctionalTensor, a TorchDispatchMode; no functionalisation), the key the dispatcher
would reach next is the backend's, whose kernel is the op's own Python implementation: this kernel calls that
implementation directly, with or without a graph to record (the autograd.Function's forward too). Every other case
(torch.compile's tracing, a mode, a subclass) redispatches exactly as torch's kernel does, and a call that records a
graph runs the formula through an autograd.Function as torch's does.
Measured on the CPU machine (scripts/bench_torch_dispatch_cpu.py, thread CPU time): the dispatch around a no-grad
call's implementation 27.7 us with register_autograd's kernel, 13.0 with this one (8.7 with no autograd kernel).
"""

from __future__ import annotations

import torch

_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_AD_INPLACE_OR_VIEW = torch._C.DispatchKey.ADInplaceOrView  # a fallthrough for functional ops, in every tensor's set
# backend keys whose kernel for these ops is the op's own Python implementation (torch.py's implement_for: "CUDA";
# tests/torch_standins.py adds "CPU" when it registers the implementations for CPU tensors)
_direct_keys: set = set()
# a call's keyset (raw_repr) -> whether the key below autograd is in _direct_keys: a decode step asks with one keyset
# every call, and the answer costs a few pybind calls (~3 us on the CPU) where the lookup costs one
_direct_memo: dict[int, bool] = {}
DIRECT_MEMO_ENTRIES = 64  # keysets remembered; past it the memo starts again (a call never depends on it)


def serve_directly(key, on: bool = True) -> None:
    """Add (or with on=False remove) a backend dispatch key whose kernel is the ops' Python implementation."""
    if on:
        _direct_keys.add(key)
    else:
        _direct_keys.discard(key)
    _direct_memo.clear()


def served_directly() -> frozenset:
    return frozenset(_direct_keys)


def _goes_direct(keyset) -> bool:
    """Whether the dispatcher's next kernel below autograd for `keyset` is a backend's in _direct_keys (no Python
    key, mode or functionalisation between; ADInplaceOrView is a fallthrough for these ops)."""
    raw = keyset.raw_repr()
    hit = _direct_memo.get(raw)
    if hit is None:
        hit = (keyset & _AFTER_AUTOGRAD).remove(_AD_INPLACE_OR_VIEW).highestPriorityTypeId() in _direct_keys
        if len(_direct_memo) >= DIRECT_MEMO_ENTRIES:
            _direct_memo.clear()
        _direct_memo[raw] = hit
    return hit


def _defaults(op) -> tuple:
    """Each argument's schema default, in order (None where it has none): the dispatcher drops trailing arguments
    equal to their defaults before a Python kernel sees them, and the formulas read every input."""
    return tuple(a.default_value if a.has_default_value() else None for a in op._schema.arguments)


def autograd_kernel(op, impl, setup_context, backward):
    """The Autograd-key kernel of `op` (an OpOverload) whose backend implementation is `impl`:
    ``setup_context(ctx, inputs, output)`` and ``backward(ctx, *grads)`` as register_autograd takes them."""
    defaults = _defaults(op)
    n_args = len(defaults)

    def below_autograd(keyset, args):
        if _goes_direct(keyset):
            return impl(*args)  # what the redispatch would reach, without the second trip through the dispatcher
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & _AFTER_AUTOGRAD, *args)

    def forward(ctx, *args):  # grad mode is off in an autograd.Function's forward
        keyset = args[-1]
        args = args[:-1]
        output = below_autograd(keyset, args)
        setup_context(ctx, args + defaults[len(args):], output)
        return output

    def grad(ctx, *grads):
        needs = ctx.needs_input_grad
        given = len(needs) - 1  # the last argument is the keyset, no input of the op
        # the formula sees every argument of the schema: those the dispatcher dropped (defaults) need no gradient
        ctx.needs_input_grad = needs[:given] + (False,) * (n_args - given)
        try:
            result = backward(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs
        result = result if isinstance(result, tuple) else (result,)
        return (*result[:given], None)

    name = f"AutogradFor_{op._namespace}_{op._opname}_{op._overloadname}"
    function = type(name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward": staticmethod(grad)})

    def kernel(keyset, *args):
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return function.apply(*args, keyset)
        return below_autograd(keyset, args)

    kernel.__name__ = f"autograd_{op._opname}"
    return kernel


def empty_aware(impl, fake):
    """`impl` that answers a call with an empty tensor argument without a launch (a kernel's grid or pointer checks
    refuse zero elements): the fake implementation's outputs, zero-filled, which is each op's result over nothing
    (an empty output; a sum over no rows or timesteps, e.g. a weight gradient or a scan's last state, is 0); an
    argument updated in place is left as it is."""

    def run(*args, **kwargs):
        if any(isinstance(a, torch.Tensor) and a.numel() == 0 for a in args):
            out = fake(*args, **kwargs)
            for t in out if isinstance(out, tuple) else (out,):
                t.zero_()
            return out
        return impl(*args, **kwargs)

    run.__name__ = getattr(impl, "__name__", "op")
    return run


__all__ = ["DIRECT_MEMO_ENTRIES", "autograd_kernel", "empty_aware", "serve_directly", "served_directly"]
