"""Parity of the image API with the official deepseek-recipe 0.2.0.

Token counts over thousands of sizes (extremes, thin strips, the area and token
edges), preprocessing of hundreds of generated images under varied options,
resolver limits, data-URL and URL handling, and constructor and argument
errors.  The official wheel runs in its own interpreter (named by
DEEPSEEK_RECIPE_ORACLE_PYTHON); both sides run image_harness.py.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import deepseek_recipe
from deepseek_recipe.errors import CalcResizeError, ImageError
from deepseek_recipe.image_preprocess import OpenCvImagePreprocessor, PreprocessOptions
from deepseek_recipe.image_resolver import ImageQuota, ImageResolver, ReqwestImageFetcher
from deepseek_recipe.image_sources import BytesImageSource, DataUrlImageSource, UrlImageSource
from deepseek_recipe.images import ImageInfo, MultiModalData

load = runpy.run_path(str(Path(__file__).with_name("_oracle.py")))["load"]
oracle = load("_oracle")

TOKEN_SIZES = 30_000
PREPROCESS_CASES = 500


def _refuse(url: str) -> bytes:
    raise AssertionError(f"parity cases must never reach a download ({url})")


class _ParityFetcher(ReqwestImageFetcher):
    """A fetcher with a transport that must never run: every case's filter rejects first."""

    def __init__(self) -> None:
        super().__init__(transport=_refuse)


def ours() -> SimpleNamespace:
    """This package's image API under the official names."""
    return SimpleNamespace(
        ImageInfo=ImageInfo,
        MultiModalData=MultiModalData,
        PreprocessOptions=PreprocessOptions,
        OpenCvImagePreprocessor=OpenCvImagePreprocessor,
        ImageResolver=ImageResolver,
        ImageQuota=ImageQuota,
        ReqwestImageFetcher=_ParityFetcher,
        BytesImageSource=BytesImageSource,
        DataUrlImageSource=DataUrlImageSource,
        UrlImageSource=UrlImageSource,
        ImageError=ImageError,
        CalcResizeError=CalcResizeError,
        ChatCompletionRequest=deepseek_recipe.ChatCompletionRequest,
        ConversionOptions=deepseek_recipe.ConversionOptions,
        DeepseekV41Encoding=deepseek_recipe.DeepseekV41Encoding,
    )


def _compare(cases: list[dict[str, Any]], mine: list[Any], theirs: list[Any]) -> None:
    assert len(mine) == len(theirs)
    report = []
    mismatches = 0
    for case, a, b in zip(cases, mine, theirs, strict=True):
        if a == b:
            continue
        mismatches += 1
        if len(report) < oracle.MAX_REPORTED * 3:
            shown = {k: v for k, v in case.items() if k != "sizes"}
            report.append(f"case {json.dumps(shown)[:300]}")
            if case["kind"] == "tokens":
                diffs = [
                    (size, x, y)
                    for size, x, y in zip(case["sizes"], a["counts"], b["counts"], strict=True)
                    if x != y
                ]
                report.append(f"  {len(diffs)} sizes differ, first: {diffs[:5]}")
            else:
                report.append(f"  ours    ={json.dumps(a)[:400]}")
                report.append(f"  official={json.dumps(b)[:400]}")
    assert not mismatches, f"{mismatches}/{len(cases)} cases differ\n" + "\n".join(report)


def _run(cases: list[dict[str, Any]], image_dir: Path, tmp_path: Path) -> None:
    harness = load("image_harness")
    python = oracle.oracle_python()
    theirs = oracle.run_oracle(
        python, "image_harness.py", cases, tmp_path, image_dir=image_dir, timeout=900
    )
    mine = harness.run_all(ours(), cases, image_dir)
    _compare(cases, mine, theirs)


@pytest.mark.parity
def test_image_token_count_parity(tmp_path: Path) -> None:
    gen = load("image_generate")
    cases = gen.token_cases(seed=41, count=TOKEN_SIZES)
    _run(cases, tmp_path, tmp_path)


@pytest.mark.parity
def test_image_preprocess_parity(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    gen = load("image_generate")
    cases = gen.preprocess_cases(seed=17, count=PREPROCESS_CASES, image_dir=tmp_path)
    cases += gen.special_preprocess_cases(tmp_path)
    cases += gen.truncation_cases(tmp_path)
    _run(cases, tmp_path, tmp_path)


@pytest.mark.parity
def test_image_resolver_parity(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    gen = load("image_generate")
    gen.special_files(tmp_path)
    _run(gen.resolve_cases(), tmp_path, tmp_path)


@pytest.mark.parity
def test_image_api_parity(tmp_path: Path) -> None:
    gen, harness = load("image_generate"), load("image_harness")
    _run(gen.api_cases(harness.api_probe_names()), tmp_path, tmp_path)


@pytest.mark.parity
def test_image_token_accounting_parity(tmp_path: Path) -> None:
    gen = load("image_generate")
    _run(gen.accounting_cases(seed=5, count=300), tmp_path, tmp_path)
