"""Input processing (vLLM's name): a request validated and turned into Requests, nothing queued.

Everything a request could break a step with is checked here, before the scheduler sees it:
its parameters (again, since ``SamplingParams`` is mutable), its token ids against the
vocabulary and ``max_model_len``, ids inside its parameters, ``n``, and its output constraint,
which is compiled now so a bad one fails at submit time. ``max_model_len`` itself is fitted to
the state budget when the engine starts, so every accepted request can finish.
"""

from __future__ import annotations

import logging
import time

from tokenizers import Tokenizer

from deepinfer.cache.pools import StatePool
from deepinfer.checks import is_int
from deepinfer.config import ModelConfig
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.request import Request
from deepinfer.errors import InvalidRequestError
from deepinfer.outputs import RequestMetrics
from deepinfer.sampling_params import SamplingParams
from deepinfer.structured import GrammarBackend

logger = logging.getLogger(__name__)


def fit_max_model_len(pool: StatePool, wanted: int | None, positions: int) -> int:
    """The longest sequence served: ``wanted`` (default: the model's ``positions``), which one
    request's state must fit in the state budget, so every request that is accepted can
    finish (alone, with every other request preempted, if it must).

    A length given explicitly that does not fit is refused, naming the bytes it needs; the
    default is lowered to the longest that fits (vLLM refuses both; a CPU user with a small
    budget should not have to compute the length by hand)."""
    if wanted is not None and wanted > positions:
        raise InvalidRequestError(
            "max_model_len", f"{wanted} exceeds the model's max_position_embeddings ({positions})"
        )
    length = wanted or positions
    if pool.fits_alone(length):
        return length
    if not pool.fits_alone(2):
        raise InvalidRequestError(
            "state_memory_bytes",
            f"{pool.budget_bytes} bytes cannot hold one request's state "
            f"({pool.bytes_for(2)} bytes at its shortest)",
        )
    lo, hi = 2, length  # fits(lo), not fits(hi); bytes_for grows with the length
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pool.fits_alone(mid) else (lo, mid)
    if wanted is not None:
        raise InvalidRequestError(
            "max_model_len",
            f"one sequence of {wanted} tokens needs {pool.bytes_for(wanted)} bytes of state, "
            f"more than state_memory_bytes ({pool.budget_bytes}); at most {lo} tokens fit: "
            "lower max_model_len or raise state_memory_bytes",
        )
    logger.info(
        "max_model_len is %d tokens: one sequence's state must fit in state_memory_bytes "
        "(%d); the model has %d positions",
        lo,
        pool.budget_bytes,
        positions,
    )
    return lo


class InputProcessor:
    """Validates requests and builds their samples for one engine."""

    def __init__(
        self,
        cfg: ModelConfig,
        tokenizer: Tokenizer,
        config: EngineConfig,
        max_model_len: int,
        eos_token_ids: set[int],
    ) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.config = config
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self._grammar_backend: GrammarBackend | None = None

    def grammar_backend(self) -> GrammarBackend:
        """The grammar plugin named by ``structured_outputs_backend``, built on first use;
        names the extra that installs it when it is missing."""
        if self._grammar_backend is None:
            from deepinfer import plugins

            cls = plugins.grammars.load(self.config.structured_outputs_backend)
            self._grammar_backend = cls(
                self.tokenizer, self.cfg.vocab_size, sorted(self.eos_token_ids)
            )
        return self._grammar_backend

    def make_request(
        self,
        group_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
        priority: int = 0,
    ) -> list[Request]:
        """The samples of one request (``n`` of them), validated; nothing is queued."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(
                "sampling_params", f"must be SamplingParams, got {type(params).__name__}"
            )
        params.validate()  # again: the fields may have been set after construction
        if not is_int(priority):
            raise InvalidRequestError("priority", f"must be an integer, got {priority!r:.40}")
        if not isinstance(prompt_token_ids, (list, tuple)):
            raise InvalidRequestError(
                "prompt", f"token ids must be a list, got {type(prompt_token_ids).__name__}"
            )
        if params.truncate_prompt_tokens is not None:
            prompt_token_ids = list(prompt_token_ids)[-params.truncate_prompt_tokens :]
        self._validate(prompt_token_ids, params)
        now = time.monotonic()
        limit = self.max_model_len
        if params.max_tokens is not None:
            limit = min(limit, len(prompt_token_ids) + params.max_tokens)
        members = [
            Request(
                request_id=group_id if params.n == 1 else f"{group_id}#{i}",
                group_id=group_id,
                index=i,
                prompt_token_ids=list(prompt_token_ids),
                params=params,
                seed=0,  # drawn when queued (LLMEngine.submit): a refused call draws none
                metrics=RequestMetrics(arrival_time=now, num_prompt_tokens=len(prompt_token_ids)),
                max_total_tokens=limit,
                priority=priority,
                prompt=prompt,
                prompt_logprobs=[] if params.prompt_logprobs is not None and i == 0 else None,
            )
            for i in range(params.n)
        ]
        if params.bad_words:
            banned = self._bad_word_ids(params.bad_words)
            for req in members:
                req.bad_words = banned
        if params.structured_outputs is not None:
            for req in members:  # compiled once (cached); one matcher per sample
                req.grammar = self.grammar_backend().matcher(params.structured_outputs)
        return members

    def _validate(self, ids: list[int] | tuple[int, ...], params: SamplingParams) -> None:
        vocab = self.cfg.vocab_size
        if not ids:
            raise InvalidRequestError("prompt", "is empty")
        for i, t in enumerate(ids):
            if not is_int(t) or not 0 <= t < vocab:
                raise InvalidRequestError(
                    "prompt",
                    f"token ids must be integers in [0, {vocab}), got {type(t).__name__} "
                    f"{t!r:.40} at {i}",
                )
        image = self.cfg.image_token_id
        if image is not None and image in ids:
            raise InvalidRequestError(
                "prompt",
                f"holds the image placeholder id {image}; images need the vision tower's "
                "embeddings, which this engine does not compute (text prompts only)",
            )
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                "prompt", f"has {len(ids)} tokens; max_model_len is {self.max_model_len}"
            )
        if params.n > self.config.max_num_seqs:
            raise InvalidRequestError(
                "n", f"{params.n} samples exceed max_num_seqs ({self.config.max_num_seqs})"
            )
        for name in ("stop_token_ids", "logit_bias", "allowed_token_ids"):
            if any(t >= vocab for t in getattr(params, name) or ()):
                raise InvalidRequestError(name, f"token ids must be below the vocabulary ({vocab})")

    def _bad_word_ids(self, words: list[str]) -> list[list[int]]:
        """Each word's token sequences, as is and after a space (vLLM's rule: a word is banned
        at the start of the text and inside it), without repeats."""
        out: list[list[int]] = []
        for word in words:
            for text in (word.lstrip(), " " + word.lstrip()):
                ids = self.tokenizer.encode(text, add_special_tokens=False).ids
                if ids and ids not in out:
                    out.append(ids)
        return out
