"""Parity with the official deepseek-recipe 0.2.0 on generated requests and outputs.

The official wheel imports under the same name as this package, so it runs in
its own interpreter (named by DEEPSEEK_RECIPE_ORACLE_PYTHON; see
tools/recipe_oracle_venv.sh).  Both sides run the same harness, oracle_dump.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import deepseek_recipe

HERE = Path(__file__).parent
RENDER_CASES = 800
STREAM_CASES = 1000
DIRECT_CASES = 1000
MAX_REPORTED = 8


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_recipe_parity_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _oracle_python() -> str:
    python = os.environ.get("DEEPSEEK_RECIPE_ORACLE_PYTHON")
    if not python:
        pytest.skip(
            "DEEPSEEK_RECIPE_ORACLE_PYTHON is not set (create one with tools/recipe_oracle_venv.sh)"
        )
    return python


def _run_oracle(python: str, cases: list[dict[str, Any]], tmp_path: Path) -> list[Any]:
    cases_path = tmp_path / "cases.json"
    out_path = tmp_path / "oracle.json"
    cases_path.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run(
        [python, "-I", str(HERE / "oracle_dump.py"), str(cases_path), str(out_path)],
        check=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    return json.loads(out_path.read_text(encoding="utf-8"))


def _compare(cases: list[dict[str, Any]], ours: list[Any], theirs: list[Any]) -> None:
    mismatches = [(i, o, t) for i, (o, t) in enumerate(zip(ours, theirs, strict=True)) if o != t]
    report = []
    for i, o, t in mismatches[:MAX_REPORTED]:
        report.append(f"case {i}: {json.dumps(cases[i], ensure_ascii=False)[:600]}")
        for key in sorted(set(o) | set(t)):
            if o.get(key) != t.get(key):
                report.append(f"  {key}: ours={json.dumps(o.get(key), ensure_ascii=False)[:500]}")
                report.append(
                    f"  {key}: official={json.dumps(t.get(key), ensure_ascii=False)[:500]}"
                )
    assert not mismatches, f"{len(mismatches)}/{len(cases)} cases differ\n" + "\n".join(report)


@pytest.mark.parity
def test_render_parity(tmp_path: Path) -> None:
    python = _oracle_python()
    gen, dump = _load("generate"), _load("oracle_dump")
    cases = gen.render_cases(seed=1234, count=RENDER_CASES)
    theirs = _run_oracle(python, cases, tmp_path)
    ours = json.loads(json.dumps(dump.run_all(deepseek_recipe, cases), ensure_ascii=False))
    _compare(cases, ours, theirs)


@pytest.mark.parity
def test_stream_parity(tmp_path: Path) -> None:
    python = _oracle_python()
    gen, dump = _load("generate"), _load("oracle_dump")
    tokenizer = deepseek_recipe.Tokenizer.default_v4()
    cases = gen.stream_cases(seed=99, count=STREAM_CASES, encode=tokenizer.encode)
    theirs = _run_oracle(python, cases, tmp_path)
    ours = json.loads(json.dumps(dump.run_all(deepseek_recipe, cases), ensure_ascii=False))
    _compare(cases, ours, theirs)


@pytest.mark.parity
def test_api_probe_parity(tmp_path: Path) -> None:
    python = _oracle_python()
    dump, probes = _load("oracle_dump"), _load("probes")
    cases = [{"kind": "probe", "name": name} for name in probes.PROBES]
    theirs = _run_oracle(python, cases, tmp_path)
    ours = json.loads(json.dumps(dump.run_all(deepseek_recipe, cases), ensure_ascii=False))
    _compare(cases, ours, theirs)


@pytest.mark.parity
def test_direct_render_parity(tmp_path: Path) -> None:
    python = _oracle_python()
    gen, dump = _load("generate"), _load("oracle_dump")
    cases = gen.direct_cases(seed=7, count=DIRECT_CASES)
    theirs = _run_oracle(python, cases, tmp_path)
    ours = json.loads(json.dumps(dump.run_all(deepseek_recipe, cases), ensure_ascii=False))
    _compare(cases, ours, theirs)
