"""Message content as segments, the way every protocol's history flattens it.

Each protocol names its content parts differently, but the flattened result
follows one set of rules: parts are separated by a blank line, neighbouring
text merges into one segment, an image the model cannot take becomes a fixed
text, and an image URL is a data URL or a web URL by its scheme.
"""

from __future__ import annotations

from collections.abc import Sequence

from deepseek_recipe.image_sources import ImageDetail
from deepseek_recipe.messages import DataUrlImageSource, ImageSource, Segment, UrlImageSource

#: Between two content parts (and two text blocks of one turn).
PART_SEPARATOR = "\n\n"
#: What an image becomes for a model without image input (V4).
UNSUPPORTED_IMAGE = "[Unsupported Image]"


def merge_text(segments: list[Segment]) -> list[Segment]:
    """Neighbouring text segments joined, so placeholders alone split the text."""
    out: list[Segment] = []
    for seg in segments:
        if isinstance(seg, str) and out and isinstance(out[-1], str):
            out[-1] += seg
        else:
            out.append(seg)
    return out


def segments_text(segments: Sequence[Segment]) -> str:
    """The text of the segments, image placeholders left out."""
    return "".join(seg for seg in segments if isinstance(seg, str))


def url_image_source(url: str, detail: ImageDetail, path: str) -> ImageSource:
    """The source of an image given by URL, recorded at request location `path`."""
    if url.startswith("data:"):
        return DataUrlImageSource(url, detail, path=path)
    return UrlImageSource(url, detail, path=path)
