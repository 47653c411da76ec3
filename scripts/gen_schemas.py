"""Regenerate the shipped JSON Schemas of `--json` output (mamba_forge/schemas/*.json) from the records.

    python scripts/gen_schemas.py          # rewrite them
    python scripts/gen_schemas.py --check  # exit 1 when a shipped file is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

from mamba_forge import schemas

FOLDER = Path(schemas.__file__).parent


def main(argv: list[str]) -> int:
    stale = []
    for name, schema in schemas.generate().items():
        path, text = FOLDER / f"{name}.json", schemas.dumps(schema)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if "--check" not in argv:
                path.write_text(text, encoding="utf-8")
    extra = sorted(set(FOLDER.glob("*.json")) - {FOLDER / f"{n}.json" for n in schemas.names()})
    for path in extra:
        stale.append(path)
        if "--check" not in argv:
            path.unlink()
    for path in stale:
        print(("stale: " if "--check" in argv else "wrote: ") + str(path))
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
