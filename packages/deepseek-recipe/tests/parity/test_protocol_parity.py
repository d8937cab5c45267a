"""Parity of the Responses and Messages converters with the official deepseek-recipe 0.2.0.

Like test_parity.py, the official wheel runs in its own interpreter (named by
DEEPSEEK_RECIPE_ORACLE_PYTHON; see tools/recipe_oracle_venv.sh) through the same
harness, protocol_dump.py, that runs the cases through this package.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest

import deepseek_recipe

load = runpy.run_path(str(Path(__file__).with_name("_oracle.py")))["load"]
oracle = load("_oracle")

CONVERT_CASES = 700
STREAM_CASES = 500


def _check(cases: list[dict[str, Any]], tmp_path: Path) -> None:
    oracle.check_dump(
        deepseek_recipe, "protocol_dump", cases, tmp_path, case_chars=900, value_chars=700
    )


@pytest.mark.parity
def test_responses_convert_parity(tmp_path: Path) -> None:
    _check(load("protocol_generate").responses_cases(seed=11, count=CONVERT_CASES), tmp_path)


@pytest.mark.parity
def test_messages_convert_parity(tmp_path: Path) -> None:
    _check(load("protocol_generate").messages_cases(seed=12, count=CONVERT_CASES), tmp_path)


@pytest.mark.parity
def test_responses_stream_parity(tmp_path: Path) -> None:
    encode = deepseek_recipe.Tokenizer.default_v4().encode
    cases = load("protocol_generate").stream_cases(13, STREAM_CASES, "responses", encode)
    _check(cases, tmp_path)


@pytest.mark.parity
def test_messages_stream_parity(tmp_path: Path) -> None:
    encode = deepseek_recipe.Tokenizer.default_v4().encode
    cases = load("protocol_generate").stream_cases(14, STREAM_CASES, "messages", encode)
    _check(cases, tmp_path)


@pytest.mark.parity
def test_protocol_probe_parity(tmp_path: Path) -> None:
    probes = load("protocol_probes")
    _check([{"kind": "probe", "name": name} for name in probes.PROBES], tmp_path)
