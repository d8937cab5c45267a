"""Prompt types the offline API accepts, with vLLM's names, and their parsing.

A prompt is text, a list of token ids, or one of vLLM's prompt dicts: ``TextPrompt``
(``{"prompt": "..."}``) or ``TokensPrompt`` (``{"prompt_token_ids": [...]}``). Anything else is
refused naming what it was: a ``bytes`` object or a dict iterated as if it were a list of ids
would otherwise run as a prompt nobody wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired, TypedDict

from deepinfer.errors import InvalidRequestError


class TextPrompt(TypedDict):
    """vLLM's text prompt: the text is tokenized without special tokens."""

    prompt: str


class TokensPrompt(TypedDict):
    """vLLM's token prompt; ``prompt`` may carry the text the ids came from (for outputs)."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]


PromptType = str | list[int] | TextPrompt | TokensPrompt

#: Keys of vLLM's prompt dicts that need what this engine does not have (images, salts).
_UNSUPPORTED_KEYS = {
    "multi_modal_data": "images need the vision tower, which this engine does not run",
    "mm_processor_kwargs": "images need the vision tower, which this engine does not run",
    "multi_modal_uuids": "images need the vision tower, which this engine does not run",
    "cache_salt": "is not supported (the prefix cache is shared by every request)",
    "prompt_embeds": "is not supported (prompts are token ids)",
    "token_type_ids": "is not supported (a causal language model has none)",
}


def is_token_ids(value: object) -> bool:
    """A non-empty list or tuple whose first item is a number: read as one prompt's ids."""
    return isinstance(value, (list, tuple)) and bool(value) and isinstance(value[0], (int, float))


def split_prompts(prompts: object) -> list[object]:
    """``prompts`` as a list of single prompts: one prompt (text, ids, dict) or a list of them.

    A list starting with a number is one prompt of token ids (vLLM's reading), so
    ``[[1, 2], [3]]`` is two prompts and ``[1, 2]`` one.
    """
    if isinstance(prompts, (str, Mapping)) or is_token_ids(prompts):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        return list(prompts)
    raise InvalidRequestError(
        "prompts",
        "must be a prompt (a string, a list of token ids, a TextPrompt or TokensPrompt dict) "
        f"or a list of prompts, got {type(prompts).__name__}",
    )


def parse_prompt(prompt: object) -> tuple[list[int] | None, str | None]:
    """(token ids, text) of one prompt; ids are None when the text still needs tokenizing."""
    if isinstance(prompt, str):
        return None, prompt
    if isinstance(prompt, Mapping):
        return _parse_dict(prompt)
    if isinstance(prompt, (list, tuple)):
        return _token_ids(prompt, "prompt"), None
    raise InvalidRequestError(
        "prompt",
        "must be a string, a list of token ids, or a TextPrompt / TokensPrompt dict, "
        f"got {type(prompt).__name__}"
        + ("; decode bytes to str first" if isinstance(prompt, (bytes, bytearray)) else ""),
    )


def _parse_dict(prompt: Mapping[object, object]) -> tuple[list[int] | None, str | None]:
    for key in prompt:
        if key in _UNSUPPORTED_KEYS:
            raise InvalidRequestError(f"prompt.{key}", _UNSUPPORTED_KEYS[str(key)])
        if key not in ("prompt", "prompt_token_ids"):
            raise InvalidRequestError(
                f"prompt.{key}", "unknown key (expected 'prompt' or 'prompt_token_ids')"
            )
    text = prompt.get("prompt")
    if text is not None and not isinstance(text, str):
        raise InvalidRequestError("prompt.prompt", f"must be a string, got {type(text).__name__}")
    if "prompt_token_ids" in prompt:
        return _token_ids(prompt["prompt_token_ids"], "prompt.prompt_token_ids"), text
    if text is None:
        raise InvalidRequestError("prompt", "a prompt dict needs 'prompt' or 'prompt_token_ids'")
    return None, text


def _token_ids(value: object, field: str) -> list[int]:
    """A list of token ids; each id is checked with the request (``InputProcessor``)."""
    if not isinstance(value, (list, tuple)):
        raise InvalidRequestError(field, f"must be a list of token ids, got {type(value).__name__}")
    return list(value)
