"""The offline API, with vLLM's names: ``LLM(model=...).generate(prompts, params)``."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from deepinfer import plugins
from deepinfer.backends.base import Backend
from deepinfer.chat import DEFAULT_CHAT_MODEL, ChatFormatter
from deepinfer.device import select_backend
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.errors import DeepInferError, InvalidRequestError
from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer.outputs import RequestOutput
from deepinfer.sampling_params import SamplingParams

Prompt = str | list[int]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":  # bf16 matmuls are slow on CPUs; the reference runs fp32 there
        return torch.float32 if device == "cpu" else torch.bfloat16
    if dtype not in _DTYPES:
        raise InvalidRequestError("dtype", f"expected one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def load(
    model: str, dtype: str | torch.dtype, device: str, backend: Backend | None = None
) -> tuple[DeepseekV4ForCausalLM, Path]:
    """(model, tokenizer.json path) for a checkpoint directory or the embedded ``"tiny"``."""
    from deepinfer import assets

    path = assets.TINY_DIR if model == "tiny" else Path(model)
    if not (path / "config.json").is_file():
        raise DeepInferError(
            f"model {model!r}: expected 'tiny' or a checkpoint directory with config.json "
            "(nothing is downloaded)"
        )
    if not (path / "tokenizer.json").is_file():
        raise DeepInferError(f"model {model!r} has no tokenizer.json")
    net = assets.load_checkpoint(path, _resolve_dtype(dtype, device), device, backend)
    return net, path / "tokenizer.json"


class LLM:
    """Generate from prompts (strings or token-id lists) with continuous batching.

    ``num_threads`` sets torch's CPU threads (default: torch's own, or 1 for ``"tiny"`` on
    the CPU, whose tiny ops are dominated by thread hand-off).

    Engine options (``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
    ``state_memory_bytes``, ``enable_prefix_caching``, ``prefix_cache_bytes``, ``seed``,
    ``batch_invariant``, ``enforce_eager``, ``async_scheduling``) are those of
    :class:`EngineConfig`.
    """

    def __init__(
        self,
        model: str = "tiny",
        *,
        dtype: str | torch.dtype = "auto",
        device: str = "auto",
        num_threads: int | None = None,
        **engine_options: object,
    ) -> None:
        choice = select_backend(device)
        if num_threads is None and model == "tiny" and choice.device == "cpu":
            # The tiny model's ops are so small that thread hand-off dominates: one is fastest.
            num_threads = 1
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.device = choice.device
        #: The op table the model runs on (``deepinfer info`` explains the choice).
        self.backend: Backend = plugins.backends.load(choice.backend)(choice.device)
        net, self.tokenizer_path = load(model, dtype, choice.device, self.backend)
        self.tokenizer = tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        self._chat: ChatFormatter | None = None
        self.engine = LLMEngine(net, tokenizer, EngineConfig(**engine_options))  # type: ignore[arg-type]

    # -- helpers ------------------------------------------------------------------------------

    def encode(self, prompt: Prompt) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False).ids, prompt
        if isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
            return list(prompt), None
        raise InvalidRequestError("prompt", "must be a string or a list of token ids")

    def _add(self, prompt: Prompt, params: SamplingParams) -> str:
        ids, text = self.encode(prompt)
        return self.engine.add_request(ids, params, prompt=text)

    # -- API ----------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in the order of ``prompts``. Invalid prompts raise before anything runs.

        ``priority`` (one int per prompt, as in vLLM): lower values are admitted first and
        preempted last; equal priorities go first come, first served.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise InvalidRequestError(
                    "sampling_params", f"got {len(params)} for {len(prompts)} prompts"
                )
        priorities = [0] * len(prompts) if priority is None else list(priority)
        if len(priorities) != len(prompts) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in priorities
        ):
            raise InvalidRequestError("priority", f"must be {len(prompts)} ints, one per prompt")
        encoded = [self.encode(p) for p in prompts]  # validate everything before adding any
        ids = [
            self.engine.add_request(tokens, sp, prompt=text, priority=rank)
            for (tokens, text), sp, rank in zip(encoded, params, priorities, strict=True)
        ]
        bar = tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm)
        done: dict[str, RequestOutput] = {}
        wanted = set(ids)
        prompt_tokens = output_tokens = 0
        while len(done) < len(ids):
            for out in self.engine.step(final_only=True):
                if out.finished and out.request_id in wanted:
                    done[out.request_id] = out
                    bar.update(1)
                    if use_tqdm:  # vLLM's estimate: tokens of finished requests per second
                        prompt_tokens += len(out.prompt_token_ids)
                        output_tokens += sum(len(c.token_ids) for c in out.outputs)
                        elapsed = bar.format_dict["elapsed"] or 1e-9
                        bar.set_postfix_str(
                            f"in: {prompt_tokens / elapsed:.0f} tok/s, "
                            f"out: {output_tokens / elapsed:.0f} tok/s",
                            refresh=False,
                        )
        bar.close()
        return [done[i] for i in ids]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        thinking: bool = False,
        reasoning_effort: str | None = None,
        response_format: dict[str, Any] | None = None,
        model_name: str = DEFAULT_CHAT_MODEL,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Chat Completions through ``deepseek_recipe``: one output per conversation.

        Each output's text is the answer; ``reasoning_content`` and ``tool_calls`` hold what
        the recipe's parser found. A ``response_format`` (with thinking off) becomes a
        structured-output constraint.
        """
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        if self._chat is None:
            self._chat = ChatFormatter(self.tokenizer_path)
        prompts = []
        for conv in convs:
            body: dict[str, Any] = {"model": model_name, "messages": conv}
            body["thinking"] = {"type": "enabled" if thinking else "disabled"}
            for key, value in (
                ("tools", tools),
                ("tool_choice", tool_choice),
                ("reasoning_effort", reasoning_effort),
                ("response_format", response_format),
            ):
                if value is not None:
                    body[key] = value
            prompts.append(self._chat.prompt(body))
        params = []
        for p in prompts:
            sp = copy.copy(sampling_params or SamplingParams(max_tokens=256))
            if p.constraint is not None:
                if sp.structured_outputs is not None:
                    raise InvalidRequestError(
                        "structured_outputs", "the request's response_format already sets one"
                    )
                sp.structured_outputs = p.constraint
            params.append(sp)
        outs = self.generate([p.token_ids for p in prompts], params, use_tqdm=use_tqdm)
        for prompt, out in zip(prompts, outs, strict=True):
            out.reasoning_content, out.tool_calls = [], []
            eos = self.engine.eos_token_ids
            for c in out.outputs:
                ids = c.token_ids[:-1] if c.token_ids and c.token_ids[-1] in eos else c.token_ids
                msg = self._chat.parse(prompt, ids, c.finish_reason or "stop")
                c.text = msg.content or ""
                out.reasoning_content.append(msg.reasoning_content)
                out.tool_calls.append(msg.tool_calls)
        return outs

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache (e.g. between benchmark runs); False when it is off."""
        return self.engine.reset_prefix_cache()

    def stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> Iterator[RequestOutput]:
        """Yield the growing output of one prompt after every step; close to abort it."""
        request_id = self._add(prompt, sampling_params or SamplingParams())
        finished = False
        try:
            while not finished:
                for out in self.engine.step():
                    if out.request_id == request_id:
                        finished = out.finished
                        yield out
        finally:
            if not finished:
                self.engine.abort_request(request_id)
