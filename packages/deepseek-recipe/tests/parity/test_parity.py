"""Parity with the official deepseek-recipe 0.2.0 on generated requests and outputs.

The official wheel imports under the same name as this package, so it runs in
its own interpreter (named by DEEPSEEK_RECIPE_ORACLE_PYTHON; see
tools/recipe_oracle_venv.sh).  Both sides run the same harness, oracle_dump.py.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest

import deepseek_recipe

load = runpy.run_path(str(Path(__file__).with_name("_oracle.py")))["load"]
oracle = load("_oracle")

RENDER_CASES = 800
STREAM_CASES = 1000
DIRECT_CASES = 1000


def _check(cases: list[dict[str, Any]], tmp_path: Path) -> None:
    oracle.check_dump(
        deepseek_recipe, "oracle_dump", cases, tmp_path, case_chars=600, value_chars=500
    )


@pytest.mark.parity
def test_render_parity(tmp_path: Path) -> None:
    _check(load("generate").render_cases(seed=1234, count=RENDER_CASES), tmp_path)


@pytest.mark.parity
def test_stream_parity(tmp_path: Path) -> None:
    encode = deepseek_recipe.Tokenizer.default_v4().encode
    _check(load("generate").stream_cases(seed=99, count=STREAM_CASES, encode=encode), tmp_path)


@pytest.mark.parity
def test_api_probe_parity(tmp_path: Path) -> None:
    _check([{"kind": "probe", "name": name} for name in load("probes").PROBES], tmp_path)


@pytest.mark.parity
def test_direct_render_parity(tmp_path: Path) -> None:
    _check(load("generate").direct_cases(seed=7, count=DIRECT_CASES), tmp_path)
