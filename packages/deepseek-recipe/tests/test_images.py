"""The image API against golden results recorded from the official deepseek-recipe 0.2.0.

tests/data/image_golden.json holds cases and the official wheel's results
(rebuilt by tests/parity/build_image_golden.py).  Token counts, planned sizes,
accounting and argument errors need nothing beyond this package; cases that
decode pictures need Pillow and are skipped without it.  The remaining tests
cover what the official package cannot show offline: the fetch transport.
"""

from __future__ import annotations

import json
import runpy
import urllib.error
import zlib
from pathlib import Path
from typing import Any

import pytest

from deepseek_recipe.data_urls import InvalidDataUrl, parse_data_url
from deepseek_recipe.errors import CalcResizeError, ImageError
from deepseek_recipe.image_preprocess import PreprocessOptions, plan_image_size
from deepseek_recipe.image_resolver import ImageQuota, ImageResolver, ReqwestImageFetcher
from deepseek_recipe.image_sources import BytesImageSource, UrlImageSource
from deepseek_recipe.image_tokens import ImageTokenSpec, image_token_count
from deepseek_recipe.images import ImageInfo, MultiModalData

HERE = Path(__file__).parent
GOLDEN = json.loads((HERE / "data" / "image_golden.json").read_text(encoding="utf-8"))
PAIRS = list(zip(GOLDEN["cases"], GOLDEN["results"], strict=True))
load = runpy.run_path(str(HERE / "parity" / "_oracle.py"))["load"]


def _cases(kind: str) -> list[tuple[dict[str, Any], Any]]:
    return [(case, result) for case, result in PAIRS if case["kind"] == kind]


def _check(pairs: list[tuple[dict[str, Any], Any]], image_dir: Path) -> None:
    harness = load("image_harness")
    api = load("test_image_parity").ours()
    bad = []
    for case, expected in pairs:
        got = harness.run_all(api, [case], image_dir)[0]
        if got != expected:
            bad.append((case, got, expected))
    report = [
        f"{json.dumps({k: v for k, v in c.items() if k != 'sizes'})[:200]}\n"
        f"  ours    ={json.dumps(g)[:300]}\n  official={json.dumps(e)[:300]}"
        for c, g, e in bad[:6]
    ]
    assert not bad, f"{len(bad)}/{len(pairs)} golden cases differ\n" + "\n".join(report)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The golden cases' image files, regenerated with Pillow from their seeds."""
    pytest.importorskip("PIL")
    build = load("build_image_golden")
    path = tmp_path_factory.mktemp("golden_images")
    assert build.golden_cases(path) == GOLDEN["cases"]
    return path


def test_golden_token_counts() -> None:
    pairs = _cases("tokens")
    assert sum(len(case["sizes"]) for case, _ in pairs) >= 6000
    _check(pairs, HERE)


def test_golden_accounting() -> None:
    _check(_cases("accounting"), HERE)


def test_golden_api() -> None:
    _check(_cases("api"), HERE)


def test_golden_preprocess(image_dir: Path) -> None:
    _check(_cases("preprocess"), image_dir)


def test_golden_resolve(image_dir: Path) -> None:
    _check(_cases("resolve"), image_dir)


def test_planned_sizes_match_official_without_decoding() -> None:
    """`plan_image_size` predicts the official output size from the header size alone."""
    checked = 0
    for case, expected in _cases("preprocess"):
        recipe = case.get("recipe")
        if recipe is None:
            continue
        width, height = recipe[0], recipe[1]
        options = PreprocessOptions(*case["options"])
        try:
            got: Any = list(plan_image_size(width, height, options))
        except ImageError as exc:
            got = exc.kind
        want = expected["size"] if "size" in expected else expected["error"]["kind"]
        assert got == want, (case, got, want)
        checked += 1
    assert checked >= 150


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        (640, 480, 206),  # 12 rows x 16 columns: no resize
        (1024, 768, 496),
        (1920, 1080, 968),  # solved down to 23 x 41
        (1, 1, 184),  # scaled up to the 544 x 544 minimum area: 13 x 13
        (2000, 2000, 994),  # capped at 31 x 31
        (1, 10_000, 1024),  # a single column of 511 rows
        (10_000, 1, 1024),  # a single row of 1021 columns
        (0, 0, 2),
        (0, 10, 3),
        (2**32 - 1, 2**32 - 1, 994),
    ],
)
def test_known_token_counts(width: int, height: int, tokens: int) -> None:
    assert image_token_count(width, height) == tokens
    assert MultiModalData([ImageInfo(b"", width, height)]).image_token_adjustment() == tokens - 1


