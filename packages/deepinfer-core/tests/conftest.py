"""Fixtures for all core tests: one torch thread, helper-module imports, fake plugin dists.

Every test here runs with one torch CPU thread (``one_thread``, autouse): the tests run tiny ops,
which are dominated by thread hand-off on a shared CPU.

The repository runs pytest with ``--import-mode=importlib``, which puts no test folder on
sys.path, so the folders whose tests import sibling helper modules (``_tiny_models``, ``_tiny``,
``reference``, ...) are put there once, here. Their module names must stay distinct.

A ``<name>-<version>.dist-info`` folder with METADATA and entry_points.txt on sys.path is all that
importlib.metadata needs, so plugin discovery is tested exactly as it runs for real installs,
without pip (``fake_dist``).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

HELPER_FOLDERS = ("engine", "models", "models_v41", "parallel")
sys.path[:0] = [str(Path(__file__).parent / folder) for folder in HELPER_FOLDERS]

FakeDist = Callable[..., Path]
_counter = itertools.count()


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Run the test with one torch CPU thread, restoring the previous count afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
