#!/usr/bin/env python3
"""Pick the SchemaStore sample under ``schemas/`` from a checkout of SchemaStore/schemastore.

    python benchmarks/data/schemastore/select_sample.py /path/to/schemastore

Candidates: the catalog's ``src/schemas/json/*.json`` that parse as a JSON object, are at most
16 kB, and resolve every ``$ref`` locally (an offline validator must check their outputs).
Three groups, each in file-name order so the pick is reproducible:

- ``vendor_keys``: schemas with keys no JSON Schema draft defines at a keyword position
  (``x-intellij-enum-metadata``, ``x-taplo``, ``markdownDescription``...), at most 10 kB, one
  schema per family of versioned copies;
- ``pattern_properties``: schemas using ``patternProperties`` (and no vendor keys), at most
  6 kB;
- ``spread``: every 12th of the remaining candidates of at most 6 kB.

Writes ``schemas/<name>.json`` (verbatim copies) and ``manifest.json`` (group, size, sha256).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "packages" / "deepinfer-structured" / "src"))

from deepinfer_structured.schema_keywords import ANNOTATIONS, VALIDATING, walk  # noqa: E402


def refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return found + [r for v in value.values() for r in refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in refs(v)]
    return []


def main(checkout: Path) -> int:
    source = checkout / "src" / "schemas" / "json"
    rows = []
    for path in sorted(source.glob("*.json")):
        size = path.stat().st_size
        if size > 16_000:
            continue
        try:
            schema = json.loads(path.read_text(encoding="utf-8-sig"))
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(schema, dict) or any(not r.startswith("#") for r in refs(schema)):
            continue
        nodes = [node for _, node in walk(schema)]
        vendor = any(k not in VALIDATING and k not in ANNOTATIONS for n in nodes for k in n)
        patterns = any(n.get("patternProperties") for n in nodes)
        rows.append((path, size, vendor, patterns))
    picked: dict[str, tuple[Path, str]] = {}
    families: set[str] = set()
    for path, size, vendor, _ in rows:
        family = re.sub(r"-v?[0-9][0-9.]*$", "", path.stem)
        if vendor and size <= 10_000 and family not in families:
            families.add(family)
            picked[path.name] = (path, "vendor_keys")
    for path, size, vendor, patterns in rows:
        if patterns and not vendor and size <= 6_000:
            picked[path.name] = (path, "pattern_properties")
    rest = [r for r in rows if r[0].name not in picked and r[1] <= 6_000]
    for path, *_ in rest[::12]:
        picked[path.name] = (path, "spread")
    out = HERE / "schemas"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    manifest = []
    for name, (path, group) in sorted(picked.items()):
        data = path.read_bytes()
        (out / name).write_bytes(data)
        manifest.append(
            {
                "file": name,
                "group": group,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(m["bytes"] for m in manifest)
    print(f"{len(manifest)} schemas, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
