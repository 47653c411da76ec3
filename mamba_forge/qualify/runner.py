"""The qualification parent: plans the groups of symbols that target the attached GPU, runs them in isolated
worker subprocesses (fresh worker after a fault or a hang), optionally under compute-sanitizer, compares digests
across GPUs of one model, assembles the qualified manifest and signs it.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mamba_forge import __version__
from mamba_forge.catalog.model import Catalog
from mamba_forge.catalog.targets import TARGETS
from mamba_forge.errors import ForgeError
from mamba_forge.fsio import write_atomic
from mamba_forge.manifest import signing
from mamba_forge.manifest.qualified import (
    QArtifact,
    QCheck,
    QDevice,
    QResources,
    QRoute,
    QSymbol,
    QToolchain,
    QualifiedManifest,
    signed_files,
    timestamps,
)
from mamba_forge.manifest.schema import BuildManifest, ModuleBuild
from mamba_forge.runtime.sources import runtime_table_path

SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
DEFAULT_WORKER = [sys.executable, "-m", "mamba_forge.qualify.worker"]
MAX_FRUITLESS_RESTARTS = 2  # a worker that dies twice before finishing any symbol: give up on the rest
SANITIZER_LINE = "========="
UNATTRIBUTED = "*"  # sanitizer lines printed while no symbol was running
_SANITIZER_NOISE = re.compile(r"^=+\s*(COMPUTE-SANITIZER|ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards|$)")

Event = dict
OnEvent = Callable[[int, Event], None]


# ---- planning -------------------------------------------------------------------------------------------


@dataclass
class Group:
    module: str
    target: str
    role: str
    cubin: str | None
    ptx: str | None
    symbols: list[dict]  # {"name", "build_layout"}

    def job(self, names: set[str] | None = None) -> dict:
        syms = [s for s in self.symbols if names is None or s["name"] in names]
        return {"module": self.module, "target": self.target, "role": self.role, "cubin": self.cubin, "ptx": self.ptx,
                "symbols": syms}


def device_targets(cc: tuple[int, int]) -> list[str]:
    """Targets whose cubins run on a device of this compute capability (cubins are exact-cc here)."""
    return [t.name for t in TARGETS.values() if t.cc == cc[0] * 10 + cc[1]]


def device_modules(build: BuildManifest, cc: tuple[int, int], only_modules: set[str] | None = None) -> set[tuple[str, str]]:
    """(module kind, target) pairs of the build that this device runs: one target per module kind, the
    arch-specific one first (sm_90a before sm_90), so a symbol name appears once per manifest."""
    prefer = sorted(device_targets(cc), key=lambda t: not t.endswith("a"))
    chosen: dict[str, str] = {}
    for t in prefer:
        for m in build.modules:
            if m.target == t and not m.built_only and m.kind not in chosen:
                if only_modules is None or m.kind in only_modules:
                    chosen[m.kind] = t
    return set(chosen.items())


def plan_groups(build: BuildManifest, cc: tuple[int, int], only_modules: set[str] | None = None) -> list[Group]:
    """One group per compiled (module, target) that runs on this device, holding the symbols admitted at build."""
    on_device = device_modules(build, cc, only_modules)
    groups = []
    for m in build.modules:
        if (m.kind, m.target) not in on_device or m.status != "compiled":
            continue
        cubin = next((a.path for a in m.artifacts if a.code == "cubin"), None)
        ptx = next((a.path for a in m.artifacts if a.code == "ptx"), None)
        syms = [
            {"name": s.name, "build_layout": s.resources.param_layout if s.resources else []}
            for s in m.symbols
            if s.verdict.status == "admitted"
        ]
        if syms:
            groups.append(Group(m.kind, m.target, m.role, cubin, ptx, syms))
    return groups


# ---- isolated workers -----------------------------------------------------------------------------------


@dataclass
class WorkerSettings:
    build_dir: Path
    catalog: Path
    device: int = 0
    level: str = "quick"
    seed: int = 0
    timeout_s: float = 20.0  # per launch, enforced by the worker
    idle_s: float | None = None  # parent-side backstop: no event for this long kills the worker
    command: list[str] = field(default_factory=lambda: list(DEFAULT_WORKER))
    sanitize_tool: str | None = None
    env: dict[str, str] | None = None

    @property
    def idle_limit(self) -> float:
        base = self.idle_s if self.idle_s is not None else 3 * self.timeout_s + 60
        return base * (20 if self.sanitize_tool else 1)


@dataclass
class Outcome:
    results: dict[str, dict] = field(default_factory=dict)  # symbol -> result record
    device: dict | None = None
    module_notes: dict[str, str] = field(default_factory=dict)  # "module/target" -> how it loaded
    sanitizer: dict[str, list[str]] = field(default_factory=dict)  # symbol -> sanitizer report lines
    restarts: int = 0
    last_failure: str = ""  # why the last worker ended early


def _reader(stream, q: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        q.put(line)
    q.put(None)


def _kill(proc: subprocess.Popen) -> None:
    """Kill the worker (and what it started, e.g. under compute-sanitizer): its own process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def run_groups(groups: list[Group], ws: WorkerSettings, on_event: OnEvent | None = None, sanitize: bool = False) -> Outcome:
    """Qualify every symbol of `groups` in worker subprocesses; a fault or hang rejects the symbol that caused
    it and a fresh worker continues with the rest. Never raises for a misbehaving kernel or worker."""
    out = Outcome()
    all_names = [s["name"] for g in groups for s in g.symbols]
    where = {s["name"]: (g.module, g.target) for g in groups for s in g.symbols}
    fruitless = 0
    while True:
        remaining = [n for n in all_names if n not in out.results]
        if not remaining:
            break
        rem = set(remaining)
        job_groups = [g.job(rem) for g in groups if any(s["name"] in rem for s in g.symbols)]
        job = {"device": ws.device, "level": ws.level, "seed": ws.seed, "timeout_s": ws.timeout_s * (20 if ws.sanitize_tool else 1),
               "catalog": str(ws.catalog), "build_dir": str(ws.build_dir), "sanitize": sanitize, "groups": job_groups}
        before = len(out.results)
        _one_worker(job, ws, out, where, on_event)
        if len(out.results) == before:
            fruitless += 1
            if fruitless >= MAX_FRUITLESS_RESTARTS:
                why = out.last_failure or "the worker failed before qualifying any symbol"
                for n in remaining:
                    if n not in out.results:
                        m, t = where[n]
                        out.results[n] = _rejected(n, m, t, "harness", f"{n}: not qualified: {why}")
                break
        else:
            fruitless = 0
    return out


