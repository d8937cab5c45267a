"""Seeded image parity cases, and the image files they read.

Sizes concentrate where the resize policy has edges: tiny images that are
scaled up to the minimum area, images near the 1024-token cap, thin strips whose
solved size passes the WebP side limit, the 8192-pixel rejection limit, and
the low-detail limit.  Image files are solid-colour pictures written with
Pillow; sizes, token counts and error kinds depend on the header and on whether
the picture decodes, never on the pixel values.
"""

from __future__ import annotations

import io
import math
import random
from pathlib import Path
from typing import Any

U32_MAX = 2**32 - 1
FORMATS = ("PNG", "JPEG", "GIF", "WEBP")


def token_sizes(seed: int, count: int) -> list[list[int]]:
    """Image sizes for token counting: extremes, edges and random sizes."""
    rng = random.Random(seed)
    sizes: list[list[int]] = [
        [0, 0],
        [0, 10],
        [10, 0],
        [1, 1],
        [U32_MAX, 1],
        [1, U32_MAX],
        [U32_MAX, U32_MAX],
        [U32_MAX, 0],
        [544, 544],
        [543, 545],
        [1260, 1260],
        [1261, 1261],
        [640, 480],
        [1024, 768],
        [1920, 1080],
    ]
    for side in range(1, 3000, 7):
        sizes.append([side, side])
    while len(sizes) < count:
        roll = rng.random()
        if roll < 0.25:
            width, height = rng.randint(1, 3000), rng.randint(1, 3000)
        elif roll < 0.45:
            width, height = rng.randint(1, 60), rng.randint(1, 200_000)
        elif roll < 0.55:
            width, height = rng.randint(1, 42 * 40), rng.randint(1, 42 * 40)
            width -= width % 42 if rng.random() < 0.5 else 0
        elif roll < 0.75:
            width = int(math.exp(rng.random() * math.log(U32_MAX)))
            height = int(math.exp(rng.random() * math.log(U32_MAX)))
        else:
            width, height = rng.randint(0, 25_000), rng.randint(0, 25_000)
        if rng.random() < 0.5:
            width, height = height, width
        sizes.append([width, height])
    return sizes[:count]


