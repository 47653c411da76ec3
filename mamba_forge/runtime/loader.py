"""The runtime loader: signed, qualified kernels in milliseconds, with nothing loaded after a failed check.

    kernels = load("h200.tar.gz", device=0)                  # verify signature, device, artifacts
    kernels.softplus_forward.bf16(y=y, x=x)                  # checked keyword launch: n and the grid derived
    kernels.fn("gemm_bi_nn_tc", "bf16", tile="tc64")(C=c, A=a, B=b, M=m, N=n, K=k)  # a tile, by name
    launch(kernels.function("softplus_forward_bf16"), grid, block, (y, x, n))   # positional, for power users

Order of checks in :func:`load`: signature against trusted keys (canonical table), the runtime table the signed
body names (size and sha256; the manifest's TOML is read past its top-level keys only on the first load of those
bytes on this machine, which proves the table is the body's projection: runtime/memo.py), layout and expiry,
every artifact's presence and size (and completeness of a bundle), then the device: model name, compute
capability, SM count, and a driver whose CUDA major is at least the qualifying one. Cubins load lazily, on the
first function taken from them, from bytes whose size and sha256 are checked right before cuModuleLoadData.
At load, one logging warning (logger "mamba_forge.runtime") lists the family variants that do not serve here and
why; Kernels.summary() returns it as data; load(strict=True) raises IncompleteOnDevice instead. The keyword launch
(runtime/contract.py, runtime/streams.py, gpu/launcher.py) is imported on a kernel's first keyword call.
Kernel (a loaded symbol's keyword call) and the positional launch() are runtime/kernel.py's, re-exported here.
Standard library, cryptography and cuda-bindings only (through mamba_forge.runtime.signing and mamba_forge.gpu.driver).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from mamba_forge.core.schema import QArtifact, QDevice, RuntimeSymbol
from mamba_forge.core.vocab import PDL_MIN_CC, DeviceInfo
from mamba_forge.runtime.backend import CudaBackend
from mamba_forge.runtime.errors import (
    DeviceMismatch,
    FamilyUnavailable,
    IncompleteOnDevice,
    SymbolUnavailable,
)
from mamba_forge.runtime.families import LoadSummary, Typed, index_families, summarize
from mamba_forge.runtime.kernel import GRID_LIMITS, Kernel, launch  # noqa: F401  (re-exported: the loaded kernel, runtime/kernel.py)
from mamba_forge.runtime.sources import Source, check_artifact_bytes
from mamba_forge.runtime.trust import trusted_keys as collect_keys
from mamba_forge.runtime.verify import Verified, open_verified

if TYPE_CHECKING:
    from mamba_forge.runtime.trust import KeySpec

# What every load() needs is imported with this module (taking `load` from mamba_forge.runtime): cryptography's
# Ed25519 (through trust and runtime.signing) and logging (the load summary's warning). Deferring them into
# load() would only move their ~15 ms from the import (budget 80 ms) into the load (budget 100 ms).
log = logging.getLogger("mamba_forge.runtime")

_gemm = None  # mamba_forge.runtime.gemm.gemm, imported on the first Kernels.gemm call (not per call)


def _import_gemm():
    global _gemm
    from mamba_forge.runtime.gemm import gemm

    _gemm = gemm
    return gemm


class Kernels:
    """The admitted symbols of one verified manifest on one device; cubins load on first use."""

    def __init__(self, verified: Verified, device: DeviceInfo, backend, *, pdl: bool = True):
        self.verified, self.device, self.backend = verified, device, backend
        self.pdl = pdl  # load(pdl=False): no launch with programmatic dependent launch
        self.manifest = verified.manifest  # a RuntimeTable, or the whole QualifiedManifest when none was signed
        self._lock = threading.Lock()
        self._artifacts: dict[tuple[str, str], QArtifact] = {
            (a.module, a.target): a for a in self.manifest.artifacts if a.code == "cubin"}
        self._symbols: dict[str, RuntimeSymbol] = {}  # type: ignore[valid-type]
        for s in self.manifest.symbols:
            have = self._symbols.get(s.name)
            if have is None or (have.status != "admitted" and self._serves(s)):
                self._symbols[s.name] = s  # a serving record wins over a rejected/checked one
        self._modules: dict[str, object] = {}
        self._functions: dict[str, Kernel] = {}
        self._gemm_routes: dict[tuple, tuple] = {}  # runtime/gemm.py: (M, N, K, dtypes, layout, ...) -> (route, Kernel)
        self._gemm_calls: OrderedDict[tuple, tuple] = OrderedDict()  # runtime/gemm.py: operands' dtypes, shapes -> rung
        self._reported: set[str] = set()
        self.fallbacks: dict[str, str] = {}  # requested -> serving symbol, once followed
        self._families = index_families(self._symbols.values())
        self._summary: LoadSummary | None = None

    def summary(self) -> LoadSummary:
        """What serves on this device: families available, variants unavailable with reasons, fallbacks in effect,
        and the GEMM route rungs skipped (rejected here: their classes' other rungs serve instead)."""
        if self._summary is None:
            from mamba_forge.runtime.routes import skipped

            s = summarize(self.device.name, self._families, self._symbols, self._serves)
            self._summary = s._replace(skipped_rungs=skipped(self.manifest.routes, self._serves_name))
        return self._summary

    def gemm_route(self, m: int, n: int, k: int, a: str, b: str | None = None, c: str | None = None,
                   layout: str = "nn", *, bias: bool = False, symbol: str | None = None):
        """The GEMM rung that serves C = op(A) op(B) at (M, N, K) here (mamba_forge.runtime.routes.select):
        the class is chosen from (N, K, bias) alone and the rung within it by M, so rows are bit-identical for
        every M. `symbol=` asks for one rung by name (force rungs serve only so). Returns a routes.Route."""
        from mamba_forge.runtime.routes import select

        return select(self.manifest.routes, m, n, k, a, b or a, c or (b or a), layout, bias=bias, symbol=symbol,
                      serves=self._serves_name)

    def gemm(self, A, B, out=None, *, bias=None, layout: str = "nn", math: str | None = None,
             symbol: str | None = None, stream=None):
        """C = op(A) op(B) (+ bias) through the rung gemm_route picks (mamba_forge.runtime.gemm): shapes give
        M, N, K; the rung's tensor maps are built as it was qualified; bias may be None. Returns C."""
        return (_gemm or _import_gemm())(self, A, B, out, bias=bias, layout=layout, math=math, symbol=symbol,
                                         stream=stream)

    def gemm_reads_a_in_place(self, A, B, *, bias=None, layout: str = "nn") -> bool:
        """Whether gemm(A, B, bias=bias, layout=layout) takes this A as it lies: row-major dense, or a torch A whose
        rows are dense with a row stride (lda > K) that the serving rung reads through its tensor map
        (mamba_forge.runtime.gemm.reads_a_in_place). False: pass A.contiguous() (gemm never copies it)."""
        from mamba_forge.runtime.gemm import reads_a_in_place

        return reads_a_in_place(self, A, B, bias=bias, layout=layout)

    def _serves_name(self, name: str) -> bool:
        s = self._symbols.get(name)
        return s is not None and self._serves(s)

    def __getattr__(self, family: str) -> Typed:
        """kernels.<family>: the family holder (methods and attributes of Kernels win over family names)."""
        fams = self.__dict__.get("_families")
        if family.startswith("_") or fams is None:
            raise AttributeError(family)
        if family not in fams:
            raise FamilyUnavailable(family, f"no family {family} in the manifest qualified on {self.device.name}",
                                    reason="absent", check="absent")
        return self.typed(family)

    def fn(self, family: str, dtype: str | None = None, *, tile: str | None = None) -> Kernel:
        """A family's kernel by dtype (None: the family's only dtype) and, for multi-tile variants, tile name."""
        t = self.typed(family)
        if dtype is None:
            if len(t.dtypes) != 1:
                raise SymbolUnavailable(family, f"family {family} has several dtypes; name one: {', '.join(t.dtypes)}")
            dtype = t.dtypes[0]
        return t.get(dtype, tile)

    # ---- what is there ----
    def _serves(self, s: RuntimeSymbol) -> bool:  # type: ignore[valid-type]
        art = self._artifacts.get((s.module, s.target))
        return s.status == "admitted" and art is not None and art.role == "qualify"

    def admitted(self) -> list[str]:
        """Names of the symbols that serve on this device."""
        return [n for n, s in self._symbols.items() if self._serves(s)]

    def symbol(self, name: str) -> RuntimeSymbol:  # type: ignore[valid-type]
        """The manifest's record of a symbol (any status); raises SymbolUnavailable when absent."""
        s = self._symbols.get(name)
        if s is None:
            raise SymbolUnavailable(name, f"{name} is not in the manifest qualified on {self.device.name}",
                                    reason="absent", check="absent")
        return s

    def _why_not(self, name: str) -> SymbolUnavailable:
        s = self._symbols.get(name)
        if s is None:
            return SymbolUnavailable(name, f"{name} is not in the manifest qualified on {self.device.name}",
                                     reason="absent", check="absent")
        reason, check = s.reason, s.check
        if s.status == "admitted":  # admitted but from a check-only artifact
            return SymbolUnavailable(
                name, f"{name} was built for {s.target} only to check arithmetic on this GPU, not qualified to serve",
                reason=reason or "check-only artifact", check=check or "role",
            )
        why = reason or f"status {s.status} with no recorded reason"
        return SymbolUnavailable(name, f"{name} is {s.status} on {self.device.name}: {why}"
                                 + (f" (check: {check})" if check else ""), reason=why, check=check)

    # ---- functions ----
    def function(self, name: str, *, follow_fallback: bool = True) -> Kernel:
        """The loaded kernel for an admitted symbol, or its first admitted declared fallback (reported once)."""
        k = self._functions.get(name)
        if k is not None:
            return k
        s = self._symbols.get(name)
        if s is not None and self._serves(s):
            return self._load_function(name, name)
        err = self._why_not(name)
        if not follow_fallback or s is None:
            raise err
        tried = [f"{name} ({err.reason})"]
        for fb in s.fallback:
            fs = self._symbols.get(fb)
            if fs is not None and self._serves(fs):
                k = self._load_function(fb, name)
                self._report(name, fb, err.reason)
                return k
            tried.append(f"{fb} ({self._why_not(fb).reason})")
        if len(tried) > 1:
            raise SymbolUnavailable(name, f"{name} and every declared fallback are unavailable: {'; '.join(tried)}",
                                    reason=err.reason, check=err.check)
        raise err

    def _report(self, name: str, fb: str, reason: str) -> None:
        self.fallbacks[name] = fb
        if name in self._reported:
            return
        self._reported.add(name)  # the load summary logged it; the caller is warned where it takes the kernel
        msg = f"mamba-forge: {name} is unavailable on {self.device.name} ({reason}); using its fallback {fb}"
        warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def typed(self, family: str) -> Typed:
        """The family's variants by dtype, each with its tiles (served directly or through a fallback)."""
        tiles = self._families.get(family)
        if not tiles:
            raise SymbolUnavailable(family, f"family {family} has no symbols in the manifest qualified on {self.device.name}")
        return Typed(self, family, tiles)

    def _load_function(self, name: str, requested: str) -> Kernel:
        with self._lock:
            key = requested
            if key in self._functions:
                return self._functions[key]
            if name in self._functions and name != requested:
                k = self._functions[name]
            else:
                s = self._symbols[name]
                module = self._module(s)
                handle = self.backend.get_function(module, name)
                smem = s.dynamic_smem
                # explicit, always: the qualified limit, even when it is under the 48 KB default
                self.backend.set_max_dynamic_smem(handle, smem)
                block = (*s.block, 1, 1, 1)
                k = Kernel(
                    name=name, requested=name, module=s.module, target=s.target, family=s.family, dtype=s.dtype,
                    block=block[:3], dynamic_smem=smem, params=s.params_layout(), symbol=s,
                    max_threads=s.resources.max_threads if s.resources else 0, handle=handle, backend=self.backend,
                    ordinal=self.device.ordinal, pdl_max_blocks=pdl_blocks(s, self.device) if self.pdl else 0,
                )
                self._functions[name] = k
            if requested != name:
                k = replace(k, requested=requested)
                self._functions[requested] = k
            return k

    def _module(self, s: RuntimeSymbol):  # type: ignore[valid-type]
        art = self._artifacts[(s.module, s.target)]
        mod = self._modules.get(art.path)
        if mod is None:
            src: Source = self.verified.source
            data = check_artifact_bytes(art, src.read(art.path), src)  # the exact bytes handed to the driver
            mod = self.backend.load_module(data)
            self._modules[art.path] = mod
        return mod

    def load_all(self) -> int:
        """Load every admitted symbol now (the cold-start path); returns the number of modules loaded."""
        for n in self.admitted():
            self.function(n, follow_fallback=False)
        return len(self._modules)

    @property
    def loaded_modules(self) -> list[str]:
        return list(self._modules)


def pdl_blocks(s: RuntimeSymbol, dev: DeviceInfo) -> int:  # type: ignore[valid-type]
    """The grid size up to which `s` launches with programmatic dependent launch on `dev`: the record's
    pdl_max_blocks where the device has PDL, else 0 (never)."""
    return s.pdl_max_blocks if tuple(dev.cc) >= PDL_MIN_CC else 0


def check_device(want: QDevice, dev: DeviceInfo, what: str) -> None:
    """Refuse a manifest qualified for another model, compute capability, SM count or a newer CUDA major."""
    if dev.name != want.name:
        raise DeviceMismatch(f"{what} was qualified on {want.name}, but device {dev.ordinal} is {dev.name}")
    if dev.cc_text != want.cc:
        raise DeviceMismatch(f"{what} was qualified for compute capability {want.cc}, but device {dev.ordinal} has {dev.cc_text}")
    if dev.sm_count != want.sm_count:
        raise DeviceMismatch(f"{what} was qualified on {want.sm_count} SMs, but device {dev.ordinal} has {dev.sm_count}")
    if dev.driver_version // 1000 < want.driver_version // 1000:
        raise DeviceMismatch(
            f"{what} was qualified with CUDA {want.driver_version // 1000} driver {want.driver_version}, but device "
            f"{dev.ordinal}'s driver is {dev.driver_version}; update the driver"
        )


def load(manifest_or_bundle: str | Path, device: int = 0, trusted_keys: Iterable[KeySpec] | Mapping | None = None, *,
         default_keys: bool = True, build: str | Path | None = None, backend=None, now: datetime | None = None,
         strict: bool = False, pdl: bool = True) -> Kernels:
    """Verify and open a signed qualified manifest, bundle (.tar.gz or folder) or release index for a device.

    trusted_keys: public keys (objects, 'ed25519 <base64>' text, files or folders of *.pub) trusted besides the
    shipped release keys and the user's trust folder (`default_keys=False` trusts only these). build: where a
    bare manifest's artifacts are (default: its folder). Raises a LoadError subclass; loads nothing on refusal.
    Logs one warning listing the family variants that do not serve here (Kernels.summary() has it as data);
    strict=True raises IncompleteOnDevice instead when a kernel qualified for this device is rejected or cannot
    serve (checked-only and built-only symbols belong to other GPUs and do not count). pdl=False: never launch
    with programmatic dependent launch, even where a record allows it (its kernels still wait; nothing changes but
    when a launch may start), e.g. to rule it out while debugging.
    """
    if type(pdl) is not bool:
        raise TypeError(f"load(pdl=...) takes True or False, not {pdl!r}")
    keys = collect_keys(trusted_keys, defaults=default_keys)
    backend = backend or CudaBackend()
    seen: list[DeviceInfo] = []

    def device_key() -> tuple[str, str, int]:  # asked only by an index, after the index verified
        seen.append(backend.device_info(device))
        return seen[0].name, seen[0].cc_text, seen[0].sm_count

    v = open_verified(manifest_or_bundle, keys=keys, build=build, hash_all=False, follow_index=False, now=now,
                      full_body=False, device=device_key, missing_hint="pass build= (the --out folder of `mamba-forge "
                      "build`) or load a bundle")
    dev = seen[0] if seen else backend.device_info(device)
    check_device(v.manifest.device, dev, str(v.path))
    kernels = Kernels(v, dev, backend, pdl=pdl)
    summary = kernels.summary()
    if strict and summary.strict_problems:
        raise IncompleteOnDevice(f"{v.path} (strict): {len(summary.strict_problems)} kernels do not serve on "
                                 f"{dev.name}: {'; '.join(summary.strict_problems)}", summary)
    backend.activate(device)
    if summary.unavailable or summary.fallbacks or summary.skipped_rungs:
        log.warning("%s", summary.text())
    return kernels