def test_calc_resize_error_message() -> None:
    """A spec that cannot settle raises CalcResizeError with the official wording."""
    # The V4.1 budget always settles; a tiny token budget with a large minimum area
    # makes the scale-up and the budget solve undo each other.
    spec = ImageTokenSpec(patch_size=14, downsample=2, max_tokens=19, min_pixels=17168)
    with pytest.raises(CalcResizeError) as info:
        spec.calc_resize(16, 203)
    assert str(info.value) == (
        "image resize did not converge after 10 iterations, last result: ResizeResult "
        "{ n_llm_h: 8, n_llm_w: 1, best_height: 224, best_width: 14, token_count: 18 }"
    )
    assert isinstance(info.value, ValueError)


def test_data_url_parser() -> None:
    url = parse_data_url("DATA:Image/PNG ; base64 ,aGk=#frag")
    assert (url.mime_essence, url.base64, url.decode()) == ("image/png", True, b"hi")
    assert parse_data_url("data:,%41%4").decode() == b"A%4"
    with pytest.raises(InvalidDataUrl):
        parse_data_url("data:image/png;base64")
    with pytest.raises(InvalidDataUrl):
        parse_data_url("data:image/png;base64,A").decode()


# --- fetch transport: this package never downloads by itself -------------------------------


def _png() -> bytes:
    """A valid 1x1 RGB PNG, built by hand so that no imaging library is needed."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body).to_bytes(4, "big")
        return len(body).to_bytes(4, "big") + kind + body + crc

    header = (1).to_bytes(4, "big") * 2 + bytes((8, 2, 0, 0, 0))
    pixels = zlib.compress(b"\x00\x10\x20\x30")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def test_url_source_without_transport_is_unsupported() -> None:
    resolver = ImageResolver(ReqwestImageFetcher(), _preprocessor())
    quota = ImageQuota()
    with pytest.raises(ImageError) as info:
        resolver.resolve([UrlImageSource("https://example.com/a.png")], quota)
    assert info.value.kind == "Unsupported"
    assert str(info.value).startswith("unsupported operation: ")
    assert "transport" in str(info.value)
    assert (quota.image_count(), quota.byte_size()) == (0, 0)


def _preprocessor() -> Any:
    from deepseek_recipe.image_preprocess import OpenCvImagePreprocessor

    return OpenCvImagePreprocessor()


def test_transport_result_is_resolved() -> None:
    pytest.importorskip("PIL")
    seen: list[str] = []

    def transport(url: str) -> bytes:
        seen.append(url)
        return _png()

    fetcher = ReqwestImageFetcher(transport=transport)
    quota = ImageQuota()
    data = ImageResolver(fetcher, _preprocessor()).resolve(
        [UrlImageSource("https://example.com/a.png", "low"), BytesImageSource(_png())], quota
    )
    assert seen == ["https://example.com/a.png"]
    assert [(i.width, i.height) for i in data.images] == [(546, 546), (546, 546)]
    assert (quota.image_count(), quota.byte_size()) == (2, 2 * len(_png()))


def test_transport_errors_map_to_official_kinds() -> None:
    def fail(exc: Exception) -> ReqwestImageFetcher:
        def transport(url: str) -> bytes:
            raise exc

        return ReqwestImageFetcher().with_transport(transport)

    url = "http://127.0.0.1:9/a.png"
    cases = [
        (OSError("connection refused"), "Fetch", True),
        (urllib.error.HTTPError(url, 503, "busy", {}, None), "FetchStatus", True),  # type: ignore[arg-type]
        (urllib.error.HTTPError(url, 404, "missing", {}, None), "FetchStatus", False),  # type: ignore[arg-type]
    ]
    for exc, kind, retryable in cases:
        with pytest.raises(ImageError) as info:
            fail(exc).fetch(url)
        assert (info.value.kind, info.value.is_retryable) == (kind, retryable)
        assert str(info.value) == f"image[0]: Failed to download image from {url}"


def test_transport_size_limit_and_filter() -> None:
    fetcher = ReqwestImageFetcher.with_max_bytes(3).with_transport(lambda url: b"abcd")
    with pytest.raises(ImageError) as info:
        fetcher.fetch("https://example.com/a")
    assert info.value.kind == "ImageTooLarge"
    assert str(info.value) == "image[0]: image file size exceeds limit 0 MB"

    calls: list[tuple[str, str]] = []

    def allow_loopback(host: str, address: str) -> bool:
        calls.append((host, address))
        return address == "127.0.0.1"

    guarded = fetcher.with_destination_filter(allow_loopback)
    assert guarded.max_bytes == 3
    assert guarded.with_transport(lambda url: b"ok").fetch("http://127.0.0.1/x") == b"ok"
    with pytest.raises(ImageError) as info:
        guarded.fetch("http://example.com/x")
    assert info.value.kind == "DestinationRejected"
    assert calls == [("127.0.0.1", "127.0.0.1"), ("example.com", "example.com")]
    with pytest.raises(TypeError):
        ReqwestImageFetcher(transport=5)  # type: ignore[arg-type]
