"""A sample of the SchemaStore catalog (https://github.com/SchemaStore/schemastore, Apache-2.0),
vendored under ``benchmarks/data/schemastore`` (its README says which commit and how the
sample was picked). Shared by the tests and ``benchmarks/structured_schema_battery.py``.

Each schema is validated by the draft its ``$schema`` declares (most are draft-07 or
draft-04), 2020-12 when it declares none; every ``$ref`` in the sample is local.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "schemastore"


@dataclass(frozen=True)
class StoreSchema:
    file: str
    group: str  # vendor_keys | pattern_properties | spread
    schema: Any


@cache
def store_schemas() -> tuple[StoreSchema, ...]:
    """The sample, each file checked against the manifest's sha256."""
    manifest = json.loads((DATA / "manifest.json").read_text())
    out = []
    for entry in manifest:
        data = (DATA / "schemas" / entry["file"]).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            raise RuntimeError(f"{entry['file']} has sha256 {digest}, expected {entry['sha256']}")
        schema = json.loads(data.decode("utf-8-sig"))
        out.append(StoreSchema(entry["file"], entry["group"], schema))
    return tuple(out)


def store_schema(file: str) -> Any:
    return next(s.schema for s in store_schemas() if s.file == file)


def store_validator(schema: Any, formats: bool = False) -> Any:
    """A validator of the draft ``schema`` declares (2020-12 by default); ``formats`` turns
    ``format`` into an assertion."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER if formats else None)
