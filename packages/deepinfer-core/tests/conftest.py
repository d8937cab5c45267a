"""Fixtures for core tests: fake installed plugin distributions.

A ``<name>-<version>.dist-info`` folder with METADATA and entry_points.txt on sys.path is all that
importlib.metadata needs, so discovery is tested exactly as it runs for real installs, without pip.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

FakeDist = Callable[..., Path]
_counter = itertools.count()


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDist:
    """Return ``make(dist, {group: {name: target}}, modules={mod: source})``.

    Each call writes a distribution into its own folder and puts it first on sys.path.
    """

    def make(
        dist: str,
        entry_points: dict[str, dict[str, str]],
        modules: dict[str, str] | None = None,
        version: str = "1.0",
    ) -> Path:
        root = tmp_path / f"site{next(_counter)}"
        info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines: list[str] = []
        for group, eps in entry_points.items():
            lines += [f"[{group}]", *(f"{n} = {t}" for n, t in eps.items()), ""]
        (info / "entry_points.txt").write_text("\n".join(lines))
        for module, source in (modules or {}).items():
            (root / f"{module}.py").write_text(source)
        monkeypatch.syspath_prepend(str(root))
        return root

    return make
