#!/usr/bin/env python3
"""Fail when a workspace package pins a sibling to a range that excludes the sibling's version.

Packages are released separately, so each pin on a sibling (``deepinfer-core>=0.1,<0.2``) must admit
the version in this tree; otherwise the workspace installs a mixture nobody tested. Usage:
``python tools/check_pins.py [REPO_ROOT]``; exit status 1 when any pin is bad.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


def package_version(pyproject: Path, data: dict) -> str:
    project = data["project"]
    if "version" in project:
        return project["version"]
    path = data.get("tool", {}).get("hatch", {}).get("version", {}).get("path")
    if path is None:
        raise SystemExit(f"{pyproject}: dynamic version without [tool.hatch.version] path")
    match = VERSION_RE.search((pyproject.parent / path).read_text())
    if match is None:
        raise SystemExit(f"{pyproject.parent / path}: no __version__ = '...' line")
    return match.group(1)


def check(root: Path) -> tuple[int, list[str]]:
    projects: dict[str, tuple[Path, dict]] = {}
    for pyproject in sorted(root.glob("packages/*/pyproject.toml")):
        data = tomllib.loads(pyproject.read_text())
        projects[canonicalize_name(data["project"]["name"])] = (pyproject, data)
    versions = {name: package_version(p, d) for name, (p, d) in projects.items()}

    bad: list[str] = []
    for pyproject, data in projects.values():
        project = data["project"]
        groups = {"dependencies": project.get("dependencies", [])}
        for extra, reqs in project.get("optional-dependencies", {}).items():
            groups[f"extra '{extra}'"] = reqs
        for where, reqs in groups.items():
            for line in reqs:
                req = Requirement(line)
                dep = canonicalize_name(req.name)
                if dep not in versions:
                    continue
                if not req.specifier.contains(versions[dep], prereleases=True):
                    bad.append(
                        f"{pyproject.relative_to(root)}: {where} pins '{line}' "
                        f"but the tree has {dep} {versions[dep]}"
                    )
    return len(projects), bad


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    n, bad = check(root)
    for line in bad:
        print(f"BAD PIN: {line}")
    print(f"checked {n} packages, {len(bad)} bad pins")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
