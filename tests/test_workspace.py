"""Cross-package checks: declared metadata vs what discovery sees, pins, import arrows, CI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from deepinfer import plugins

ROOT = Path(__file__).resolve().parent.parent
PYPROJECTS = {
    p.parent.name: tomllib.loads(p.read_text()) for p in ROOT.glob("packages/*/pyproject.toml")
}


def declared_entry_points() -> dict[str, dict[str, str]]:
    """{group: {name: distribution}} as written in the packages' pyproject files."""
    out: dict[str, dict[str, str]] = {}
    for data in PYPROJECTS.values():
        for group, eps in data["project"].get("entry-points", {}).items():
            for name in eps:
                out.setdefault(group, {})[name] = data["project"]["name"]
    return out


def test_seven_distributions() -> None:
    names = {d["project"]["name"] for d in PYPROJECTS.values()}
    assert names == {
        "deepinfer",
        "deepinfer-core",
        "deepinfer-kernels-sm100",
        "deepinfer-kernels-ascend",
        "deepinfer-spec",
        "deepinfer-structured",
        "deepseek-recipe",
    }


def test_info_lists_every_declared_plugin() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "deepinfer", "info", "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    report = json.loads(out)
    assert report["errors"] == []
    seen = {
        group: {p["name"]: p["distribution"] for p in items}
        for group, items in report["plugins"].items()
        if items
    }
    assert seen == declared_entry_points()
    by_name = {p["name"]: p for p in report["plugins"]["deepinfer.backends"]}
    assert by_name["torch"]["status"] == "available"
    assert report["backend"]["backend"] in by_name


def test_every_install_hint_names_an_extra_that_provides_the_plugin() -> None:
    meta = PYPROJECTS["deepinfer"]["project"]["optional-dependencies"]
    declared = declared_entry_points()
    for registry in plugins.REGISTRIES:
        for name, hint in registry.hints.items():
            req = Requirement(hint)
            assert req.name == "deepinfer" and len(req.extras) == 1, hint
            (extra,) = req.extras
            installs = {Requirement(r).name for r in meta[extra]}
            assert declared[registry.group][name] in installs, (registry.group, name, hint)


def test_dependency_arrows() -> None:
    recipe_deps = {
        Requirement(r).name for r in PYPROJECTS["deepseek-recipe"]["project"]["dependencies"]
    }
    assert not recipe_deps & {"torch", "deepinfer-core", "torch-npu"}
    core_deps = {
        Requirement(r).name for r in PYPROJECTS["deepinfer-core"]["project"]["dependencies"]
    }
    assert not {d for d in core_deps if d.startswith("deepinfer-")}, (
        "core never depends on a plugin"
    )
    for pkg, data in PYPROJECTS.items():
        assert "torch-npu" not in {
            Requirement(r).name for r in data["project"].get("dependencies", [])
        }, pkg
    code = (
        "import sys, deepseek_recipe;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'deepinfer')];"
        "assert not bad, bad;"
        "import deepinfer.cli, deepinfer.info;"
        "bad = [m for m in sys.modules if m.startswith(('deepinfer_', 'torch_npu', 'triton'))];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _copy_workspace(dst: Path) -> Path:
    for src in ROOT.glob("packages/*/pyproject.toml"):
        target = dst / src.relative_to(ROOT)
        target.parent.mkdir(parents=True)
        shutil.copy(src, target)
    for src in ROOT.glob("packages/*/src/*/__about__.py"):
        target = dst / src.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, target)
    return dst


def _check_pins(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools/check_pins.py"), str(root)],
        check=False,
        capture_output=True,
        text=True,
    )


def test_check_pins_passes_on_the_tree() -> None:
    res = _check_pins(ROOT)
    assert res.returncode == 0, res.stdout
    assert "checked 7 packages, 0 bad pins" in res.stdout


@pytest.mark.parametrize("edit", ["bump", "bad_extra"])
def test_check_pins_catches_a_bad_pin(tmp_path: Path, edit: str) -> None:
    root = _copy_workspace(tmp_path)
    if edit == "bump":  # core moves to 0.2 while siblings still pin <0.2
        about = root / "packages/deepinfer-core/src/deepinfer/__about__.py"
        about.write_text('__version__ = "0.2.0"\n')
    else:  # the meta package's sm100 extra pins a range that excludes the tree
        meta = root / "packages/deepinfer/pyproject.toml"
        text = meta.read_text()
        meta.write_text(
            text.replace(
                'sm100 = ["deepinfer-kernels-sm100>=0.1,<0.2"]',
                'sm100 = ["deepinfer-kernels-sm100>=0.2,<0.3"]',
            )
        )
    res = _check_pins(root)
    assert res.returncode == 1
    if edit == "bump":
        assert "but the tree has deepinfer-core 0.2.0" in res.stdout
        assert "packages/deepinfer-kernels-sm100/pyproject.toml" in res.stdout
    else:
        assert "packages/deepinfer/pyproject.toml: extra 'sm100' pins" in res.stdout


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```", 2)[1]
    lines = block.splitlines()[1:]  # the first line is the fence's language tag
    commands = [line for line in lines if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, commands
    test_command = commands[1].strip()
    assert test_command in (ROOT / ".ci/run").read_text()
