"""Parts of the official API that are not implemented must fail loudly, never pretend to work."""

from __future__ import annotations

import subprocess
import sys

import pytest

import deepseek_recipe as dr

UNSUPPORTED = [
    "ResponsesRequest",
    "ResponsesResponse",
    "ResponsesEcho",
    "ResponsesChunkGenerator",
    "ResponsesStreamEvent",
    "MessagesRequest",
    "MessagesResponse",
    "MessagesChunkGenerator",
    "MessagesStreamEvent",
    "ImageResolver",
    "ReqwestImageFetcher",
    "OpenCvImagePreprocessor",
    "PreprocessOptions",
    "ImageQuota",
]


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_classes_raise(name: str) -> None:
    with pytest.raises(NotImplementedError, match="not implemented"):
        getattr(dr, name)({})


def test_image_token_count_is_not_guessed() -> None:
    assert dr.MultiModalData().image_token_adjustment() == 0
    with pytest.raises(NotImplementedError):
        dr.MultiModalData([dr.ImageInfo(b"png", 640, 480)]).image_token_adjustment()


def test_no_hub_download() -> None:
    with pytest.raises(NotImplementedError):
        dr.Tokenizer.from_pretrained("deepseek-ai/DeepSeek-V4-Pro")


def test_template_entry_point_is_not_implemented() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "deepseek_recipe.template"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "NotImplementedError" in out.stderr
