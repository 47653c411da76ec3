"""One symbol's qualification inside the worker (worker.py): :class:`SymbolRun` takes a loaded module's symbol
through every check of its family (exports, live admission, correctness over the corpora, split launches,
placement, determinism under perturbation, equivalence records), emitting a check event per verdict as it goes,
and returns its SymbolResult; a fault or a hang is raised for the worker to report. worker.py re-exports every
name here (``from mamba_forge.qualify.worker import SymbolRun`` still works).
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

from mamba_forge.catalog.model import Catalog
from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import checks as C
from mamba_forge.qualify import equivalence as E
from mamba_forge.qualify import guards as G
from mamba_forge.qualify import pdl as PDL
from mamba_forge.qualify import placement as P
from mamba_forge.qualify import spec as S
from mamba_forge.qualify import split as SP
from mamba_forge.qualify.budget import LaunchBudget
from mamba_forge.qualify.events import (
    CheckDone,
    CheckResult,
    Event,
    SymbolResult,
)
from mamba_forge.qualify.sanitize import TIME_FACTOR

REPEATS = {"quick": 5, "full": 50}
SANITIZE_BATCH = 97  # small launches under compute-sanitizer: the batch dim shrinks to this (odd) size


def emit(event: Event) -> None:
    sys.stdout.write(event.to_json_line())
    sys.stdout.flush()


def symbol_seed(base: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{base}:{name}".encode()).digest()[:6], "little")


class SymbolRun:
    """Qualifies one symbol; collects check records; raises CudaError/Hang for the worker to handle."""

    def __init__(self, ctx: C.Context, catalog: Catalog, module: cu.Module, job: dict, entry: dict, group: dict):
        self.ctx, self.job, self.entry, self.group, self.catalog = ctx, job, entry, group, catalog
        self.name = entry["name"]
        self.sym = catalog.symbols[self.name]
        self.fam = catalog.module(self.sym.module).family(self.sym.family)
        self.module = module
        self.seed = symbol_seed(job["seed"], self.name)
        cap = int(job.get("state_capacity", 0))  # the build's; it binds only where the module was compiled with it
        self.state_capacity = cap if cap and catalog.module(self.sym.module).module.state_capacity else 0
        self.result = SymbolResult(self.name, group["module"], group["target"], "rejected", seed=self.seed,
                                   block=list(self.sym.block), dynamic_smem=self.sym.dynamic_smem)

    def spec_at(self, dims: dict[str, int] | None = None) -> S.LaunchSpec:
        """The launch at `dims` (default: the qualification dims) through the runtime Contract of the record the
        manifest will sign: this symbol's live ABI census (once admitted) and the build's state capacity."""
        return S.evaluate(self.sym, self.fam, dims, layout=self.result.params or None,
                          state_capacity=self.state_capacity)

    @property
    def checks(self) -> list[CheckResult]:
        return self.result.checks

    def reject(self, check: str, reason: str) -> SymbolResult:
        self.result.reject(check, reason)
        return self.result

    def add(self, name: str, passed: bool, digest: str = "", detail: str = "") -> None:
        self.checks.append(CheckResult(name, passed, digest, detail))
        emit(CheckDone(self.name, name, passed))  # also tells the parent the worker is alive

    def run(self) -> SymbolResult:
        scale = float(self.job.get("time_scale", TIME_FACTOR if self.job.get("sanitize") else 1))
        if self.fam.qualify.timeout_s:  # the catalog knows this family's launches take long: it wins
            self.ctx.budget = LaunchBudget(self.fam.qualify.timeout_s, "the family's timeout_s", scale)
        elif self.ctx.timeout_s is not None:
            self.ctx.budget = LaunchBudget(self.ctx.timeout_s, "--timeout", scale)
        else:
            self.ctx.budget = LaunchBudget(scale=scale)
        try:
            fn = self.module.function(self.name)
        except cu.CudaError as exc:
            return self.reject("exports", f"{self.name}: not found in the loaded module ({exc.result})")
        adm = C.live_admit(self.ctx, fn, self.sym, self.fam, self.entry.get("build_layout"))
        self.result.resources = adm.resources
        self.result.params = adm.layout
        if not adm.ok:
            return self.reject(adm.check, adm.reason)
        self.add("admission", True, detail=f"live attributes read; ABI census from {adm.layout_source}")
        dims = None
        q = self.fam.qualify
        if self.job.get("sanitize") and q.batch_dim and q.dims.get(q.batch_dim, 0) > SANITIZE_BATCH:
            dims = {**q.dims, q.batch_dim: SANITIZE_BATCH}
        try:
            spec = self.spec_at(dims)
        except S.SpecError as exc:
            if q.skip:
                return self.reject("untested", f"{self.name}: not launched by the qualifier: {q.skip}")
            return self.reject("spec", str(exc))
        prepare = C.load_callable(q.prepare) if q.prepare else None
        rng = np.random.default_rng(self.seed)
        sanitize = bool(self.job.get("sanitize"))
        self.ctx.guards = not sanitize  # compute-sanitizer checks every access against the exact allocation
        corpora = ["uniform"] if sanitize else spec.corpora
        base_inst, base_inputs, base_outs = None, None, None
        checked: list[G.Guards] = []
        unreproduced: list[str] = []  # corpora whose poison difference the reruns did not reproduce
        try:
            for corpus in corpora:
                inputs = C.make_inputs(spec, corpus, rng, q.nonfinite)
                inst = C.Instance(self.ctx, spec, fn, inputs, prepare)
                if base_inst is None:  # the first corpus's instance is kept for the determinism checks
                    base_inst, base_inputs = inst, inputs
                if inst.guards is not None:
                    checked.append(inst.guards)
                alt = None
                try:
                    outs = inst.run()
                    if not sanitize:
                        unread, alt, reproduced = self.poison_runs(inst, spec, outs)
                        if unread and reproduced:
                            return self.fail("uninitialized", f"corpus {corpus}: {unread}")
                        if unread:
                            unreproduced.append(f"corpus {corpus}: {unread}")
                finally:
                    if inst is not base_inst:
                        inst.free()
                if inst is base_inst:
                    base_outs = outs
                try:
                    ref = C.reference_outputs(self.fam, spec, inputs)
                except Exception as exc:  # noqa: BLE001 - a broken reference is a verdict, not a crash
                    return self.reject("reference", f"{self.name}: reference {q.reference} failed: {type(exc).__name__}: {exc}")
                ok, detail = C.check_outputs(spec, outs, ref, alt)
                self.add("correctness", ok, C.digest(outs), f"corpus {corpus}: {detail}" + ("" if ref is not None else " (no reference)"))
                if not ok:
                    return self.reject("correctness", f"{self.name}: corpus {corpus}: {detail}")
            assert base_inst is not None and base_outs is not None and base_inputs is not None
            if not sanitize and unreproduced:  # not a rejection (the repeat check judges nondeterminism): said so
                self.add("uninitialized", True, detail=f"outputs differed between 0x{G.POISON:02X} and "
                                                       f"0x{G.POISON_ALT:02X} poison but the reruns did not reproduce "
                                                       f"it (nondeterministic, left to the repeat check): "
                                                       + "; ".join(unreproduced))
            elif not sanitize:
                self.add("uninitialized", True, detail=f"outputs bitwise equal with 0x{G.POISON:02X} and "
                                                       f"0x{G.POISON_ALT:02X} poison on {len(corpora)} corpora")
            pairs = {p.name: p.in_place_of for p in self.fam.params if p.in_place_of}
            if pairs and not sanitize:  # what the signed record lets an engine do: the output written over its input
                verdict = self.in_place(spec, fn, base_inputs, base_outs, prepare, pairs)
                if verdict is not None:
                    return verdict
            if self.sym.deterministic and not sanitize:
                verdict = self.determinism(spec, fn, base_inst, base_inputs, base_outs, prepare, checked)
                if verdict is None and self.fam.split is not None:  # split.py: the same bits over any split
                    verdict = SP.check(self, fn, base_inputs, prepare, checked)
                if verdict is not None:
                    return verdict
            if not sanitize and E.memberships(self.catalog, self.name):
                for rec in E.digests(self, fn, prepare, self.job["seed"]):
                    self.checks.append(rec)  # compared across the class's rungs after all workers (runner.py)
                emit(CheckDone(self.name, E.CHECK, True))
        except G.GuardViolation as exc:
            return self.fail(exc.check, exc.reason)
        finally:
            if base_inst is not None:
                base_inst.free()
        if checked:
            for name, detail in G.summary(checked).items():
                self.add(name, True, detail=detail)
        if not sanitize:  # a sanitizer pass reports only its tool's verdict (sanitize.apply_sanitizer)
            self.add("timeout", True, detail=f"every launch within its {self.ctx.budget.describe()}")
        self.result.status = "admitted"
        return self.result

    def in_place(self, spec, fn, inputs, base: dict[str, bytes], prepare,
                 pairs: dict[str, str]) -> SymbolResult | None:
        """The catalog's in_place_of pairs run as declared (each output the very buffer of its input): every
        output must be the bits of the launch on separate buffers (`base`, the first corpus's). Guards are off for
        this launch (the input is written by design); the runtime contract binds the exact alias as an engine's
        call would, so a pair it refuses is a spec error here."""
        label = ", ".join(f"{o} in place of {i}" for o, i in pairs.items())
        try:
            inst = C.Instance(self.ctx, spec, fn, inputs, prepare, alias=pairs)
        except S.SpecError as exc:
            return self.fail(C.IN_PLACE, f"{label}: {exc}")
        try:
            outs = inst.run()
        finally:
            inst.free()
        if outs != base:
            diff = C.first_difference(base, outs)
            return self.fail(C.IN_PLACE, f"{label}: the outputs differ from those on separate buffers ({diff})")
        self.add(C.IN_PLACE, True, C.digest(outs), f"{label}: bitwise equal to the launch on separate buffers")
        return None

    def fail(self, check: str, reason: str) -> SymbolResult:
        self.add(check, False, detail=reason)
        return self.reject(check, f"{self.name}: {reason}")

    def poison_independent(self, inst: C.Instance, spec: S.LaunchSpec, outs: dict[str, bytes]) -> str:
        """'' when the outputs do not depend on the poison in outputs and scratch; else the first dependent
        element. A difference counts only when a rerun with each poison reproduces that poison's outputs (a
        nondeterministic kernel is the repeat check's to reject: one rerun alone matched by chance on the H200, and
        an atomic sum was rejected as uninitialized)."""
        diff, _, reproduced = SymbolRun.poison_runs(inst, spec, outs)
        return diff if reproduced else ""

    @staticmethod
    def poison_runs(inst: C.Instance, spec: S.LaunchSpec,
                    outs: dict[str, bytes]) -> tuple[str, dict[str, bytes], bool]:
        """poison_independent's runs: (the difference, the outputs under POISON_ALT, whether both poisons' reruns
        reproduced it); run() records an unreproduced difference distinctly and hands the POISON_ALT outputs to
        check_outputs (an element left at either poison was not written)."""
        alt = inst.run(poison=G.POISON_ALT)
        diff = G.poison_difference(spec, outs, alt)
        if not diff:
            return "", alt, True
        return diff, alt, inst.run() == outs and inst.run(poison=G.POISON_ALT) == alt

    def placement(self, spec, fn, inst: C.Instance, base: dict[str, bytes], want: str) -> SymbolResult | None:
        """Its bits under other placements of its blocks (placement.py) against its first run, alone."""
        if self.ctx.placer is None:
            self.ctx.placer = P.DevicePlacer(self.ctx)
        warned = bool(self.entry.get("placement_warned"))
        reps = P.REPEATS_WARNED if warned else 1
        runs, notes = P.placements(self.ctx, self.ctx.placer, inst, fn, spec)
        ran = []
        for pl in runs:
            for i in range(reps):
                try:
                    outs = pl.run()
                except P.Unavailable as exc:
                    notes.append(f"not run {pl.label}: {exc}")
                    break
                d = C.digest(outs)
                if d != want:
                    diff = C.first_difference(base, outs)
                    run = f" (run {i + 1} of {reps})" if reps > 1 else ""
                    self.add("placement", False, d, f"{pl.label}{run}: {diff}")
                    return self.reject("placement", f"{self.name}: its bits differ {pl.label}{run} from its first run "
                                                     f"alone on the device ({diff}): they depend on where its blocks run")
            else:
                ran.append(pl.label)
        detail = "bitwise equal " + ", ".join(ran) if ran else "not run: no placement could be run"
        if warned:
            detail += f" ({reps} runs each: the build warned that it reads placement-dependent registers)"
        # nothing compared is no pass: recorded as not passed (the symbol is not rejected for it)
        self.add("placement", bool(ran), want, detail + "".join(f"; {n}" for n in notes))
        return None

    def determinism(self, spec, fn, inst: C.Instance, inputs, base: dict[str, bytes], prepare,
                    checked: list[G.Guards]) -> SymbolResult | None:
        ctx = self.ctx
        want = C.digest(base)

        def same(name: str, outs: dict[str, bytes], detail: str) -> SymbolResult | None:
            d = C.digest(outs)
            if d != want:
                diff = C.first_difference(base, outs)
                self.add(name, False, d, f"{detail}: {diff}")
                return self.reject(name, f"{self.name}: {detail} differs from the first run ({diff})")
            self.add(name, True, d, detail)
            return None

        r = REPEATS[self.job.get("level", "quick")]
        for i in range(r):
            outs = inst.run()
            if C.digest(outs) != want:
                diff = C.first_difference(base, outs)
                self.add("repeat", False, C.digest(outs), f"run {i + 2} of {r + 1}: {diff}")
                return self.reject("repeat", f"{self.name}: run {i + 2} of {r + 1} is not bitwise equal to run 1 ({diff})")
        self.add("repeat", True, want, f"{r} more runs bitwise equal")

        v = self.placement(spec, fn, inst, base, want)
        if v:
            return v

        q = self.fam.qualify
        if q.batch_dim:
            full = spec.dims[q.batch_dim]
            if not S.batch_sizes(full):  # nothing to compare is no pass (spec.evaluate refuses it first)
                reason = f"{q.batch_dim}={full}: no smaller batch to compare against; qualify at a batch of at least 2"
                self.add("batch", False, "", reason)
                return self.reject("batch", f"{self.name}: {reason}")
            for small in S.batch_sizes(full):
                sdims = {**spec.dims, q.batch_dim: small}
                try:
                    sspec = self.spec_at(sdims)
                    sin = {}
                    fb = {b.name: b for b in spec.all_buffers}
                    for b in sspec.all_buffers:
                        if b.needs_fill:
                            sin[b.name] = S.leading_rows(inputs[b.name], fb[b.name], b)
                    expect = {b.name: S.leading_rows(S.from_bytes(base[b.name], b.dtype), fb[b.name], b).tobytes()
                              for b in sspec.outputs}
                except S.SpecError as exc:
                    self.add("batch", False, "", f"{q.batch_dim}={small}: {exc}")
                    return self.reject("batch", f"{self.name}: batch check at {q.batch_dim}={small}: {exc}")
                sinst = C.Instance(ctx, sspec, fn, sin, prepare)
                if sinst.guards is not None:
                    checked.append(sinst.guards)
                try:
                    souts = sinst.run()
                finally:
                    sinst.free()
                if souts != expect:
                    diff = C.first_difference(expect, souts)
                    self.add("batch", False, C.digest(souts), f"{q.batch_dim}={small} of {full}: {diff}")
                    return self.reject("batch", f"{self.name}: the leading rows at {q.batch_dim}={small} differ from "
                                                f"those at {q.batch_dim}={full} ({diff})")
            self.add("batch", True, want, f"{q.batch_dim} in {S.batch_sizes(full)} vs {full}: leading rows bitwise equal")

        v = same("stream", inst.run(ctx.other), "on another stream")
        if v:
            return v

        ctx.launch_neighbour(ctx.other)
        inst.enqueue(ctx.stream)
        ctx.wait(ctx.stream)
        ctx.wait(ctx.other, max(ctx.budget.limit, 60.0))
        inst.verify()
        v = same("neighbour", inst.outputs(), "under a concurrent memory- and ALU-heavy kernel on a second stream")
        if v:
            return v

        moved = C.Instance(ctx, spec, fn, inputs, prepare, offset=256)
        if moved.guards is not None:
            checked.append(moved.guards)
        try:
            v = same("address", moved.run(), "with every buffer 256 bytes further")
        finally:
            moved.free()
        if v:
            return v

        graph = cu.Graph.capture(ctx.stream, lambda: inst.enqueue(ctx.stream))
        try:
            for b in spec.outputs:  # other bytes than the graph's own poison: a replay that runs nothing differs
                cu.memset_d8(inst.ptrs[b.name], G.POISON_ALT, b.nbytes, ctx.stream)
            graph.launch(ctx.stream)
            ctx.wait(ctx.stream)
            inst.verify()
            outs = inst.outputs()
        finally:
            graph.destroy()
        v = same("graph", outs, "replayed from a captured CUDA graph")
        if v or not PDL.applies(spec, ctx.info):
            return v
        return same(PDL.CHECK, PDL.run_after_late_writer(ctx, inst),
                    "launched with programmatic dependent launch behind a kernel that writes its inputs "
                    f"{PDL.SPIN_CYCLES} cycles late")


__all__ = ["REPEATS", "SANITIZE_BATCH", "SymbolRun", "emit", "symbol_seed"]