def _rejected(name: str, module: str, target: str, check: str, reason: str) -> dict:
    return {"symbol": name, "module": module, "target": target, "status": "rejected", "check": check, "reason": reason,
            "checks": []}


def _one_worker(job: dict, ws: WorkerSettings, out: Outcome, where: dict, on_event: OnEvent | None) -> None:
    with tempfile.TemporaryDirectory(prefix="mf-qualify-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        err_path = Path(tmp) / "stderr.txt"
        cmd = list(ws.command) + ["--job", str(job_path)]
        if ws.sanitize_tool:
            exe = shutil.which("compute-sanitizer") or "compute-sanitizer"
            # API errors are the harness's own (the ABI census probes cuFuncGetParamInfo past the last
            # parameter, which answers CUDA_ERROR_INVALID_VALUE by design): report kernels' errors only
            cmd = [exe, "--tool", ws.sanitize_tool, "--report-api-errors", "no", "--print-limit", "20",
                   "--error-exitcode", "0", *cmd]
        env = dict(os.environ, **(ws.env or {}))
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(err_path, "w") as err_f:
            # under compute-sanitizer its reports may come on either stream: read both, in order
            stderr = subprocess.STDOUT if ws.sanitize_tool else err_f
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                    env=env, start_new_session=True)
        q: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
        current: str | None = None
        done = False
        timed_out = False
        while True:
            try:
                line = q.get(timeout=ws.idle_limit)
            except queue.Empty:
                timed_out = True
                _kill(proc)
                break
            if line is None:
                break
            line = line.rstrip("\n")
            if not line.startswith("{"):
                if line.startswith(SANITIZER_LINE) and not _SANITIZER_NOISE.match(line):
                    out.sanitizer.setdefault(current or UNATTRIBUTED, []).append(line)
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = ev.get("event")
            if kind == "hello":
                out.device = ev.get("device")
            elif kind == "module":
                out.module_notes[f"{ev['module']}/{ev['target']}"] = ev.get("load", "")
            elif kind == "module_error":
                for n, (m, t) in where.items():
                    if (m, t) == (ev["module"], ev["target"]) and n not in out.results and n in _names(job):
                        out.results[n] = _rejected(n, m, t, "load", ev.get("reason", "module load failed"))
            elif kind == "start":
                current = ev["symbol"]
            elif kind == "result":
                out.results[ev["symbol"]] = ev
                current = None
            elif kind == "fault":
                m, t = where.get(ev["symbol"], ("", ""))
                out.results[ev["symbol"]] = _rejected(ev["symbol"], m, t, "fault", ev.get("reason", ev.get("result", "")))
                current = None
            elif kind == "timeout":
                m, t = where.get(ev["symbol"], ("", ""))
                out.results[ev["symbol"]] = _rejected(ev["symbol"], m, t, "timeout", ev.get("reason", "timed out"))
                current = None
            elif kind == "fatal":
                out.last_failure = ev.get("reason", "the worker could not open the device")
            elif kind == "done":
                done = True
            if on_event:
                on_event(ws.device, ev)
        if not timed_out:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _kill(proc)
        stderr_tail = err_path.read_text(errors="replace").strip().splitlines()[-3:] if err_path.exists() else []
        if not done:
            out.restarts += 1
            why = f"the worker {_describe_exit(proc.returncode)}" if not timed_out else (
                f"timed out after {ws.idle_limit:g} s without a word from the worker")
            if stderr_tail and not timed_out:
                why += f" ({' | '.join(stderr_tail)[:300]})"
            out.last_failure = why
            if current is not None and current not in out.results:
                m, t = where.get(current, ("", ""))
                if timed_out:
                    out.results[current] = _rejected(current, m, t, "timeout", f"{current}: timed out after {ws.idle_limit:g} s")
                else:
                    out.results[current] = _rejected(current, m, t, "fault", f"{current}: {why}")
                if on_event:
                    on_event(ws.device, {"event": "result", **out.results[current]})


