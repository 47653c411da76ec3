"""Compare two build folders per (module, target): every symbol's verdict and resources, the cubin sha256, and for a
cubin that differs, which ELF sections differ (.strtab as a set of names, .symtab also without its name offsets).

For refactors that must not change the arithmetic: build before and after, then
    python scripts/compare_builds.py BEFORE AFTER      (exit status 1 when a verdict or a resource changed)
"""

import hashlib
import struct
import sys
import tomllib
from pathlib import Path


def sections(data: bytes) -> dict[str, bytes]:
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_off = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        name_end = data.index(b"\0", names_off + h[0])
        name = data[names_off + h[0] : name_end].decode()
        body = b"" if h[1] == 8 else data[h[4] : h[4] + h[5]]  # SHT_NOBITS holds nothing
        out[name] = body
    return out


def symtab_sans_names(body: bytes) -> list[tuple]:
    return [struct.unpack_from("<IBBHQQ", body, i)[1:] for i in range(0, len(body), 24)]


def cubin_diff(a: bytes, b: bytes) -> list[str]:
    sa, sb = sections(a), sections(b)
    out = []
    if set(sa) != set(sb):
        out.append(f"section names differ: {sorted(set(sa) ^ set(sb))}")
    for name in sorted(set(sa) & set(sb)):
        if sa[name] == sb[name]:
            continue
        if name == ".strtab":
            na, nb = set(sa[name].split(b"\0")), set(sb[name].split(b"\0"))
            out.append(f".strtab: {len(na - nb)} names only after, {len(nb - na)} only before")
        elif name == ".symtab" and symtab_sans_names(sa[name]) == symtab_sans_names(sb[name]):
            out.append(".symtab: name offsets only")
        else:
            out.append(f"{name}: content differs ({len(sb[name])} -> {len(sa[name])} bytes)")
    return out


def load(folder: Path) -> dict:
    body = tomllib.loads((folder / "manifest.toml").read_text())
    return {(m["kind"], m["target"]): m for m in body["modules"]}


def main(before: Path, after: Path) -> int:
    mb, ma = load(before), load(after)
    bad = 0
    for key in sorted(set(mb) | set(ma)):
        if key not in mb or key not in ma:
            print(f"{key}: only {'after' if key in ma else 'before'}")
            bad += 1
            continue
        b, a = mb[key], ma[key]
        sb = {s["name"]: s for s in b["symbols"]}
        sa = {s["name"]: s for s in a["symbols"]}
        problems = []
        if set(sb) != set(sa):
            problems.append(f"symbol sets differ: {sorted(set(sb) ^ set(sa))}")
        for name in sorted(set(sb) & set(sa)):
            if sb[name].get("resources") != sa[name].get("resources"):
                problems.append(f"{name}: resources {sb[name].get('resources')} -> {sa[name].get('resources')}")
            if sb[name].get("verdict") != sa[name].get("verdict"):
                problems.append(f"{name}: verdict {sb[name].get('verdict')} -> {sa[name].get('verdict')}")
        if b["status"] != a["status"]:
            problems.append(f"status {b['status']} -> {a['status']}")
        cub_b = {x["path"]: x["sha256"] for x in b["artifacts"] if x["code"] == "cubin"}
        cub_a = {x["path"]: x["sha256"] for x in a["artifacts"] if x["code"] == "cubin"}
        same = cub_b == cub_a
        line = (
            f"{key[0]}/{key[1]}: {len(sa)} symbols, verdicts+resources {'same' if not problems else 'DIFFER'}, "
            f"cubin {'identical' if same else 'differs'}"
        )
        print(line)
        for p in problems:
            print("   ", p)
            bad += 1
        if not same:
            for path in cub_a:
                da, db = (after / path).read_bytes(), (before / path).read_bytes()
                assert hashlib.sha256(da).hexdigest() == cub_a[path]
                for d in cubin_diff(da, db):
                    print("    ", path, d)
    return 1 if bad else 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Compare two build folders (each with a manifest.toml) per module and "
                                 "target; exit 1 when a verdict or a resource changed.")
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    for folder in (args.before, args.after):
        if not (folder / "manifest.toml").is_file():
            ap.error(f"{folder}: no manifest.toml there (give two folders written by mamba-forge build --out)")
    sys.exit(main(args.before, args.after))
