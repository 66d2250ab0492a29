"""Write everything generated from the typed model: the JSON Schema and the reference.

    python -m nkibuild.manifest.generate            # rewrite the files
    python -m nkibuild.manifest.generate --check    # exit 1 if any is stale

The files (schemas/nkibuild.schema.json, which nkibuild/manifest/nkibuild.schema.json
links to, and docs/manifest.md) are for editors, other tools and readers; nkibuild
itself validates with the schema generated in memory. tests/test_manifest.py checks
that the shipped files equal the generated ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from nkibuild.manifest import docgen
from nkibuild.manifest.schemagen import manifest_schema

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "schemas" / "nkibuild.schema.json"
DOCS_FILE = REPO / "docs" / "manifest.md"


def schema_text() -> str:
    """The schema file's content: two-space indents, non-ASCII kept, a final newline."""
    return json.dumps(manifest_schema(), indent=2, ensure_ascii=False) + "\n"


def docs_text(example: Path = docgen.EXAMPLE) -> str:
    return docgen.render(manifest_schema(), example.read_text(encoding="utf-8"))


def generated() -> dict[Path, str]:
    """Each generated file and its content."""
    return {SCHEMA_FILE: schema_text(), DOCS_FILE: docs_text()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    stale = [path for path, text in generated().items() if _read(path) != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} is stale: run python -m nkibuild.manifest.generate")
        return 1 if stale else 0
    for path, text in generated().items():
        if path in stale:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}", file=sys.stderr)
    return 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
