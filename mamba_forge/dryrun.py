"""`build --dry-run` and `qualify --dry-run`: what would be compiled or launched, and why, with counts. Plans only:
nothing is compiled, launched or written (the cache is looked at, never opened for writing or renewed)."""

from __future__ import annotations

from pathlib import Path

from mamba_forge.core.schema import BuildManifest


def build_plan(req) -> dict:
    """Every (module kind x target) `build` would compile for `req` (a BuildRequest), its role, symbol count
    and whether the cache already holds it; the catalog modules no chosen target admits, and why."""
    from mamba_forge.build.builder import plan
    from mamba_forge.core.cache import Cache, default_location

    cache = None
    cache_note = "disabled (--no-cache)" if req.cache_location is None else ""
    if req.cache_location is not None:
        try:
            where = default_location() if req.cache_location == "default" else Path(req.cache_location)
        except Exception as exc:  # noqa: BLE001 - an unusable cache only makes every job a miss
            where, cache_note = None, f"unusable: {exc}"
        if where is None and not cache_note:
            cache_note = "disabled by MAMBA_FORGE_CACHE"
        elif where is not None and where.is_dir():
            cache, cache_note = Cache(where), str(where)
        elif where is not None:
            cache_note = f"{where} (not created yet)"
    jobs = []
    for job in plan(req):
        jobs.append({"module": job.module.kind, "target": job.target.name, "role": job.role,
                     "symbols": len(job.module.symbols), "cached": bool(cache and cache.has(job.key)),
                     "why": "qualified on a GPU of this target" if job.role == "qualify"
                     else "built to check arithmetic on another family's GPU"})
    planned = {j["module"] for j in jobs}
    skipped = [{"module": m.kind, "why": "no chosen target is in its gates (--arch)"}
               for m in req.catalog.modules if m.kind not in planned]
    hits = sum(j["cached"] for j in jobs)
    return {"dry_run": True, "catalog": req.catalog.name, "targets": [t.name for t in req.targets],
            "out": str(req.out), "programs": len(jobs), "symbols": sum(j["symbols"] for j in jobs),
            "cache": {"where": cache_note, "hits": hits, "misses": len(jobs) - hits}, "jobs": jobs,
            "skipped": skipped}


def qualify_plan(build: BuildManifest, cc: tuple[int, int], *, only_modules: set[str] | None, level: str,
                 passes: int, devices: list[int], jobs: int, device_name: str, cc_source: str) -> dict:
    """The groups `qualify` would launch on a device of compute capability `cc`, and why each other compiled
    module of the build is left out."""
    from mamba_forge.qualify.plan import device_modules, plan_groups

    groups = plan_groups(build, cc, only_modules)
    on_device = device_modules(build, cc, only_modules)
    launched = {(g.module, g.target) for g in groups}
    skipped = []
    for m in build.modules:
        if (m.kind, m.target) in launched:
            continue
        if only_modules and m.kind not in only_modules:
            why = "not named by --module"
        elif m.status != "compiled":
            why = "failed to compile"
        elif (m.kind, m.target) not in on_device:
            why = f"its target does not run on compute capability {cc[0]}.{cc[1]} (or another target of it does)"
        else:
            why = "no symbol admitted at build"
        skipped.append({"module": m.kind, "target": m.target, "why": why})
    n = sum(len(g.symbols) for g in groups)
    return {"dry_run": True, "device": device_name, "cc": f"{cc[0]}.{cc[1]}", "cc_source": cc_source,
            "devices": devices, "level": level, "passes": passes, "jobs_per_gpu": jobs,
            "groups": [{"module": g.module, "target": g.target, "role": g.role, "symbols": len(g.symbols)}
                       for g in groups],
            "symbols": n, "launches": n * passes * max(1, len(devices)), "skipped": skipped}


def render_build_plan(p: dict) -> list[str]:
    lines = [f"dry run: would compile {p['programs']} program(s), {p['symbols']} symbol(s) of catalog "
             f"{p['catalog']} for {', '.join(p['targets'])} into {p['out']}",
             f"cache {p['cache']['where']}: {p['cache']['hits']} hit(s), {p['cache']['misses']} to compile"]
    lines += [f"  {j['module']} {j['target']} ({j['role']}: {j['why']}): {j['symbols']} symbol(s)"
              f"{', cached' if j['cached'] else ''}" for j in p["jobs"]]
    lines += [f"  skip {s['module']}: {s['why']}" for s in p["skipped"]]
    lines.append("nothing written (drop --dry-run to build)")
    return lines


def render_qualify_plan(p: dict) -> list[str]:
    lines = [f"dry run: would launch {len(p['groups'])} group(s), {p['symbols']} symbol(s) x {p['passes']} "
             f"pass(es) on {p['device']} (cc {p['cc']}, {p['cc_source']}), level {p['level']}, "
             f"{p['jobs_per_gpu']} worker(s) per GPU: {p['launches']} symbol run(s)"]
    lines += [f"  {g['module']} {g['target']} ({g['role']}): {g['symbols']} symbol(s)" for g in p["groups"]]
    lines += [f"  skip {s['module']} {s['target']}: {s['why']}" for s in p["skipped"]]
    lines.append("nothing launched or written (drop --dry-run to qualify)")
    return lines