def _names(job: dict) -> set[str]:
    return {s["name"] for g in job["groups"] for s in g["symbols"]}


# ---- the whole qualification ----------------------------------------------------------------------------


@dataclass
class QualifyRequest:
    build_dir: Path
    build: BuildManifest
    catalog: Catalog
    devices: list[int]
    level: str = "quick"
    sanitize: bool = False
    timeout_s: float = 20.0
    seed: int | None = None
    only_modules: set[str] | None = None
    worker_command: list[str] | None = None
    jobs: int = 4  # concurrent workers per GPU


@dataclass
class QualifyResult:
    manifest: QualifiedManifest
    outcomes: dict[int, Outcome]
    notes: list[str]


def qualify(req: QualifyRequest, on_event: OnEvent | None = None, cc_hint: tuple[int, int] | None = None) -> QualifyResult:
    """Qualify every symbol that targets the device(s); returns the (unsigned) manifest."""
    t0 = time.perf_counter()
    if req.sanitize and shutil.which("compute-sanitizer") is None:
        raise ForgeError("--sanitize needs compute-sanitizer on PATH", hint="install the CUDA toolkit's sanitizer or drop --sanitize")
    seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(6), "little")
    cc = cc_hint or _probe_cc(req)
    groups = plan_groups(req.build, cc, req.only_modules)
    if not groups:
        raise ForgeError(
            f"the build in {req.build_dir} has no module for compute capability {cc[0]}.{cc[1]} "
            f"(built: {', '.join(req.build.targets)})",
            hint=f"build for {', '.join(device_targets(cc)) or 'this GPU'} or omit --build",
        )
    notes: list[str] = []
    outcomes: dict[int, Outcome] = {}

    def one(dev: int) -> None:
        ws = WorkerSettings(req.build_dir, req.catalog.path, dev, req.level, seed, req.timeout_s,
                            command=req.worker_command or list(DEFAULT_WORKER))
        oc = merge_outcomes(in_parallel(lambda sh: run_groups(sh, ws, on_event), shard(groups, req.jobs)))
        if req.sanitize:
            admitted = {n for n, r in oc.results.items() if r.get("status") == "admitted"}
            sgroups = [Group(g.module, g.target, g.role, g.cubin, g.ptx, [s for s in g.symbols if s["name"] in admitted])
                       for g in groups]
            sgroups = [g for g in sgroups if g.symbols]
            for tool in SANITIZER_TOOLS:
                if not sgroups:
                    break
                sws = WorkerSettings(req.build_dir, req.catalog.path, dev, req.level, seed, req.timeout_s,
                                     command=ws.command, sanitize_tool=tool)
                for soc in in_parallel(lambda sh, sws=sws: run_groups(sh, sws, on_event, sanitize=True),
                                       shard(sgroups, req.jobs)):
                    apply_sanitizer(oc, soc, tool)
        outcomes[dev] = oc

    threads = [threading.Thread(target=one, args=(d,)) for d in req.devices]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if len(req.devices) > 1:
        notes += cross_device(outcomes)
    seconds = time.perf_counter() - t0
    manifest = assemble(req, outcomes, groups, seconds)
    return QualifyResult(manifest, outcomes, notes)


