"""The launch contract's memo (the host fast path of Contract.args): the per-call reading of a call's arguments,
compiled once per contract into one straight-line function, the memo of evaluated launches keyed by what fixes them
(device, element counts, dim-carrying scalars), and the quick address check of a repeat call. Contract
(runtime/contract.py) holds the full check that decides every first call and every call the memo does not take."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from mamba_forge.runtime.args import INT_RANGES
from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.tensors import TORCH_DTYPE_TOKENS
from mamba_forge.runtime.tensors import TORCH_TYPES as _TORCH_TYPES

if TYPE_CHECKING:
    from mamba_forge.runtime.contract_at import Bound

_MISSING = object()
_PTR, _BLOB, _GIVEN, _DIM_SOURCE, _DERIVED = range(5)  # how a parameter is bound (below _DIM_SOURCE: required)
# the memo's per-call slots (Contract._fast): a pointer, a blob, a caller int or float (read per call, never keyed),
# an int that is part of the key (a dim's scalar, a derived scalar given by the caller, a dim's own argument)
_F_PTR, _F_BLOB, _F_INT, _F_FLOAT, _F_KEYED, _F_OWN = range(6)
_F32_MAX = 3.4028234663852886e38
MEMO_ENTRIES = 128  # evaluated launches remembered per contract, least recently used out first
_lock = threading.Lock()  # the memos' and runtime.contract's cache of compiled contracts

# no allocation lies in the first 64 KiB of the address space: a pointer there is a null one or a view of a freed
# storage (storage.resize_(0) leaves data_ptr = storage_offset * element size)
NULL_PAGE = 1 << 16


def null_pointer(pname: str, symbol: str, ptr: int) -> str:
    """The refusal of a pointer below NULL_PAGE (not the contract's `null` parameter)."""
    if ptr == 0:
        return f"{pname} of {symbol}: its data pointer is 0 (a null or freed tensor)"
    return (f"{pname} of {symbol}: its data pointer is {ptr:#x}, in the first 64 KiB (a null or freed tensor: a view "
            "of a storage resized to 0)")


def _plain(b: Bound) -> tuple:
    return [v for _, v in b.values], b.grid, b.block, b.shared_mem, b.owner


class LaunchMemo:
    """Contract's memoized path (a mixin: the contract's plan, _bind and _refuse_overlaps are Contract's)."""

    def _fast_plan(self) -> tuple[tuple | None, tuple[int, ...]]:
        """The memo's per-call reading of the arguments (see args), and where each pointer's element count sits in
        the key (in _ptr_slots order). None where a float carries or derives a dim (-0.0 == 0.0: never a key)."""
        fast, at, ptr_at = [], 3, {}  # the key starts with (device, null, number of arguments)
        for i, (pname, how, ptype, extra, j, _) in enumerate(self._plan):
            if how == _PTR:
                ptr_at[i] = at
                fast.append((i, pname, _F_PTR, ptype, 0, 0))
            elif how == _BLOB:
                fast.append((i, pname, _F_BLOB, extra, 0, 0))
                continue
            elif how == _GIVEN:  # read per call, checked inline as scalar_value would pass it; never keyed
                if j is not None:
                    fast.append((i, pname, _F_INT, "", j[0], j[1]))
                else:
                    lim = _F32_MAX if ptype == "f32" else float("inf")
                    fast.append((i, pname, _F_FLOAT, "", -lim, lim))
                continue
            elif ptype not in INT_RANGES:
                return None, ()
            else:
                fast.append((i, pname, _F_KEYED, "", 0, 0))
            at += 1
        fast += [(-1, d, _F_OWN, "", 0, 0) for _, d, own, _, _ in self._dim_plan if own]
        return tuple(fast), tuple(ptr_at[i] for i, *_ in self._ptr_slots)

    def args(self, kwargs: dict, device: int = 0, locate=None, null: str = "") -> tuple:
        """bind's launch as (plain values in parameter order, grid, block, shared_mem, owner): what the loader packs.

        The memo: a call whose pointers are all torch tensors that pass the tensor checks here (CUDA, this device,
        the dtype, dense; or None for `null`), whose blobs are bytes of the exact size and whose scalars are ints
        (caller floats: floats within the type) is keyed by (device, null, the number of arguments, each pointer's
        element count, each dim-carrying or derived scalar and dim argument, or its absence). Everything bind derives
        and checks from those (dims, the expressions, grid, sizes, scalar ranges, derived values, unknown or missing
        arguments) is a function of the key: the first call with a key runs the full check (_bind) and remembers its
        result; a later one takes it and checks only what the key leaves out, per call: each tensor's checks above
        (read here), the caller scalars' types and ranges, the blobs' sizes, and the addresses (no null pointer, no
        overlap: _check_pointers). Any other argument (a CuPy or DLPack array, a numpy int, a bytearray) runs the
        full check every call. MEMO_ENTRIES keys per contract, least recently used out first."""
        read = self._read
        got = read(kwargs, device, null) if read is not None else None
        if got is None:  # not a memo call: the full check, every time
            return _plain(self._bind(kwargs, device, locate, null))
        key, vals = got
        memo = self._memo
        hit = memo.get(key)
        if hit is None:
            return self._remember(key, vals, self._bind(kwargs, device, locate, null))
        try:
            memo.move_to_end(key)
        except KeyError:  # evicted by another thread since
            pass
        fill, lengths, spans, grid, block, smem, owner = hit
        for i, v in fill:
            vals[i] = v
        if not self._quick(vals, lengths, null):  # a zero address (but `null`'s), or an output meeting another
            self._check_pointers(vals, spans, null)
        return vals, grid, block, smem, owner

    def _remember(self, key: tuple, vals: list, b: Bound) -> tuple:
        """The memo entry of a key from its first call's full bind: the values the key fixes, the pointers' byte
        lengths (from the element counts in the key), grid, block, shared memory and owner."""
        plain = [v for _, v in b.values]
        if any(w is not None and (type(w) is not type(p) or w != p) for w, p in zip(vals, plain)):  # noqa: B905
            return plain, b.grid, b.block, b.shared_mem, b.owner  # never: what is read per call is what bind packs
        fill = tuple((i, p) for i, (w, p) in enumerate(zip(vals, plain)) if w is None)  # noqa: B905
        spans = tuple((i, max(key[at], 0) * size, writes, pname, size)
                      for (i, _, writes, size, pname), at in zip(self._ptr_slots, self._ptr_key_at))  # noqa: B905
        lengths = tuple(length for _, length, *_ in spans)
        memo = self._memo
        with _lock:
            memo[key] = (fill, lengths, spans, b.grid, b.block, b.shared_mem, b.owner)
            while len(memo) > MEMO_ENTRIES:
                memo.popitem(last=False)
        return plain, b.grid, b.block, b.shared_mem, b.owner

    def _check_pointers(self, vals: list, spans: tuple, null: str) -> None:
        """_check_memory on a memo call: the same rules, from the addresses and the entry's byte lengths, decided by
        the same _refuse_overlaps (an output exactly an input binds only where it declares that input, in_place_of)."""
        out = []
        for i, length, writes, pname, size in spans:
            ptr = vals[i]
            if ptr < NULL_PAGE:
                if ptr == 0 and pname == null:
                    continue
                raise LaunchRefused(null_pointer(pname, self.symbol, ptr))
            out.append((ptr, ptr + length, writes, pname, size))
        if len(out) > 1:
            self._refuse_overlaps(out)


def _compile_reader(symbol: str, fast: tuple, nparams: int):
    """Contract.args's per-call reading, compiled for one contract from its plan (names as string literals, numbers
    as constants): reader(kwargs, device, null) -> (the memo key, the values read, None where the entry fills in),
    or None for a call the memo does not take (see args). One straight-line function, no loop over the plan."""
    ns: dict = {"__builtins__": {}, "_M": _MISSING, "_TT": _TORCH_TYPES, "_TOK": TORCH_DTYPE_TOKENS.get,
                "type": type, "len": len, "bytes": bytes, "int": int, "float": float}
    lines, key, vals = ["def _read(kwargs, device, null):", "    get = kwargs.get"], ["device", "null", "len(kwargs)"], \
        ["None"] * nparams
    for k, (i, pname, how, t, lo, hi) in enumerate(fast):
        name = repr(str(pname))
        if how == _F_PTR:
            lines += [f"    v = get({name}, _M)",
                      f"    if type(v) in _TT and v.is_cuda and _TOK(v.dtype) == {str(t)!r} and v.get_device() == device "
                      "and v.is_contiguous():",
                      f"        a{i} = v.data_ptr()", f"        n{i} = v.numel()",
                      f"    elif v is None and null == {name}:", f"        a{i} = 0", f"        n{i} = -1",
                      "    else:", "        return None"]
            vals[i] = f"a{i}"
            key.append(f"n{i}")
        elif how == _F_BLOB:
            lines += [f"    a{i} = get({name}, _M)", f"    if type(a{i}) is not bytes or len(a{i}) != {int(t)}:",
                      "        return None"]
            vals[i] = f"a{i}"
        elif how in (_F_INT, _F_FLOAT):
            ns[f"_lo{k}"], ns[f"_hi{k}"] = lo, hi
            lines += [f"    a{i} = get({name}, _M)",
                      f"    if type(a{i}) is not {'int' if how == _F_INT else 'float'} or not _lo{k} <= a{i} <= _hi{k}:",
                      "        return None"]
            vals[i] = f"a{i}"
        elif how == _F_KEYED:
            lines += [f"    k{k} = get({name}, _M)", f"    if type(k{k}) is int:", f"        a{i} = k{k}",
                      f"    elif k{k} is _M:", f"        a{i} = None", "    else:", "        return None"]
            vals[i] = f"a{i}"
            key.append(f"k{k}")
        else:  # _F_OWN: a dim's own argument, keyed only
            lines += [f"    k{k} = get({name}, _M)", f"    if type(k{k}) is not int and k{k} is not _M:",
                      "        return None"]
            key.append(f"k{k}")
    lines.append(f"    return ({', '.join(key)},), [{', '.join(vals)}]")
    exec(compile("\n".join(lines) + "\n", f"<contract reader {symbol}>", "exec"), ns)  # noqa: S102 - literals only
    return ns["_read"]


def _compile_quick(symbol: str, ptr_slots: tuple):
    """quick(values, lengths, null) -> True when no pointer but `null`'s (0) is below NULL_PAGE and every output's bytes are apart from
    every other pointer's (then _check_memory's sweep finds nothing: it skips the null pointer and only looks at
    spans that meet); False sends the call to the full pointer check, which decides (a declared in-place pair, an
    undeclared exact alias, empty tensors)."""
    n = len(ptr_slots)
    lines = ["def _quick(v, L, null):"]
    lines += [f"    p{k} = v[{i}]" for k, (i, *_) in enumerate(ptr_slots)]
    if n:  # 0 only for the `null` parameter (its length is 0 where it is None: it meets nothing)
        lines += [f"    if not ({' and '.join(f'p{k} >= {NULL_PAGE}' for k in range(n))}):",
                  f"        if {' or '.join(f'((p{k} or null != {str(pname)!r}) and p{k} < {NULL_PAGE})' for k, (*_, pname) in enumerate(ptr_slots))}:",
                  "            return False"]
    lines += [f"    e{k} = p{k} + L[{k}]" for k in range(n)]
    pairs = [f"(p{b} < e{a} and p{a} < e{b})" for a in range(n) for b in range(n)
             if a != b and ptr_slots[a][2] and (not ptr_slots[b][2] or a < b)]
    lines.append(f"    return not ({' or '.join(pairs)})" if pairs else "    return True")
    ns: dict = {"__builtins__": {}}
    exec(compile("\n".join(lines) + "\n", f"<contract pointers {symbol}>", "exec"), ns)  # noqa: S102 - no names
    return ns["_quick"]

