"""Parity of the Responses and Messages converters with the official deepseek-recipe 0.2.0.

Like test_parity.py, the official wheel runs in its own interpreter (named by
DEEPSEEK_RECIPE_ORACLE_PYTHON; see tools/recipe_oracle_venv.sh) through the same
harness, protocol_dump.py, that runs the cases through this package.
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
CONVERT_CASES = 700
STREAM_CASES = 500
MAX_REPORTED = 8


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_recipe_protocol_{name}", HERE / f"{name}.py")
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
        [python, "-I", str(HERE / "protocol_dump.py"), str(cases_path), str(out_path)],
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
        report.append(f"case {i}: {json.dumps(cases[i], ensure_ascii=False)[:900]}")
        for key in sorted(set(o) | set(t)):
            if o.get(key) != t.get(key):
                report.append(f"  {key}: ours={json.dumps(o.get(key), ensure_ascii=False)[:700]}")
                report.append(
                    f"  {key}: official={json.dumps(t.get(key), ensure_ascii=False)[:700]}"
                )
    assert not mismatches, f"{len(mismatches)}/{len(cases)} cases differ\n" + "\n".join(report)


def _check(cases: list[dict[str, Any]], tmp_path: Path) -> None:
    python = _oracle_python()
    dump = _load("protocol_dump")
    theirs = _run_oracle(python, cases, tmp_path)
    ours = json.loads(json.dumps(dump.run_all(deepseek_recipe, cases), ensure_ascii=False))
    _compare(cases, ours, theirs)


@pytest.mark.parity
def test_responses_convert_parity(tmp_path: Path) -> None:
    _check(_load("protocol_generate").responses_cases(seed=11, count=CONVERT_CASES), tmp_path)


@pytest.mark.parity
def test_messages_convert_parity(tmp_path: Path) -> None:
    _check(_load("protocol_generate").messages_cases(seed=12, count=CONVERT_CASES), tmp_path)


@pytest.mark.parity
def test_responses_stream_parity(tmp_path: Path) -> None:
    encode = deepseek_recipe.Tokenizer.default_v4().encode
    cases = _load("protocol_generate").stream_cases(13, STREAM_CASES, "responses", encode)
    _check(cases, tmp_path)


@pytest.mark.parity
def test_messages_stream_parity(tmp_path: Path) -> None:
    encode = deepseek_recipe.Tokenizer.default_v4().encode
    cases = _load("protocol_generate").stream_cases(14, STREAM_CASES, "messages", encode)
    _check(cases, tmp_path)


@pytest.mark.parity
def test_protocol_probe_parity(tmp_path: Path) -> None:
    probes = _load("protocol_probes")
    _check([{"kind": "probe", "name": name} for name in probes.PROBES], tmp_path)