def _encode(width: int, height: int, fmt: str, mode: str, shade: int) -> bytes:
    from PIL import Image

    colour: Any
    if mode == "RGBA":
        colour = (shade, 255 - shade, 90, 128)
    elif mode == "LA":
        colour = (shade, 0)
    elif mode == "L":
        colour = shade
    else:
        colour = (shade, 255 - shade, 40)
    image = Image.new(mode, (width, height), colour)
    if fmt == "JPEG" and mode in ("RGBA", "LA"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def _random_size(rng: random.Random) -> tuple[int, int]:
    roll = rng.random()
    if roll < 0.3:
        width, height = rng.randint(1, 2600), rng.randint(1, 2600)
    elif roll < 0.5:
        width, height = rng.randint(1, 40), rng.randint(1, 20_000)
    elif roll < 0.6:
        width, height = rng.randint(1, 12), rng.randint(1, 9000)
    else:
        width = int(math.exp(rng.random() * math.log(9000)))
        height = int(math.exp(rng.random() * math.log(9000)))
    if rng.random() < 0.5:
        width, height = height, width
    return max(1, width), max(1, height)


def _random_options(rng: random.Random) -> list[Any]:
    return rng.choice(
        [
            ["high", 8192, 512],
            ["low", 8192, 512],
            ["auto", 8192, 512],
            ["original", 8192, 512],
            ["low", 20_000, rng.randint(0, 3000)],
            ["high", rng.randint(1, 20_000), 512],
            ["low", rng.randint(1, 20_000), rng.randint(0, 20_000)],
            ["low", 8192, 2**31],
            ["high", 2**31, 512],
            ["low", 8192, 2**31 - 1],
        ]
    )


def preprocess_cases(seed: int, count: int, image_dir: Path) -> list[dict[str, Any]]:
    """Random images (format, size, colour mode) with random options; writes the files."""
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = []
    index = 0
    while len(cases) < count:
        width, height = _random_size(rng)
        if width * height > 6_000_000:
            continue
        fmt = rng.choice(FORMATS)
        if fmt == "WEBP" and max(width, height) > 16383:
            fmt = "PNG"
        mode = rng.choice(["RGB", "RGB", "RGBA", "L", "LA"])
        name = f"pre_{index}.{fmt.lower()}"
        (image_dir / name).write_bytes(_encode(width, height, fmt, mode, rng.randint(0, 255)))
        cases.append(
            {
                "kind": "preprocess",
                "file": name,
                "options": _random_options(rng),
                "recipe": [width, height, fmt, mode],
            }
        )
        index += 1
    return cases


def special_files(image_dir: Path) -> dict[str, bytes]:
    """Hand-made inputs: other formats, broken headers, animation, 16-bit and palettes."""
    from PIL import Image

    files: dict[str, bytes] = {}

    def save(name: str, image: Any, fmt: str, **kwargs: Any) -> None:
        buffer = io.BytesIO()
        image.save(buffer, fmt, **kwargs)
        files[name] = buffer.getvalue()

    rgb = Image.new("RGB", (640, 480), (10, 20, 30))
    for fmt in ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"):
        save(f"rgb_640x480.{fmt.lower().replace('jpeg', 'jpg')}", rgb, fmt)
    save("rgb_10x10.png", Image.new("RGB", (10, 10), (200, 100, 50)), "PNG")
    save("progressive.jpg", Image.new("RGB", (900, 300), (1, 2, 3)), "JPEG", progressive=True)
    frames = [Image.new("RGB", (40, 30), (i * 50, 0, 0)) for i in range(3)]
    save("anim_40x30.gif", frames[0], "GIF", save_all=True, append_images=frames[1:])
    wide16 = Image.new("I;16", (600, 300))
    wide16.paste(40000, (0, 0, 600, 300))
    save("gray16_600x300.png", wide16, "PNG")
    palette = Image.new("P", (700, 200))
    palette.putpalette([0, 0, 255] * 256)
    save("palette_700x200.png", palette, "PNG", transparency=0)
    save("rgba_64x32.webp", Image.new("RGBA", (64, 32), (0, 255, 0, 0)), "WEBP")
    save("lossless_300x5.webp", Image.new("RGB", (300, 5), (9, 9, 9)), "WEBP", lossless=True)
    save("cmyk_500x500.jpg", Image.new("CMYK", (500, 500), (10, 20, 30, 40)), "JPEG")
    png = files["rgb_10x10.png"]
    files["empty.bin"] = b""
    files["junk.bin"] = b"junk"
    files["png_sig_only.png"] = b"\x89PNG"
    files["png_bad_header.png"] = b"\x89PNG\x00\x00\x00\x00WEBP" + b"\x00" * 40
    files["png_truncated.png"] = png[: len(png) // 2]
    files["mobi_png.png"] = png[:60] + b"BOOKMOBI" + png[68:]
    tail = b"WEBP" + b"\x00" * 100
    for label, head in {
        "riff": b"RIFF\x00\x00\x00\x00",
        "mz": b"MZ\x00\x00\x00\x00\x00\x00",
        "bc": b"BC\x00\x00\x00\x00\x00\x00",
        "der": b"\x30\x82\x00\x00\x00\x00\x00\x00",
        "coff": b"\x4c\x01\x00\x00\x00\x00\x00\x00",
        "coff_arm": b"\xc0\x01\x00\x00\x00\x00\x00\x00",
        "elf": b"\x7fELF\x00\x00\x00\x00",
        "macho": b"\xcf\xfa\xed\xfe\x00\x00\x00\x00",
        "fat": b"\xca\xfe\xba\xbe\x00\x00\x00\x00",
        "wasm": b"\x00asm\x01\x00\x00\x00",
        "pem_short": b"-----BEG",
        "zip": b"PK\x03\x04\x00\x00\x00\x00",
        "tiff": b"II*\x00\x00\x00\x00\x00",
        "bmp": b"BM\x00\x00\x00\x00\x00\x00",
    }.items():
        files[f"sniff_{label}.bin"] = head + tail
    for height in (1, 4096, 8192, 8193, 16384, 100_000):
        header = b"\x00\x00\x00\x0dIHDR" + (3).to_bytes(4, "big") + height.to_bytes(4, "big")
        files[f"header_3x{height}.png"] = b"\x89PNG\r\n\x1a\n" + header + b"\x08\x02\x00\x00\x00"
    for name, data in files.items():
        (image_dir / name).write_bytes(data)
    return files


def special_preprocess_cases(image_dir: Path) -> list[dict[str, Any]]:
    """Every special file under the main option sets."""
    names = sorted(special_files(image_dir))
    option_sets = [["high", 8192, 512], ["low", 8192, 512], ["high", 2048, 100], ["low", 600, 0]]
    return [
        {"kind": "preprocess", "file": name, "options": options}
        for name in names
        for options in option_sets
    ]


def truncation_cases(image_dir: Path) -> list[dict[str, Any]]:
    """Each format cut at many lengths: where decoding fails, and as which kind, follows
    the official decoders (the header reader, then OpenCV or the GIF decoder)."""
    from PIL import Image

    image = Image.new("RGB", (64, 48), (10, 200, 30))
    cases: list[dict[str, Any]] = []
    for label, fmt, kwargs in (
        ("png", "PNG", {}),
        ("jpg", "JPEG", {}),
        ("pjpg", "JPEG", {"progressive": True}),
        ("gif", "GIF", {}),
        ("webp", "WEBP", {}),
        ("webpl", "WEBP", {"lossless": True}),
    ):
        buffer = io.BytesIO()
        image.save(buffer, fmt, **kwargs)
        data = buffer.getvalue()
        lengths = sorted({*range(0, len(data), 3), *range(len(data) - 12, len(data) + 1)})
        for length in lengths:
            name = f"cut_{label}_{length}.bin"
            (image_dir / name).write_bytes(data[:length])
            cases.append({"kind": "preprocess", "file": name, "options": ["high", 8192, 512]})
    return cases


def _bytes(name: str, detail: str = "high", **extra: Any) -> dict[str, Any]:
    return {"type": "bytes", "file": name, "detail": detail, **extra}


def resolve_cases() -> list[dict[str, Any]]:
    """Resolver scenarios: limits, quotas, locations, data URLs and URL checks."""
    small = "rgb_10x10.png"
    png64 = "data:image/png;base64,"
    cases: list[list[dict[str, Any]]] = [
        [],
        [_bytes(small)],
        [_bytes(small, path=".messages[1].content[0]")],
        [_bytes("empty.bin", path=".messages[1].content[0]")],
        [_bytes(small), _bytes("junk.bin")],
        [
            _bytes(small, path=".m[0]"),
            _bytes(small, path=".m[0]"),
            _bytes("junk.bin", path=".m[1]"),
        ],
        [
            _bytes(small, path=".m[0]"),
            _bytes(small, path=".m[1]"),
            _bytes("junk.bin", path=".m[0]"),
        ],
        [_bytes(small), _bytes(small, path=".m"), _bytes("junk.bin")],
        [_bytes("empty.bin"), _bytes(small, append_hex="00", append_times=33_554_432)],
        [_bytes("junk.bin"), _bytes(small, append_hex="00", append_times=33_554_432)],
        [_bytes(small, append_hex="00", append_times=33_554_432 - 77)],
        [_bytes(small, append_hex="00", append_times=33_554_432 - 76, path=".big")],
        [_bytes(small, append_hex="00", append_times=31_457_280, path=".p")] * 3,
        [_bytes(small, append_hex="00", append_times=33_554_432 - 77)] * 2,
        [_bytes(small, "low"), _bytes("rgb_640x480.png", "low"), _bytes("rgb_640x480.png")],
        [_bytes("rgb_640x480.jpg", "original"), _bytes("rgb_640x480.webp", "auto")],
        [_bytes("header_3x8192.png"), _bytes("header_3x8193.png")],
        [_bytes("header_3x8193.png", path=".x")],
        [_bytes(small)] * 601,
        [{"type": "url", "url": "ftp://x/a.png"}],
        [{"type": "url", "url": "not a url", "path": ".p"}],
        [{"type": "url", "url": 'ftp://"q"\n\u00e9', "path": ".p"}],
        [{"type": "url", "url": "http://127.0.0.1:9/a.png"}],
        [{"type": "url", "url": "HtTp://127.0.0.1:9/a.png", "path": ".u"}],
        [{"type": "url", "url": "http://[::1]:9/a.png"}],
        [{"type": "url", "url": "http://127.0.0.1/", "suffix": "a", "suffix_times": 8175}],
        [{"type": "url", "url": "http://127.0.0.1/", "suffix": "a", "suffix_times": 8176}],
        [{"type": "url", "url": "http://127.0.0.1/", "suffix": "\u00e9", "suffix_times": 4089}],
        [{"type": "url", "url": "ftp://", "suffix": "a", "suffix_times": 9000}],
        [
            {"type": "url", "url": "http://127.0.0.1/", "suffix": "a", "suffix_times": 9000},
            {"type": "url", "url": "ftp://x"},
        ],
        [_bytes("junk.bin"), {"type": "url", "url": "ftp://x"}],
        [_bytes(small), {"type": "url", "url": "http://127.0.0.1:9/x", "path": ".q"}],
        [{"type": "data_url", "prefix": png64, "file": small}],
        [{"type": "data_url", "prefix": png64, "suffix": "A", "suffix_times": 50_000_000}],
        [{"type": "data_url", "prefix": "x"}, {"type": "url", "url": "ftp://x"}],
        [_bytes("junk.bin"), {"type": "data_url", "prefix": png64 + "!!"}],
    ]
    for prefix in (
        "data:image/jpeg;base64,",
        "data:IMAGE/PNG;base64,",
        "data:image/PNG;BASE64,",
        "data:image/jpg;base64,",
        "data:image/webp;base64,",
        "data:image/gif;base64,",
        "data: image/png ; base64 ,",
        "data:image/png;\tbase64,",
        "data:image/png;base\n64,",
        "d\nata:image/png;base64,",
        " data:image/png;base64,",
        "\x00data:image/png;base64,",
        "data:image/png;foo=bar;base64,",
        'data:image/png;x="a;b";base64,',
        "data:image/png;;base64,",
        "data:image/png;base64;base64,",
        "data:image/png;base64;foo=bar,",
        "data:image/x-png;base64,",
        "data:image/pjpeg;base64,",
        "data:image/bmp;base64,",
        "data:image/*;base64,",
        "data:image;base64,",
        "data:text/plain;base64,",
        "data:application/octet-stream;base64,",
        "data:;base64,",
        "data:;image/png;base64,",
        "data:image/png?x;base64,",
        "data:image/p\u00e9ng;base64,",
        "data:image/png#x;base64,",
        "dat:image/png;base64,",
        "data:image/png,",
    ):
        cases.append([{"type": "data_url", "prefix": prefix, "file": small}])
    for suffix in ("", "=", "==", "#frag", "%", " ", "\n", "\x01", "%3D"):
        cases.append([{"type": "data_url", "prefix": png64, "file": small, "suffix": suffix}])
    for body in (
        "",
        "=",
        "A",
        "AA",
        "AA=",
        "AA==",
        "AAA=",
        "AAAA=",
        "A=A=",
        "!!!",
        "iVBO%3DRw0K",
        "%89PNG",
        "iVBORw0KGgo",
        " i V B O R w 0 K G g o ",
    ):
        cases.append([{"type": "data_url", "prefix": png64 + body}])
    for whole in (
        "data:",
        "data:,",
        "data:image/png",
        "data:image/png;base64",
        "data:text/plain;base64,!!!",
        "data:image/png,%",
        "data:image/png,%zz",
        "nodata",
    ):
        cases.append([{"type": "data_url", "prefix": whole}])
    out = [{"kind": "resolve", "sources": sources} for sources in cases]
    out.append({"kind": "resolve", "sources": [_bytes(small)] * 200, "calls": 4})
    out.append(
        {
            "kind": "resolve",
            "sources": [_bytes(small, append_hex="00", append_times=20_000_000)],
            "calls": 4,
        }
    )
    return out


def token_cases(seed: int, count: int, chunk: int = 1000) -> list[dict[str, Any]]:
    sizes = token_sizes(seed, count)
    return [{"kind": "tokens", "sizes": sizes[i : i + chunk]} for i in range(0, len(sizes), chunk)]


def api_cases(names: list[str]) -> list[dict[str, Any]]:
    return [{"kind": "api", "name": name} for name in names]


def accounting_cases(seed: int, count: int) -> list[dict[str, Any]]:
    """V4.1 requests with image parts, image sizes, and prompt/context budgets."""
    rng = random.Random(seed)
    png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNg"
    cases: list[dict[str, Any]] = []
    for _ in range(count):
        messages: list[dict[str, Any]] = []
        if rng.random() < 0.3:
            messages.append(
                {"role": "system", "content": [{"type": "image_url", "image_url": {"url": png}}]}
            )
        for turn in range(rng.randint(1, 3)):
            parts: list[dict[str, Any]] = [{"type": "text", "text": f"look {turn}"}]
            for _ in range(rng.randint(0, 4)):
                image: dict[str, Any] = {
                    "url": png if rng.random() < 0.5 else f"https://example.com/{turn}.png"
                }
                if rng.random() < 0.5:
                    image["detail"] = rng.choice(["low", "high", "auto"])
                parts.insert(rng.randint(0, len(parts)), {"type": "image_url", "image_url": image})
            messages.append({"role": "user", "content": parts})
            if turn < 2 and rng.random() < 0.6:
                messages.append({"role": "assistant", "content": "ok"})
        if messages[-1]["role"] == "assistant":
            messages.pop()
        body: dict[str, Any] = {"model": "DeepSeek-V4.1-Flash", "messages": messages}
        if rng.random() < 0.5:
            body["max_tokens"] = rng.choice([1, 100, 4096, 65536])
        roll = rng.random()
        if roll < 0.3:
            body["thinking"] = {"type": "disabled"}
        elif roll < 0.5:
            body["reasoning_effort"] = rng.choice(["low", "high", "max"])
        sizes = [[rng.randint(1, 5000), rng.randint(1, 5000)] for _ in range(16)]
        budgets = [
            [rng.randint(0, 3000), rng.choice([4096, 8192, 65536, 131072, 1_048_576])]
            for _ in range(4)
        ]
        cases.append({"kind": "accounting", "body": body, "sizes": sizes, "budgets": budgets})
    return cases
