"""Special-token kinds and their spellings.

Spellings are data, not constants baked into the renderer, because deployments
rename tokens (most often the image placeholder) and the official API lets the
caller override every spelling through `SpecialTokens`.
"""

from __future__ import annotations


class SpecialToken:
    """A kind of special token (enum-like, mirrors the official class attributes)."""

    Bos: SpecialToken
    Eos: SpecialToken
    ThinkingStart: SpecialToken
    ThinkingEnd: SpecialToken
    System: SpecialToken
    User: SpecialToken
    Assistant: SpecialToken
    LatestReminder: SpecialToken
    Dsml: SpecialToken
    Image: SpecialToken
    Ref: SpecialToken
    RefEnd: SpecialToken
    Box: SpecialToken
    BoxEnd: SpecialToken
    Point: SpecialToken
    PointEnd: SpecialToken
    Polygon: SpecialToken
    PolygonEnd: SpecialToken

    def __init__(self, name: str, key: str, default: str) -> None:
        self._name = name
        self._key = key
        self._default = default

    def default_str(self) -> str:
        """Return the default literal spelling of this token."""
        return self._default

    @property
    def key(self) -> str:
        return self._key

    def __repr__(self) -> str:
        return f"SpecialToken.{self._name}"


_DEFAULTS: list[tuple[str, str, str]] = [
    ("Bos", "bos", "<｜begin▁of▁sentence｜>"),
    ("Eos", "eos", "<｜end▁of▁sentence｜>"),
    ("ThinkingStart", "thinking_start", "<think>"),
    ("ThinkingEnd", "thinking_end", "</think>"),
    ("System", "system", "<｜System｜>"),
    ("User", "user", "<｜User｜>"),
    ("Assistant", "assistant", "<｜Assistant｜>"),
    ("LatestReminder", "latest_reminder", "<｜latest_reminder｜>"),
    ("Dsml", "dsml", "｜DSML｜"),
    ("Image", "image", "<｜image｜>"),
    ("Ref", "ref", "<｜ref｜>"),
    ("RefEnd", "ref_end", "<｜/ref｜>"),
    ("Box", "box", "<｜box｜>"),
    ("BoxEnd", "box_end", "<｜/box｜>"),
    ("Point", "point", "<｜point｜>"),
    ("PointEnd", "point_end", "<｜/point｜>"),
    ("Polygon", "polygon", "<｜polygon｜>"),
    ("PolygonEnd", "polygon_end", "<｜/polygon｜>"),
]

for _name, _key, _default in _DEFAULTS:
    setattr(SpecialToken, _name, SpecialToken(_name, _key, _default))

DEFAULT_SPELLINGS: dict[str, str] = {key: default for _, key, default in _DEFAULTS}

#: Token id of the V4.1 image placeholder, as the official package exports it.
IMAGE_SPECIAL_TOKEN_ID = 129264


class SpecialTokens:
    """A mapping from each `SpecialToken` to its spelling; unspecified keywords keep the default."""

    def __init__(
        self,
        *,
        bos: str | None = None,
        eos: str | None = None,
        thinking_start: str | None = None,
        thinking_end: str | None = None,
        system: str | None = None,
        user: str | None = None,
        assistant: str | None = None,
        latest_reminder: str | None = None,
        dsml: str | None = None,
        image: str | None = None,
        ref: str | None = None,
        ref_end: str | None = None,
        box: str | None = None,
        box_end: str | None = None,
        point: str | None = None,
        point_end: str | None = None,
        polygon: str | None = None,
        polygon_end: str | None = None,
    ) -> None:
        given = dict(locals())
        given.pop("self")
        values = dict(DEFAULT_SPELLINGS)
        for key, value in given.items():
            if value is not None:
                values[key] = value
        self._values = values

    def token(self, token: SpecialToken) -> str:
        """Return the spelling of `token` in this mapping."""
        return self._values[token.key]

    def get(self, key: str) -> str:
        """Spelling by keyword name (`"bos"`, `"user"`, ...); used internally by the renderer."""
        return self._values[key]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpecialTokens) and other._values == self._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._values.items() if DEFAULT_SPELLINGS[k] != v}
        inner = ", ".join(f"{k}={v!r}" for k, v in changed.items())
        return f"SpecialTokens({inner})"
