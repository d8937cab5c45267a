"""Run image parity cases through an image API and dump comparable JSON results.

Both sides run this file: the official wheel's interpreter runs it as a script
(``python image_harness.py CASES.json IMAGE_DIR OUT.json``) against the official
`deepseek_recipe`, and the parity test imports it and passes this package's
image classes.  Image bytes come from files the test writes beforehand, so the
official interpreter needs no imaging library of its own.

Case kinds:

* ``tokens``: ``sizes`` of `ImageInfo` objects; the token count of each
  (``image_token_adjustment() + 1`` for a one-image `MultiModalData`) and the
  adjustment of all of them together.
* ``preprocess``: one image ``file`` and ``options`` (detail, max side, low-detail
  side) through `OpenCvImagePreprocessor.preprocess`.
* ``resolve``: ``sources`` through `ImageResolver.resolve`, ``calls`` times with one
  `ImageQuota`, with a fetcher whose destination filter rejects every address.
* ``accounting``: a V4.1 Chat Completions ``body`` with image parts is converted
  and rendered; its image sources (kind, detail, request path) are reported, the
  images get ``sizes``, and `resolve_max_tokens` runs on each ``(prompt, limit)``
  pair with the prompt counted as the placeholder prompt plus the image token
  adjustment, as a server does before inference.
* ``api``: a named probe of constructors, properties and argument errors.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def error_json(exc: BaseException) -> dict[str, Any]:
    """The comparable part of an exception: type name, message, and image error fields."""
    out: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if hasattr(exc, "kind"):
        out["kind"] = exc.kind
        out["retryable"] = exc.is_retryable
    return out


def _image_bytes(image_dir: Path, name: str) -> bytes:
    return (image_dir / name).read_bytes()


def _tokens(api: Any, case: dict[str, Any]) -> dict[str, Any]:
    counts: list[Any] = []
    infos = []
    for width, height in case["sizes"]:
        try:
            info = api.ImageInfo(b"", width, height)
        except Exception as exc:
            counts.append(error_json(exc))
            continue
        infos.append(info)
        try:
            counts.append(api.MultiModalData([info]).image_token_adjustment() + 1)
        except Exception as exc:
            counts.append(error_json(exc))
    try:
        total: Any = api.MultiModalData(infos).image_token_adjustment()
    except Exception as exc:
        total = error_json(exc)
    return {"counts": counts, "adjustment": total}


def _info_json(api: Any, info: Any) -> dict[str, Any]:
    data = info.data
    return {
        "size": [info.width, info.height],
        "tokens": api.MultiModalData([info]).image_token_adjustment() + 1,
        "webp": data[:4] == b"RIFF" and data[8:12] == b"WEBP",
    }


def _preprocess(api: Any, case: dict[str, Any], image_dir: Path) -> dict[str, Any]:
    data = _image_bytes(image_dir, case["file"])
    try:
        options = api.PreprocessOptions(*case["options"])
        info = api.OpenCvImagePreprocessor().preprocess(data, options)
    except Exception as exc:
        return {"error": error_json(exc)}
    return _info_json(api, info)


def _source(api: Any, spec: dict[str, Any], image_dir: Path) -> Any:
    detail = spec.get("detail", "high")
    path = spec.get("path", "")
    kind = spec["type"]
    if kind == "bytes":
        data = _image_bytes(image_dir, spec["file"]) if "file" in spec else b""
        data = data[: spec["truncate"]] if "truncate" in spec else data
        data += bytes.fromhex(spec.get("append_hex", "")) * spec.get("append_times", 1)
        return api.BytesImageSource(data, detail, path=path)
    if kind == "data_url":
        url = spec["prefix"]
        if "file" in spec:
            url += base64.b64encode(_image_bytes(image_dir, spec["file"])).decode("ascii")
        url += spec.get("suffix", "") * spec.get("suffix_times", 1)
        return api.DataUrlImageSource(url, detail, path=path)
    url = spec["url"] + spec.get("suffix", "") * spec.get("suffix_times", 1)
    return api.UrlImageSource(url, detail, path=path)


def _resolve(api: Any, case: dict[str, Any], image_dir: Path) -> dict[str, Any]:
    fetcher = api.ReqwestImageFetcher().with_destination_filter(lambda host, address: False)
    resolver = api.ImageResolver(fetcher, api.OpenCvImagePreprocessor())
    quota = api.ImageQuota()
    sources = [_source(api, spec, image_dir) for spec in case["sources"]]
    calls: list[Any] = []
    for _ in range(case.get("calls", 1)):
        try:
            data = resolver.resolve(sources, quota)
            calls.append({"images": [_info_json(api, info) for info in data.images]})
        except Exception as exc:
            calls.append({"error": error_json(exc)})
        calls[-1]["quota"] = [quota.image_count(), quota.byte_size()]
    return {"calls": calls}


def _accounting(api: Any, case: dict[str, Any]) -> dict[str, Any]:
    try:
        request = api.ChatCompletionRequest(case["body"]).convert(api.ConversionOptions())
    except Exception as exc:
        return {"convert_error": error_json(exc)}
    rendered = api.DeepseekV41Encoding().render_conversation(request.conversation)
    sources = [[s.kind, s.detail, s.path] for s in rendered.image_sources]
    sizes = case["sizes"][: len(sources)]
    adjustment = api.MultiModalData([api.ImageInfo(b"", w, h) for w, h in sizes])
    extra = adjustment.image_token_adjustment()
    resolved: list[Any] = []
    for prompt, limit in case["budgets"]:
        try:
            resolved.append(request.resolve_max_tokens(prompt + extra, limit))
        except Exception as exc:
            resolved.append(error_json(exc))
    return {"sources": sources, "adjustment": extra, "resolved": resolved}


def _attempt(fn: Callable[[], Any]) -> Any:
    try:
        value = fn()
    except Exception as exc:
        return {"error": error_json(exc)}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    return {"value": value}


def _api_probes(api: Any) -> dict[str, Callable[[], Any]]:
    info = api.ImageInfo
    mmd = api.MultiModalData
    opts = api.PreprocessOptions
    fetcher = api.ReqwestImageFetcher
    sample = info(b"ab", 3, 4)
    return {
        "info_bytes": lambda: info(b"ab", 1, 2).data,
        "info_bytearray": lambda: info(bytearray(b"ab"), 1, 2).data,
        "info_list": lambda: info([97, 98], 1, 2).data,
        "info_memoryview": lambda: info(memoryview(b"ab"), 1, 2).data,
        "info_byte_overflow": lambda: info([256], 1, 2),
        "info_str": lambda: info("ab", 1, 2),
        "info_none": lambda: info(None, 1, 2),
        "info_float": lambda: info(b"", 1.5, 2),
        "info_bool": lambda: info(b"", True, 2).width,
        "info_negative": lambda: info(b"", -1, 2),
        "info_u32_overflow": lambda: info(b"", 1, 2**32),
        "info_i64_overflow": lambda: info(b"", 1, 2**70),
        "info_keywords": lambda: [info(data=b"x", width=5, height=6).width, sample.height],
        "mmd_none": lambda: mmd(None).is_empty(),
        "mmd_empty": lambda: [mmd().is_empty(), mmd().image_token_adjustment()],
        "mmd_int": lambda: mmd([1]),
        "mmd_info": lambda: mmd(sample),
        "mmd_str": lambda: mmd("ab"),
        "mmd_tuple": lambda: [(i.width, i.height, i.data.hex()) for i in mmd((sample,)).images],
        "mmd_copies": lambda: [mmd([sample]).images[0] is sample, len(mmd([sample] * 3).images)],
        "mmd_many": lambda: mmd([info(b"", 5, 5)] * 1000).image_token_adjustment(),
        "options_values": lambda: [
            [o.detail, o.max_dimension_px, o.low_detail_max_dimension_px]
            for o in (opts("low", 1, 2), opts("auto", 0, 2**32 - 1))
        ],
        "options_bad_detail": lambda: opts("bogus", 1, 2),
        "options_upper_detail": lambda: opts("LOW", 1, 2),
        "options_none_detail": lambda: opts(None, 1, 2),
        "options_negative": lambda: opts("low", -1, 2),
        "options_u32_overflow": lambda: opts("low", 2**32, 2),
        "options_float": lambda: opts("low", 1.5, 2),
        "options_keywords": lambda: (
            opts(detail="high", max_dimension_px=7, low_detail_max_dimension_px=8).max_dimension_px
        ),
        "quota_new": lambda: [api.ImageQuota().image_count(), api.ImageQuota().byte_size()],
        "fetcher_max_bytes_negative": lambda: fetcher.with_max_bytes(-1),
        "fetcher_filter_not_callable": lambda: fetcher().with_destination_filter(5),
        "fetcher_rejected": lambda: (
            fetcher().with_destination_filter(lambda h, a: False).fetch("http://127.0.0.1:9/a.png")
        ),
        "fetcher_rejected_non_bool": lambda: (
            fetcher().with_destination_filter(lambda h, a: 1).fetch("http://127.0.0.1:9/a.png")
        ),
        "fetcher_rejected_raises": lambda: (
            fetcher().with_destination_filter(lambda h, a: 1 / 0).fetch("http://[::1]:9/a.png")
        ),
        "resolver_bad_fetcher": lambda: api.ImageResolver(None, api.OpenCvImagePreprocessor()),
        "resolver_bad_preprocessor": lambda: api.ImageResolver(fetcher(), None),
        "resolve_empty": lambda: (
            api.ImageResolver(fetcher(), api.OpenCvImagePreprocessor())
            .resolve([], api.ImageQuota())
            .is_empty()
        ),
        "preprocess_bad_options": lambda: api.OpenCvImagePreprocessor().preprocess(b"x", None),
        "preprocess_str": lambda: api.OpenCvImagePreprocessor().preprocess("x", opts("high", 1, 1)),
        "source_bad_detail": lambda: api.UrlImageSource("u", "bogus"),
        "source_none_detail": lambda: api.UrlImageSource("u", None),
        "source_bytes_str": lambda: api.BytesImageSource("str"),
        "source_bytes_list": lambda: api.BytesImageSource([1, 2]).data,
        "source_url_bytes": lambda: api.UrlImageSource(b"u"),
        "source_path_none": lambda: api.UrlImageSource("u", path=None),
        "source_reprs": lambda: [
            repr(api.DataUrlImageSource('data:image/png;base64,AA"\\\n', "auto", path="p")),
            repr(api.UrlImageSource("http://x/" + "a" * 300, "low")),
            repr(api.BytesImageSource(b"abc", "original")),
        ],
    }


def _api(api: Any, case: dict[str, Any]) -> dict[str, Any]:
    return _attempt(_api_probes(api)[case["name"]])


def api_probe_names() -> list[str]:
    """Names of the ``api`` probes, taken from a stand-in API object."""
    stub = SimpleNamespace(
        ImageInfo=lambda *a, **k: SimpleNamespace(),
        MultiModalData=None,
        PreprocessOptions=None,
        ReqwestImageFetcher=None,
    )
    return sorted(_api_probes(stub))


def run_case(api: Any, case: dict[str, Any], image_dir: Path) -> dict[str, Any]:
    """Run one case and return its JSON-ready result."""
    kind = case["kind"]
    if kind == "tokens":
        return _tokens(api, case)
    if kind == "preprocess":
        return _preprocess(api, case, image_dir)
    if kind == "resolve":
        return _resolve(api, case, image_dir)
    if kind == "accounting":
        return _accounting(api, case)
    return _api(api, case)


def run_all(api: Any, cases: list[dict[str, Any]], image_dir: Path) -> list[dict[str, Any]]:
    """Run every case in order."""
    results = [run_case(api, case, image_dir) for case in cases]
    return json.loads(json.dumps(results))


def main() -> None:
    import deepseek_recipe as api

    cases = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    results = run_all(api, cases, Path(sys.argv[2]))
    Path(sys.argv[3]).write_text(json.dumps(results), encoding="utf-8")


if __name__ == "__main__":
    main()
