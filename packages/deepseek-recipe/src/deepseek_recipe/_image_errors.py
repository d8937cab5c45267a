"""How image failures become the official `ImageError` messages.

The official errors carry a machine-readable `kind` and a client-facing message
that hides decoder internals: every failure to read or convert the picture says
only that the image is unsupported.  The message is prefixed with where the
image came from (`.messages[1].image[0]: `), which is why failures are raised
internally as `ImageFailure` and given their location by the public entry point
that knows it.
"""

from __future__ import annotations

from deepseek_recipe.errors import ImageError

__all__ = ["GENERIC_MESSAGE", "ImageFailure", "image_location", "path_location"]

GENERIC_MESSAGE = (
    "You have uploaded an unsupported image. Please make sure your image is valid and has one "
    "of the following formats: webp, png, jpeg, and gif."
)

# Kinds whose client-facing text is the generic message; the specific reason
# is kept as an exception note for logs.
_GENERIC_KINDS = frozenset(
    {
        "InvalidDataUrl",
        "EmptyImage",
        "UnsupportedMediaType",
        "ImageDimensionsTooLarge",
        "Decode",
        "Resize",
        "Encode",
        "EncodeFailed",
        "TokenBudget",
    }
)


def image_location(path: str, index: int) -> str:
    """The per-image prefix: the request path when known, and the image's index there."""
    return f"{path}.image[{index}]: " if path else f"image[{index}]: "


def path_location(path: str) -> str:
    """The per-request prefix of errors that are not about one decoded image."""
    return f"{path}: " if path else ""


class ImageFailure(Exception):
    """An image failure that does not know its location yet.

    `scope` says which prefix the official message carries: ``"image"`` for the
    image's path and index, ``"path"`` for the request path only, ``"none"`` for
    request-wide errors.
    """

    def __init__(
        self,
        kind: str,
        detail: str = "",
        *,
        text: str | None = None,
        retryable: bool = False,
        scope: str = "image",
    ) -> None:
        super().__init__(detail or text or kind)
        self.kind = kind
        self.detail = detail
        self.text = text
        self.retryable = retryable
        self.scope = scope

    def located(self, path: str = "", index: int = 0) -> ImageError:
        """Build the public error, prefixed with the image's location."""
        if self.text is not None:
            body = self.text
        elif self.kind in _GENERIC_KINDS:
            body = GENERIC_MESSAGE
        else:
            body = self.detail
        if self.scope == "image":
            prefix = image_location(path, index)
        elif self.scope == "path":
            prefix = path_location(path)
        else:
            prefix = ""
        error = ImageError(prefix + body, self.kind, self.retryable)
        if self.detail and self.detail != body:
            error.add_note(self.detail)
        return error
