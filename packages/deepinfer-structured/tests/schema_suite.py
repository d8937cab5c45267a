"""The official JSON-Schema-Test-Suite, draft 2020-12, as vendored in the ``jsonschema`` 4.26.0
sdist (``jsonschema-4.26.0/json/tests/draft2020-12/*.json``; its ``json/remotes`` serve the
``http://localhost:1234/`` references). Fetched once with ``pip download`` into the cache folder.

Shared by the schema-suite tests and ``benchmarks/structured_schema_battery.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

SDIST = "jsonschema==4.26.0"
SDIST_FILE = "jsonschema-4.26.0.tar.gz"
SDIST_SHA256 = "0c26707e2efad8aa1bfc5b7ce170f3fccc2e4918ff85989ba9ffa9facb2be326"
MEMBER_PREFIX = "jsonschema-4.26.0/json/tests/draft2020-12/"
REMOTES_PREFIX = "jsonschema-4.26.0/json/remotes/"
REMOTES_URL = "http://localhost:1234/"


@dataclass(frozen=True)
class SuiteCase:
    """One schema of the suite with the instances the suite says it accepts or rejects."""

    name: str  # "<file>#<index>"
    description: str
    schema: Any
    tests: tuple[tuple[Any, bool], ...]  # (instance, valid)


def sdist_path() -> Path:
    cache_dir = Path(os.environ.get("DEEPINFER_CACHE") or Path.home() / ".cache" / "deepinfer")
    folder = cache_dir / "schema-suite"
    sdist = folder / SDIST_FILE
    if not sdist.exists():
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*command, "--quiet", "-d", str(folder), SDIST], check=True)
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{sdist} has sha256 {digest}, expected {SDIST_SHA256}")
    return sdist


@cache
def suite_cases() -> tuple[SuiteCase, ...]:
    cases: list[SuiteCase] = []
    with tarfile.open(sdist_path()) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = member.name
            if name.startswith(MEMBER_PREFIX) and name.endswith(".json") and name.count("/") == 4:
                handle = tar.extractfile(member)
                assert handle is not None
                for i, case in enumerate(json.load(handle)):
                    tests = tuple((t["data"], bool(t["valid"])) for t in case["tests"])
                    label = f"{name.rsplit('/', 1)[1]}#{i}"
                    cases.append(SuiteCase(label, case["description"], case["schema"], tests))
    return tuple(cases)


@cache
def remote_documents() -> dict[str, Any]:
    """The suite's remote schemas by URL, for validators that resolve ``$ref`` offline."""
    documents: dict[str, Any] = {}
    with tarfile.open(sdist_path()) as tar:
        for member in tar.getmembers():
            if member.name.startswith(REMOTES_PREFIX) and member.name.endswith(".json"):
                handle = tar.extractfile(member)
                assert handle is not None
                documents[REMOTES_URL + member.name[len(REMOTES_PREFIX) :]] = json.load(handle)
    return documents


def validator(schema: Any, formats: bool = False) -> Any:
    """A draft 2020-12 validator for ``schema`` that resolves the suite's remotes offline;
    ``formats`` turns ``format`` from an annotation (the draft's default) into an assertion."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    registry: Registry = Registry().with_resources(
        (url, Resource.from_contents(doc, default_specification=DRAFT202012))
        for url, doc in remote_documents().items()
    )
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER if formats else None
    return jsonschema.Draft202012Validator(schema, registry=registry, format_checker=checker)