def shard(groups: list[Group], n: int) -> list[list[Group]]:
    """Split the symbols over n workers (round robin within each group; each worker loads the modules it needs).
    Workers on one GPU overlap one another's host work (inputs, references, comparisons) with GPU work."""
    n = max(1, n)
    shards: list[list[Group]] = [[] for _ in range(n)]
    for g in groups:
        for i in range(n):
            part = g.symbols[i::n]
            if part:
                shards[i].append(Group(g.module, g.target, g.role, g.cubin, g.ptx, part))
    return [s for s in shards if s]


def in_parallel(fn: Callable, items: list) -> list:
    results: list = [None] * len(items)

    def run(i: int) -> None:
        results[i] = fn(items[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results


def merge_outcomes(parts: list[Outcome]) -> Outcome:
    out = Outcome()
    for p in parts:
        out.results.update(p.results)
        out.device = out.device or p.device
        out.module_notes.update(p.module_notes)
        out.restarts += p.restarts
        for k, v in p.sanitizer.items():
            out.sanitizer.setdefault(k, []).extend(v)
    return out


def _probe_cc(req: QualifyRequest) -> tuple[int, int]:
    from mamba_forge.gpu import driver as cu

    try:
        info = cu.Device(req.devices[0]).info()
    except cu.CudaError as exc:
        raise ForgeError(f"cannot open GPU {req.devices[0]}: {exc}", hint="check nvidia-smi and --device") from None
    return info.cc


def apply_sanitizer(oc: Outcome, soc: Outcome, tool: str) -> None:
    """Reject every symbol with a compute-sanitizer report (or that failed under the tool). Lines printed
    outside any symbol go to the symbols they name; a non-zero error summary nobody can be blamed for rejects
    every symbol of the run (better a false rejection than a missed report)."""
    loose = soc.sanitizer.get(UNATTRIBUTED, [])
    attributed = any(k != UNATTRIBUTED for k in soc.sanitizer)
    unexplained = [ln for ln in loose if re.search(r"ERROR SUMMARY: [1-9]|SUMMARY: [1-9]\d* hazard", ln)]
    for name, rec in soc.results.items():
        main = oc.results.get(name)
        if main is None or main.get("status") != "admitted":
            continue
        lines = soc.sanitizer.get(name, []) + [ln for ln in loose if re.search(rf"\b{re.escape(name)}\b", ln)]
        if not lines and unexplained and not attributed:
            lines = unexplained
        checks = main.setdefault("checks", [])
        if lines:
            first = next((ln.strip("= ").strip() for ln in lines if ln.strip("= ").strip()), "report")
            checks.append({"name": "sanitize", "passed": False, "digest": "", "detail": f"{tool}: {first}"})
            main.update(status="rejected", check="sanitize", reason=f"{name}: compute-sanitizer {tool}: {first}")
        elif rec.get("status") != "admitted":
            checks.append({"name": "sanitize", "passed": False, "digest": "", "detail": f"{tool}: {rec.get('reason')}"})
            main.update(status="rejected", check="sanitize", reason=f"{name}: under compute-sanitizer {tool}: {rec.get('reason')}")
        else:
            checks.append({"name": "sanitize", "passed": True, "digest": "", "detail": f"{tool}: no report"})


def cross_device(outcomes: dict[int, Outcome]) -> list[str]:
    """Reject a symbol whose digests differ between two GPUs of the same model."""
    notes = []
    devs = sorted(outcomes)
    names = {d: (outcomes[d].device or {}).get("name") for d in devs}
    if len(set(names.values())) > 1:
        notes.append(f"GPUs of different models ({sorted(set(map(str, names.values())))}): digests not compared")
        return notes
    first = devs[0]
    for name, rec in outcomes[first].results.items():
        recs = {d: outcomes[d].results.get(name) for d in devs}
        if any(r is None or r.get("status") != "admitted" for r in recs.values()):
            # rejected anywhere: rejected everywhere, with the first reason
            bad = next((d, r) for d, r in recs.items() if r is None or r.get("status") != "admitted")
            if rec.get("status") == "admitted":
                why = bad[1]["reason"] if bad[1] else "no result"
                rec.update(status="rejected", check=(bad[1] or {}).get("check", "fault"), reason=f"on GPU {bad[0]}: {why}")
            continue
        sig0 = [(c["name"], c.get("digest", "")) for c in rec.get("checks", [])]
        for d in devs[1:]:
            sig = [(c["name"], c.get("digest", "")) for c in recs[d].get("checks", [])]  # type: ignore[union-attr]
            if sig != sig0:
                rec.update(status="rejected", check="cross-device",
                           reason=f"{name}: output digests differ between GPU {first} and GPU {d} of the same model")
                rec.setdefault("checks", []).append({"name": "cross-device", "passed": False, "digest": "",
                                                     "detail": f"GPU {first} vs GPU {d}"})
                break
        else:
            rec.setdefault("checks", []).append({"name": "cross-device", "passed": True, "digest": sig0[-1][1] if sig0 else "",
                                                 "detail": f"{len(devs)} GPUs bitwise equal"})
    return notes


def assemble(req: QualifyRequest, outcomes: dict[int, Outcome], groups: list[Group], seconds: float) -> QualifiedManifest:
    first = outcomes[min(outcomes)]
    dev = first.device or {}
    cc = dev.get("cc", "?")
    run_targets = {(g.module, g.target) for g in groups}
    created, expires = timestamps()
    b = req.build
    artifacts: list[QArtifact] = []
    symbols: list[QSymbol] = []
    sources: dict[str, str] = {}
    cat_syms = req.catalog.symbols
    chosen = device_modules(b, _cc_tuple(cc), req.only_modules) if cc != "?" else set()
    for m in b.modules:
        on_device = (m.kind, m.target) in chosen
        if not on_device and not (m.built_only and (req.only_modules is None or m.kind in req.only_modules)):
            continue
        sources[f"{m.kind}/{m.target}"] = m.source_sha256
        if on_device and m.status == "compiled":
            # Cubins only: they are what was qualified and what the loader loads. NVRTC's PTX is not
            # byte-reproducible (NVVM's register numbering varied between two processes for the Fixed module,
            # while the cubins were identical), so it stays in the build folder and out of the signed manifest.
            for a in (a for a in m.artifacts if a.code == "cubin"):
                artifacts.append(QArtifact(module=m.kind, target=m.target, role=m.role, path=a.path, code=a.code,
                                           size=a.size, sha256=a.sha256))
        for s in m.symbols:
            symbols.append(_symbol_record(m, s, first.results.get(s.name) if (m.kind, m.target) in run_targets else None,
                                          cat_syms.get(s.name), on_device))
    routes = _routes(symbols)
    return QualifiedManifest(
        created=created, expires=expires, tool_version=__version__, level=req.level,  # type: ignore[arg-type]
        qualification_seconds=round(seconds, 2), development_key=False, catalog=b.catalog,
        catalog_sha256=b.catalog_sha256, state_capacity=b.state_capacity,
        toolchain=QToolchain(nvrtc_version=b.toolchain.nvrtc_version, library=b.toolchain.library,
                             header_sha256=b.toolchain.header_sha256, base_options=b.toolchain.base_options,
                             source_sha256=sources),
        device=QDevice(name=dev.get("name", "unknown"), cc=cc, sm_count=int(dev.get("sm_count", 0)),
                       driver_version=int(dev.get("driver_version", 0)), count=len(outcomes)),
        artifacts=artifacts, symbols=symbols, routes=routes,
    )


def _cc_tuple(text: str) -> tuple[int, int]:
    a, _, b2 = text.partition(".")
    return int(a), int(b2 or 0)


def _symbol_record(m: ModuleBuild, s, rec: dict | None, cat, on_device: bool) -> QSymbol:
    base = dict(name=s.name, module=m.kind, target=m.target, family=s.family, dtype=s.dtype, block=s.block,
                dynamic_smem=s.dynamic_smem, deterministic=s.deterministic,
                fallback=list(cat.fallback) if cat is not None else [],
                params=s.resources.param_layout if s.resources else [])
    if s.verdict.status == "rejected":
        return QSymbol(**base, status="rejected", reason=s.verdict.reason, check=s.verdict.check)
    if not on_device:
        return QSymbol(**base, status="built-only",
                       reason=f"no {m.target} GPU here: built and statically admitted only", check="")
    if rec is None:
        return QSymbol(**base, status="rejected", check="untested", reason=f"{s.name}: not qualified in this run")
    status = rec.get("status", "rejected")
    reason = rec.get("reason", "")
    if status == "admitted" and m.role == "check":
        status = "checked"  # arithmetic checked on this GPU for another family: never qualified for its own
        reason = f"arithmetic checked on {m.target} for another GPU family; not qualified to serve here"
    res = rec.get("resources") or None
    checks = [QCheck(**c) for c in rec.get("checks", [])]
    if m.role == "check" and status == "checked":
        checks.append(QCheck(name="role", passed=True, detail=f"checked on {m.target}; not qualified for its own family"))
    return QSymbol(
        **{**base, "params": rec.get("params") or base["params"]},
        status=status, reason=reason, check=rec.get("check", ""), seed=rec.get("seed"),
        resources=QResources(**res) if res else None, checks=checks,
    )


def _routes(symbols: list[QSymbol]) -> list[QRoute]:
    """The GEMM route table (mamba_forge.runtime.routes): per key, the admitted symbols fastest first."""
    from mamba_forge.runtime.routes import build_route_table

    return [QRoute(**r) for r in build_route_table([s.name for s in symbols if s.status == "admitted"])]


# ---- keys and writing -----------------------------------------------------------------------------------


@dataclass
class SigningKey:
    private: object
    development: bool
    source: str


def dev_key_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mamba-forge" / "dev-key"


def resolve_key(path: Path | None) -> SigningKey:
    """--sign-key PATH, else $MAMBA_FORGE_SIGNING_KEY (PEM text), else a local development key (made once)."""
    if path is not None:
        try:
            return SigningKey(signing.parse_private(Path(path).read_bytes()), False, str(path))
        except FileNotFoundError:
            raise ForgeError(f"signing key not found: {path}", hint="run `mamba-forge keygen`") from None
        except signing.SignatureError as exc:
            raise ForgeError(f"{path}: {exc}") from None
    pem = os.environ.get(signing.KEY_ENV)
    if pem:
        try:
            return SigningKey(signing.parse_private(pem.encode()), False, f"${signing.KEY_ENV}")
        except signing.SignatureError as exc:
            raise ForgeError(f"${signing.KEY_ENV}: {exc}") from None
    folder = dev_key_dir()
    priv = folder / "mamba-forge-dev.key"
    if not priv.exists():
        signing.write_keypair(folder, "mamba-forge-dev")
        how = "generated"
    else:
        how = "reused"
    return SigningKey(signing.parse_private(priv.read_bytes()), True, f"{how} development key {priv}")


def write_signed(manifest: QualifiedManifest, key: SigningKey, out: Path) -> tuple[Path, Path]:
    """Write the signed manifest, its runtime table beside it (X.runtime.json) and the public key that
    verifies them (beside it, named by key id)."""
    manifest = manifest.model_copy(update={"development_key": key.development})
    data, table = signed_files(manifest, key.private)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, payload in ((runtime_table_path(out), table), (out, data)):  # the table first: the manifest names it
        write_atomic(path, payload)
    pub = key.private.public_key()  # type: ignore[attr-defined]
    pub_path = out.parent / f"{signing.key_id(pub)[:16]}.pub"
    write_atomic(pub_path, signing.public_text(pub))
    return out, pub_path


__all__ = [
    "Group", "Outcome", "QualifyRequest", "QualifyResult", "WorkerSettings", "assemble", "cross_device",
    "device_targets", "plan_groups", "qualify", "resolve_key", "run_groups", "write_signed",
]


# ---- CLI support: request, progress, summary ------------------------------------------------------------


def prepare_request(devices: list[int] | None, build_dir: Path | None, catalog_path: Path | None, *, level: str,
                    sanitize: bool, timeout_s: float, seed: int | None, modules: list[str] | None, state_cap: int,
                    say: Callable[[str], None], jobs: int = 4):
    """Open the device(s), load the catalog and the build (building for the device's target when none is given)."""
    from mamba_forge.build.builder import BuildRequest, build
    from mamba_forge.catalog.model import default_catalog_path, load_catalog, state_capacity
    from mamba_forge.catalog.targets import get_target
    from mamba_forge.gpu import driver as cu
    from mamba_forge.manifest.toml_io import read, write

    try:
        count = cu.device_count()
    except cu.CudaError as exc:
        raise ForgeError(f"no usable GPU: {exc}", hint="qualify needs an NVIDIA GPU with a CUDA 13 driver") from None
    devices = list(range(count)) if devices is None else devices
    if not devices or max(devices) >= count:
        raise ForgeError(f"--device {devices}: this host has {count} GPU(s)", hint=f"choose 0..{max(count - 1, 0)} or all")
    infos = [cu.Device(d).info() for d in devices]
    if len({(i.name, i.cc) for i in infos}) > 1:
        raise ForgeError("--device names GPUs of different models", hint="qualify one model per manifest")
    info = infos[0]
    cat = load_catalog(catalog_path or default_catalog_path())
    if build_dir is None:
        targets = sorted(device_targets(info.cc), key=lambda t: not t.endswith("a"))
        if not targets:
            raise ForgeError(f"no known target for compute capability {info.cc_text}")
        build_dir = Path("build") / f"qualify-{targets[0]}"
        say(f"building {cat.name} for {targets[0]} into {build_dir} …")
        bm = build(BuildRequest(cat, [get_target(targets[0])], build_dir, state_capacity=state_capacity(state_cap)))
        write(build_dir / "manifest.toml", bm)
    else:
        bm = read(Path(build_dir) / "manifest.toml", BuildManifest)
    if bm.catalog_sha256 != cat.digest():
        say(f"warning: the build in {build_dir} was made from a different catalog state; specs come from {cat.path}")
    if modules:
        unknown = set(modules) - {m.kind for m in cat.modules}
        if unknown:
            raise ForgeError(f"--module {sorted(unknown)}: no such module kind", hint=f"known: {[m.kind for m in cat.modules]}")
    req = QualifyRequest(build_dir=Path(build_dir), build=bm, catalog=cat, devices=devices, level=level,
                         sanitize=sanitize, timeout_s=timeout_s, seed=seed,
                         only_modules=set(modules) if modules else None, jobs=jobs)
    return req, info


def qualify_with_progress(req: QualifyRequest, console=None, cc: tuple[int, int] | None = None) -> QualifyResult:
    """qualify() with a rich progress display per device: module, symbol, count and the rejections as they come."""
    if console is None:
        return qualify(req, cc_hint=cc)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = sum(len(g.symbols) for g in plan_groups(req.build, cc or _probe_cc(req), req.only_modules))
    lock = threading.Lock()
    with Progress(TextColumn("[bold]qualify[/bold] GPU {task.fields[dev]}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.description}"), console=console, transient=True) as progress:
        tasks = {d: progress.add_task("", total=total * (1 + (len(SANITIZER_TOOLS) if req.sanitize else 0)), dev=d)
                 for d in req.devices}

        def on_event(dev: int, ev: Event) -> None:
            with lock:
                kind = ev.get("event")
                if kind == "start":
                    progress.update(tasks[dev], description=f"{ev.get('module')} {ev['symbol']}")
                elif kind in ("result", "fault", "timeout"):
                    progress.update(tasks[dev], advance=1)
                    if kind != "result" or ev.get("status") == "rejected":
                        progress.console.print(f"  rejected {ev.get('symbol')}: {ev.get('reason', '')}", markup=False,
                                               highlight=False)
                elif kind == "module_error":
                    progress.console.print(f"  {ev.get('reason')}", markup=False, highlight=False)

        return qualify(req, on_event, cc_hint=cc)


def render_summary(m: QualifiedManifest, console) -> None:
    from rich.table import Table

    t = Table(title=f"{m.device.name} (cc {m.device.cc}, {m.device.sm_count} SMs, x{m.device.count}) — {m.level}")
    for col in ("module", "target", "admitted", "checked", "rejected", "built only"):
        t.add_column(col, justify="left" if col in ("module", "target") else "right")
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for s in m.symbols:
        r = rows.setdefault((s.module, s.target), {"admitted": 0, "checked": 0, "rejected": 0, "built-only": 0})
        r[s.status] += 1
    for (mod, tgt), r in rows.items():
        t.add_row(mod, tgt, str(r["admitted"]), str(r["checked"]), str(r["rejected"]), str(r["built-only"]))
    console.print(t)
    rej = [s for s in m.symbols if s.status == "rejected"]
    for s in rej[:40]:
        console.print(f"  {s.name} [{s.check}] {s.reason}", markup=False, highlight=False)
    if len(rej) > 40:
        console.print(f"  … and {len(rej) - 40} more rejected (mamba-forge report)", markup=False)
