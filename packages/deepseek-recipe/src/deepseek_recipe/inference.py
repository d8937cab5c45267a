"""Backend-side inputs of the stream processor: chunks, usage, finish reasons."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deepseek_recipe.options import _NamedEnum


class InferenceFinishReason(_NamedEnum):
    """Backend finish reasons; output parsing decides the protocol finish reason."""

    Stop = "stop"
    Length = "length"
    ContentFilter = "content_filter"


@dataclass(frozen=True)
class PromptUsage:
    """Prompt-side token counts reported by the backend."""

    prompt_tokens: int = 0
    prompt_cache_hit_tokens: int = 0

    def __init__(self, *, prompt_tokens: int = 0, prompt_cache_hit_tokens: int = 0) -> None:
        object.__setattr__(self, "prompt_tokens", prompt_tokens)
        object.__setattr__(self, "prompt_cache_hit_tokens", prompt_cache_hit_tokens)


@dataclass(frozen=True)
class InferenceChunk:
    """One backend update; build it with `ready`, `text`, `tokens` or `finish`."""

    kind: str
    content: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    finish_reason: InferenceFinishReason | None = None
    prompt_usage: PromptUsage | None = None
    token_count: int | None = None
    system_fingerprint: str | None = None

    @staticmethod
    def ready(
        *, prompt_usage: PromptUsage | None = None, system_fingerprint: str | None = None
    ) -> InferenceChunk:
        return InferenceChunk(
            "ready",
            prompt_usage=prompt_usage or PromptUsage(),
            system_fingerprint=system_fingerprint,
        )

    @staticmethod
    def text(content: str, token_count: int = 0) -> InferenceChunk:
        """A text chunk and the number of tokens it accounts for."""
        return InferenceChunk("text", content=content, token_count=token_count)

    @staticmethod
    def tokens(
        token_ids: Sequence[int],
        logprobs: Sequence[tuple[float, Sequence[tuple[int, float]]]] | None = None,
    ) -> InferenceChunk:
        """A chunk of token ids (decoded by the processor's tokenizer); one logprob pair per id."""
        lp = (
            None
            if logprobs is None
            else [(float(a), [(int(i), float(p)) for i, p in b]) for a, b in logprobs]
        )
        return InferenceChunk("tokens", token_ids=[int(t) for t in token_ids], logprobs=lp)

    @staticmethod
    def finish(finish_reason: InferenceFinishReason) -> InferenceChunk:
        return InferenceChunk("finish", finish_reason=finish_reason)
