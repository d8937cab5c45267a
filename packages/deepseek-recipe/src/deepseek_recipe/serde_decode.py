"""Declarative decoders that type-check request bodies the way serde derives do.

The official package deserializes Responses and Messages bodies with serde and
reports the first problem in serde's words.  Which problem comes first depends
on serde's rules, so the decoders here follow them: a struct checks its fields
in the order the body lists them and only then reports missing fields, in
declaration order; an internally tagged enum reads its `type` tag before any
other field.  Unknown fields are ignored, as serde does by default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from deepseek_recipe import body as b
from deepseek_recipe.errors import body_error

Decoder = Callable[[Any], Any]

#: Marks an internally tagged enum whose unknown tags decode to this value instead of failing.
UNSUPPORTED: Any = type("Unsupported", (), {"__repr__": lambda self: "UNSUPPORTED"})()


@dataclass(frozen=True)
class Field:
    """One struct field.

    `optional` fields accept `null` and default to `None`; `has_default` fields
    may be absent (taking `default`) but must have the right type when present;
    all others are required.
    """

    name: str
    decoder: Decoder
    optional: bool = True
    has_default: bool = False
    default: Any = None


def required(name: str, decoder: Decoder) -> Field:
    return Field(name, decoder, optional=False)


def defaulted(name: str, decoder: Decoder, default: Any) -> Field:
    return Field(name, decoder, optional=False, has_default=True, default=default)


def unknown_variant(value: str, expected: Sequence[str]) -> ValueError:
    """serde's wording, which lists one, two, or "one of" several variants."""
    names = [f"`{e}`" for e in expected]
    if not names:
        listed = "no variants"
    elif len(names) == 1:
        listed = names[0]
    elif len(names) == 2:
        listed = f"{names[0]} or {names[1]}"
    else:
        listed = "one of " + ", ".join(names)
    return body_error(f"unknown variant `{value}`, expected {listed}")


def check_variant(value: Any, names: Sequence[str]) -> str:
    if not isinstance(value, str):
        raise b.invalid_type(value, "variant identifier")
    if value not in names:
        raise unknown_variant(value, names)
    return value


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise b.invalid_type(value, "a string")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise b.invalid_type(value, "a boolean")
    return value


def any_json(value: Any) -> Any:
    return value


def json_map(value: Any) -> dict[str, Any]:
    """Any JSON object (serde's `Map<String, Value>`)."""
    if not isinstance(value, dict):
        raise b.invalid_type(value, "a map")
    return value


def uint(bits: int) -> Decoder:
    kind = f"u{bits}"

    def decode(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise b.invalid_type(value, kind)
        if value < 0 or value >= 2**bits:
            raise body_error(f"invalid value: integer `{value}`, expected {kind}")
        return value

    return decode


def f32(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise b.invalid_type(value, "f32")
    return float(value)


def seq(item: Decoder) -> Decoder:
    def decode(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise b.invalid_type(value, "a sequence")
        return [item(v) for v in value]

    return decode


def variant(names: Sequence[str]) -> Decoder:
    """A unit-variant enum spelled as a string."""

    def decode(value: Any) -> str:
        return check_variant(value, names)

    return decode


def string_or_map_variant(names: Sequence[str]) -> Decoder:
    """A unit-variant enum read by serde's generic enum visitor (a string or a one-key map)."""

    def decode(value: Any) -> str:
        if isinstance(value, str):
            return check_variant(value, names)
        if isinstance(value, dict):
            if len(value) != 1:
                raise body_error("invalid value: map, expected map with a single key")
            key, inner = next(iter(value.items()))
            name = check_variant(key, names)
            if inner is not None:
                raise b.invalid_type(inner, "unit variant")
            return name
        raise b.invalid_type(value, "string or map")

    return decode


def struct(name: str, fields: Sequence[Field]) -> Decoder:
    """A struct: fields checked in body order, then missing ones in declaration order."""
    by_name = {f.name: f for f in fields}

    def decode(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise b.invalid_type(value, f"struct {name}")
        return decode_fields(value, fields, by_name)

    return decode


def decode_fields(
    obj: dict[str, Any], fields: Sequence[Field], by_name: dict[str, Field] | None = None
) -> dict[str, Any]:
    """Decode the known keys of `obj` (a map); the result lists the fields in declaration order."""
    by_name = by_name if by_name is not None else {f.name: f for f in fields}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        field = by_name.get(key)
        if field is None:
            continue
        if value is None and field.optional:
            out[key] = None
        else:
            out[key] = field.decoder(value)
    ordered: dict[str, Any] = {}
    for field in fields:
        if field.name in out:
            ordered[field.name] = out[field.name]
        elif field.optional:
            ordered[field.name] = None
        elif field.has_default:
            ordered[field.name] = field.default
        else:
            raise b.missing(field.name)
    return ordered


def tagged(
    name: str,
    variants: dict[str, Sequence[Field]],
    *,
    other: bool = False,
    tag: str = "type",
) -> Decoder:
    """An internally tagged enum; the result carries the variant under `tag`.

    With `other`, an unknown tag decodes to `UNSUPPORTED` (serde's `#[serde(other)]`).
    """
    tables = {key: (fields, {f.name: f for f in fields}) for key, fields in variants.items()}
    names = list(variants)

    def decode(value: Any) -> Any:
        if not isinstance(value, dict):
            raise b.invalid_type(value, f"internally tagged enum {name}")
        if tag not in value:
            raise b.missing(tag)
        kind = value[tag]
        if not isinstance(kind, str):
            raise b.invalid_type(kind, "variant identifier")
        if kind not in tables:
            if other:
                return UNSUPPORTED
            raise unknown_variant(kind, names)
        fields, by_name = tables[kind]
        rest = {k: v for k, v in value.items() if k != tag}
        out = decode_fields(rest, fields, by_name)
        out[tag] = kind
        return out

    return decode
