"""Write everything generated from the typed model: the JSON Schema and the reference.

    python -m nkibuild.manifest.generate            # rewrite the files
    python -m nkibuild.manifest.generate --check    # exit 1 if any is stale

The files (schemas/nkibuild.schema.json, which nkibuild/manifest/nkibuild.schema.json
links to, and docs/manifest.md) are for editors, other tools and readers; nkibuild
itself validates with the schema generated in memory.
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
EXAMPLE_FILE = REPO / "examples" / "nkibuild.yaml"  # shown in the reference


def schema_text() -> str:
    """The schema file's content: two-space indents, non-ASCII kept, a final newline."""
    return json.dumps(manifest_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    example = EXAMPLE_FILE.read_text(encoding="utf-8")
    generated = {SCHEMA_FILE: schema_text(), DOCS_FILE: docgen.render(manifest_schema(), example)}
    stale = {
        path: text
        for path, text in generated.items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    }
    for path, text in stale.items():
        if args.check:
            print(f"{path.relative_to(REPO)} is stale: run python -m nkibuild.manifest.generate")
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
