"""What each config.json field must hold, and the errors for a config that breaks it.

config.json is JSON written by hand or by other tools, so a field of the wrong type or out of
range must be named when the config is built rather than surface later as a TypeError deep
inside the model. :func:`check_field_types` checks every field of a dataclass against its
annotation, read with ``typing.get_type_hints``, so a new field is checked without a table.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from deepinfer.checks import is_int, is_number
from deepinfer.errors import DeepInferError

#: model_type of the V4.1 family; its text part is ``deepseek_v41_text``.
V41_TYPE = "deepseek_v41"


class ConfigError(DeepInferError, ValueError):
    """A config.json field is missing, malformed, or describes a model we do not implement.

    ``field`` names the offending config.json key where there is one, so tools can point at it.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnsupportedConfigError(ConfigError, NotImplementedError):
    """A well-formed config describing a variant DeepInfer does not implement."""


#: Sizes and counts that must be at least 1; every other number must be at least 0.
POSITIVE_FIELDS = frozenset(
    {
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "q_lora_rank",
        "o_groups",
        "o_lora_rank",
        "moe_intermediate_size",
        "n_routed_experts",
        "num_experts_per_tok",
        "sliding_window",
        "index_n_heads",
        "index_head_dim",
        "index_topk",
        "hc_mult",
        "hc_sinkhorn_iters",
        "max_position_embeddings",
        "rope_theta",
        "compress_rope_theta",
    }
)
#: Integers with no sign constraint (a seed).
SIGNED_FIELDS = frozenset({"engram_seed"})


#: JSON's scalar kinds: annotation -> (whether a value is one, the words for error messages).
_SCALARS: dict[Any, tuple[Callable[[object], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (is_int, "an integer"),
    float: (is_number, "a number"),
    str: (lambda v: isinstance(v, str), "a string"),
    type(None): (lambda v: v is None, "null"),
}


def _describe(hint: Any) -> str:
    """The expected type in the words of JSON, for error messages."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is list:
        plural = {int: "integers", float: "numbers", str: "strings"}
        return f"a list of {plural.get(args[0], f'items that are {_describe(args[0])}')}"
    if origin is dict:
        return "an object"
    return _SCALARS[hint][1] if hint in _SCALARS else str(hint)


class _Mismatch(Exception):
    """A value does not have the annotated type (internal to :func:`_conform`)."""


def _conform(value: Any, hint: Any) -> Any:
    """``value`` if it has type ``hint`` (ints accepted and converted where floats are
    expected, tuples where lists are); raises :class:`_Mismatch` otherwise."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        for arm in args:
            try:
                return _conform(value, arm)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        if value in args and isinstance(value, str):
            return value
        raise _Mismatch
    if origin is list:
        if not isinstance(value, list | tuple):
            raise _Mismatch
        return [_conform(v, args[0]) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise _Mismatch
        return value
    if hint not in _SCALARS:
        raise TypeError(f"config annotation {hint!r} has no JSON type check")
    if not _SCALARS[hint][0](value):
        raise _Mismatch
    return float(value) if hint is float else value


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def check_field_types(cfg: Any) -> None:
    """Check every field of the dataclass ``cfg`` against its annotation and every number
    against its range (:data:`POSITIVE_FIELDS`, :data:`SIGNED_FIELDS`), converting in place."""
    hints = _type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        hint = hints[f.name]
        value = getattr(cfg, f.name)
        try:
            conformed = _conform(value, hint)
        except _Mismatch:
            raise ConfigError(
                f"config.json: {f.name} must be {_describe(hint)}, got {value!r} "
                f"({type(value).__name__})",
                f.name,
            ) from None
        setattr(cfg, f.name, conformed)
        if f.name in SIGNED_FIELDS:
            continue
        low = 1 if f.name in POSITIVE_FIELDS else 0
        # Fields hold a number or a flat list of them; objects are kept verbatim, unchecked.
        items = conformed if isinstance(conformed, list) else [conformed]
        if any(is_number(v) and v < low for v in items):
            bound = "positive" if low else "non-negative"
            raise ConfigError(f"config.json: {f.name} must be {bound}, got {value!r}", f.name)


def str_list(value: Any, name: str) -> list[str] | None:
    """``value`` if it is null or a list of strings (a transformers-style layer schedule)."""
    if value is not None and not (
        isinstance(value, list) and all(isinstance(v, str) for v in value)
    ):
        raise ConfigError(f"config.json: {name} must be a list of strings, got {value!r}", name)
    return value
