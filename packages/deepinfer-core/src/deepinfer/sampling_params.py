"""Sampling parameters, with vLLM/OpenAI names, validated when the request is submitted.

Validation lives here, not in the sampler, so a bad request fails alone at submit time with the
field and the reason, and never reaches a batch it could take down.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from deepinfer.errors import InvalidRequestError

#: SGLang / OpenAI spellings accepted by :meth:`SamplingParams.from_dict`.
ALIASES: dict[str, str] = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "max_completion_tokens": "max_tokens",
}
STRUCTURED_KINDS: tuple[str, ...] = ("json", "json_object", "regex", "grammar", "choice")
STRUCTURED_ALIASES: dict[str, str] = {"json_schema": "json", "ebnf": "grammar"}


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one output constraint: a JSON schema, any JSON object, a regex, EBNF or choices."""

    json: str | dict[str, Any] | None = None
    json_object: bool | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None

    def _set(self) -> list[str]:
        # json may legitimately be the boolean schema False; json_object is a flag.
        return [
            k
            for k in STRUCTURED_KINDS
            if getattr(self, k) is not None and (k != "json_object" or getattr(self, k))
        ]

    def __post_init__(self) -> None:
        chosen = self._set()
        if len(chosen) != 1:
            raise InvalidRequestError(
                "structured_outputs",
                f"set exactly one of {', '.join(STRUCTURED_KINDS)} (got {chosen or 'none'})",
            )
        if self.choice is not None and (
            not self.choice or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise InvalidRequestError("structured_outputs.choice", "must be non-empty strings")

    @property
    def kind(self) -> str:
        return self._set()[0]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StructuredOutputsParams:
        names = {STRUCTURED_ALIASES.get(k, k): v for k, v in data.items()}
        unknown = sorted(set(names) - set(STRUCTURED_KINDS))
        if unknown:
            raise InvalidRequestError("structured_outputs", f"unknown keys {unknown}")
        return cls(**names)


def _token_key(key: object) -> object:
    """A ``logit_bias`` key as a token id: OpenAI's JSON sends ``{"50256": -100}``."""
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    return key


@dataclass
class SamplingParams:
    """How to sample one request. ``temperature=0`` is greedy; ``top_k`` 0 or -1 disables it."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    #: OpenAI's ``logit_bias``: token id -> value in [-100, 100] added to its logit before
    #: penalties and sampling (greedy too); the reported logprobs stay the model's.
    logit_bias: dict[int, float] | None = None
    #: Only these tokens may be generated (vLLM's ``allowed_token_ids``).
    allowed_token_ids: list[int] | None = None
    #: Words never to generate (vLLM's ``bad_words``): each is tokenized as is and after a
    #: space, and the last token of such a sequence is banned wherever it would complete it.
    bad_words: list[str] | None = None
    #: Keep only the last k prompt tokens (vLLM's ``truncate_prompt_tokens``): a long
    #: conversation still fits ``max_model_len``.
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.logit_bias, Mapping):  # JSON object keys arrive as strings
            self.logit_bias = {_token_key(k): v for k, v in self.logit_bias.items()}
        if isinstance(self.structured_outputs, Mapping):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        self._validate()

    @property
    def penalized(self) -> bool:
        """Whether a penalty changes the logits (it reads every token generated so far)."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def _validate(self) -> None:
        def bad(name: str, reason: str) -> None:
            raise InvalidRequestError(name, f"{reason}, got {getattr(self, name)!r}")

        def is_int(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if not is_int(self.n) or self.n < 1:
            bad("n", "must be an integer >= 1")
        if not 0.0 <= self.temperature < float("inf"):
            bad("temperature", "must be finite and >= 0")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if not is_int(self.top_k) or self.top_k < -1:
            bad("top_k", "must be -1, 0 (disabled) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                bad(name, "must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            bad("repetition_penalty", "must be in (0, 10]")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**63):
            bad("seed", "must be an integer in [0, 2**63)")
        if not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "must be non-empty strings")
        if not all(is_int(t) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be non-negative integers")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or self.max_tokens < 1):
            bad("max_tokens", "must be None or an integer >= 1")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            bad("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"must not exceed max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or not 0 <= value <= 20):
                bad(name, "must be None or an integer in [0, 20]")
        if self.logit_bias is not None and not (
            isinstance(self.logit_bias, dict)
            and all(is_int(t) and t >= 0 for t in self.logit_bias)
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and -100 <= v <= 100
                for v in self.logit_bias.values()
            )
        ):
            bad("logit_bias", "must map non-negative token ids to numbers in [-100, 100]")
        if self.bad_words is not None and not (
            isinstance(self.bad_words, list)
            and all(isinstance(w, str) and w.strip() for w in self.bad_words)
        ):
            bad("bad_words", "must be a list of strings with some non-space text")
        if self.truncate_prompt_tokens is not None and (
            not is_int(self.truncate_prompt_tokens) or self.truncate_prompt_tokens < 1
        ):
            bad("truncate_prompt_tokens", "must be None or an integer >= 1")
        if self.allowed_token_ids is not None and not (
            isinstance(self.allowed_token_ids, list)
            and self.allowed_token_ids
            and all(is_int(t) and t >= 0 for t in self.allowed_token_ids)
        ):
            bad("allowed_token_ids", "must be a non-empty list of non-negative token ids")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingParams:
        """Build from a JSON-like dict, accepting SGLang/OpenAI aliases; unknown keys fail."""
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        structured: dict[str, Any] = {}
        for key, value in data.items():
            if key in STRUCTURED_ALIASES or key == "regex":
                structured[STRUCTURED_ALIASES.get(key, key)] = value
                continue
            name = ALIASES.get(key, key)
            if name not in known:
                raise InvalidRequestError(key, "unknown sampling parameter")
            if name in kwargs:
                raise InvalidRequestError(key, f"given twice (also as '{name}')")
            kwargs[name] = value
        if structured:
            if "structured_outputs" in kwargs:
                raise InvalidRequestError("structured_outputs", "given twice")
            kwargs["structured_outputs"] = structured
        return cls(**kwargs)
