"""The offline API, with vLLM's names: ``LLM(model=...).generate(prompts, params)``."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from deepinfer import plugins
from deepinfer.backends.base import Backend
from deepinfer.chat import DEFAULT_CHAT_MODEL, ChatFormatter
from deepinfer.checks import is_int
from deepinfer.device import select_backend
from deepinfer.dp.group import start_ranks, threads_per_rank
from deepinfer.dp.options import pop_options
from deepinfer.dp.startup import start_engine
from deepinfer.engine.config import EngineConfig, engine_config, state_budget
from deepinfer.engine.engine import LLMEngine
from deepinfer.engine.request import Request
from deepinfer.engine.spec_config import default_speculation
from deepinfer.errors import DeepInferError, InvalidRequestError
from deepinfer.inputs import PromptType, is_token_ids, parse_prompt, split_prompts
from deepinfer.loading import LOAD_FORMATS, load
from deepinfer.outputs import RequestOutput
from deepinfer.sampling_params import SamplingParams

#: Kept for callers of the earlier name.
Prompt = PromptType


class LLM:
    """Generate from prompts (strings, token-id lists, vLLM prompt dicts) with continuous
    batching.

    ``num_threads`` sets torch's CPU threads (default: torch's own, or 1 for ``"tiny"`` on
    the CPU, whose tiny ops are dominated by thread hand-off).

    Engine options (``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
    ``state_memory_bytes``, ``enable_prefix_caching``, ``prefix_cache_bytes``, ``seed``,
    ``batch_invariant``, ``enforce_eager``, ``async_scheduling``,
    ``structured_outputs_backend``) are those of :class:`EngineConfig`; vLLM's
    ``tensor_parallel_size`` (1), ``gpu_memory_utilization`` and ``trust_remote_code`` are
    accepted too (``deepinfer.engine.config.VLLM_OPTIONS``).

    ``data_parallel_size=D`` (vLLM's name) runs D ranks, one process each: this process is
    rank 0 and the front end, the others are spawned (or started by ``torchrun``, where only
    rank 0's ``LLM(...)`` returns: the others serve, then exit); with
    ``enable_expert_parallel=True`` they split the routed experts. ``dp_timeout_s`` bounds every
    collective (and the start-up, unless ``dp_startup_timeout_s`` does),
    ``dp_affinity_margin_tokens`` the balancer's prefix affinity
    (:mod:`deepinfer.dp`).

    ``speculative_config`` (vLLM's option) drafts tokens and verifies them in one step
    (:mod:`deepinfer.engine.speculative`). ``LLM("tiny")`` speculates by default with the DSpark
    drafter shipped for it, on the confidence schedule (``TINY_SPECULATION``), except where
    asynchronous scheduling is on (as it is by default on a GPU), batch invariance is asked for
    or under data parallelism; ``speculative_config=None`` turns speculation off.

    ``load_format="dummy"`` (vLLM's name) starts a model from its config.json alone, with
    seeded random weights drawn on the device: for benchmarks and memory planning of models
    whose weights are not at hand. Its outputs mean nothing.

    ``quantization="auto"`` (the default) computes on the checkpoint's FP8 projections as stored
    where the backend has kernels for them (``sm100``); ``quantization=None`` dequantises every
    weight at load, as the torch reference always does.

    Every call validates all of its requests before queueing any; a call that fails or is
    interrupted (Ctrl-C) leaves nothing queued. Each call owns its requests' outputs, so
    streams and ``generate`` calls may interleave in any order.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = "tiny",
        *,
        dtype: str | torch.dtype = "auto",
        device: str = "auto",
        load_format: str = "auto",
        quantization: str | None = "auto",
        num_threads: int | None = None,
        **engine_options: object,
    ) -> None:
        if not isinstance(model, (str, os.PathLike)):
            raise InvalidRequestError("model", f"must be a path or 'tiny', got {model!r:.80}")
        model = os.fspath(model)
        if not isinstance(device, str):
            raise InvalidRequestError("device", f"must be a string, got {device!r:.80}")
        if not isinstance(dtype, (str, torch.dtype)):
            raise InvalidRequestError("dtype", f"must be a string, got {dtype!r:.80}")
        if load_format not in LOAD_FORMATS:
            raise InvalidRequestError(
                "load_format", f"expected one of {', '.join(LOAD_FORMATS)}, got {load_format!r:.80}"
            )
        if num_threads is not None and (not is_int(num_threads) or num_threads < 1):
            raise InvalidRequestError("num_threads", "must be a positive integer or None")
        options = dict(engine_options)
        parallel = pop_options(options)
        config, utilization = engine_config(options)
        choice = select_backend(device)
        if "speculative_config" not in options:
            config.speculative_config = default_speculation(
                model, config, parallel.enabled, choice.device
            )
        parallel.check(config)
        if num_threads is None and model == "tiny" and choice.device == "cpu":
            # The tiny model's ops are so small that thread hand-off dominates: one is fastest.
            num_threads = 1
        num_threads = threads_per_rank(parallel, num_threads)
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        launch = dict(model=model, dtype=dtype, device=device, load_format=load_format)
        launch.update(quantization=quantization, num_threads=num_threads, **engine_options)
        group = start_ranks(parallel, choice.device, launch)  # None: one process
        self.device = group.device(choice.device) if group is not None else choice.device
        self._chat: ChatFormatter | None = None
        loading: dict[str, Any] = {"dtype": dtype, "load_format": load_format}
        loading["quantization"] = quantization
        loading["expert_parallel"] = group.expert_parallel if group is not None else None
        build = functools.partial(
            self._build_engine, model, choice.backend, config, utilization, loading
        )
        #: Rank 0's front end over every rank's engine when ``data_parallel_size`` > 1.
        self.engine = build() if group is None else start_engine(group, build)
        #: Requests of the calls in progress, their latest outputs, and those streamed.
        self._owned: set[str] = set()
        self._latest: dict[str, RequestOutput] = {}
        self._streaming: set[str] = set()

    def _build_engine(
        self,
        model: str,
        backend: str,
        config: EngineConfig,
        utilization: float | None,
        loading: dict[str, Any],
    ) -> LLMEngine:
        """This process's engine: the backend, the model (``loading``: :func:`load`'s options,
        the rank's expert shard among them) and the tokenizer. Under data parallelism every
        rank runs it, and :func:`~deepinfer.dp.startup.start_engine` settles the outcome."""
        #: The op table the model runs on (``deepinfer info`` explains the choice).
        self.backend: Backend = plugins.backends.load(backend)(self.device)
        net, self.tokenizer_path = load(model, device=self.device, backend=self.backend, **loading)
        if utilization is not None and self.device.startswith("cuda"):
            config.state_memory_bytes = state_budget(self.device, utilization)
        self.tokenizer = tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        if tokenizer.get_vocab_size() > net.cfg.vocab_size:
            raise DeepInferError(
                f"model {model!r}: its tokenizer has {tokenizer.get_vocab_size()} ids, more "
                f"than the model's vocab_size ({net.cfg.vocab_size})"
            )
        return LLMEngine(net, tokenizer, config)

    def get_tokenizer(self) -> Tokenizer:
        """The tokenizer prompts are encoded with (a ``tokenizers.Tokenizer``)."""
        return self.tokenizer

    # -- helpers ------------------------------------------------------------------------------

    def encode(self, prompt: PromptType) -> tuple[list[int], str | None]:
        """(token ids, prompt text) of one prompt of any accepted type."""
        ids, text = parse_prompt(prompt)
        if ids is None:
            assert text is not None
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids, text

    def _build(
        self,
        prompts: list[object],
        params: list[SamplingParams],
        priorities: list[int],
    ) -> list[list[Request]]:
        """Validate every prompt with its parameters; an error names the prompt's index."""
        built = []
        for i, (prompt, sp, rank) in enumerate(zip(prompts, params, priorities, strict=True)):
            try:
                ids, text = self.encode(prompt)  # type: ignore[arg-type]
                built.append(self.engine.make_request(ids, sp, prompt=text, priority=rank))
            except InvalidRequestError as exc:
                raise exc.at(i) if len(prompts) > 1 else exc from None
        return built

    def _submit(self, built: list[list[Request]]) -> list[str]:
        """Queue validated requests, all or none, as this call's own."""
        self.engine.submit(built)
        ids = [members[0].group_id for members in built]
        self._owned.update(ids)
        return ids

    def _pump(self) -> list[RequestOutput]:
        """One engine step; each output goes to the call that owns its request (returned
        too, for the caller that ran the step)."""
        outs = [
            out
            for out in self.engine.step(final_only=True, watch=self._streaming)
            if out.request_id in self._owned
        ]
        for out in outs:
            self._latest[out.request_id] = out
        return outs

    def _release(self, ids: list[str]) -> None:
        """Forget a call's requests, aborting those it leaves unfinished (an error or Ctrl-C
        inside the call): nothing of a call outlives it."""
        for request_id in ids:
            if request_id not in self._owned:
                continue  # released already
            self._owned.discard(request_id)
            self._streaming.discard(request_id)
            out = self._latest.pop(request_id, None)
            if out is None or not out.finished:
                self.engine.abort_request(request_id)

    # -- API ----------------------------------------------------------------------------------

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in the order of ``prompts``. Invalid prompts raise before anything runs.

        ``priority`` (one int per prompt, as in vLLM): lower values are admitted first and
        preempted last; equal priorities go first come, first served.
        """
        items = split_prompts(prompts)
        params = _per_prompt(sampling_params, len(items), SamplingParams())
        if priority is not None and not isinstance(priority, (list, tuple)):
            raise InvalidRequestError("priority", "must be a list of ints, one per prompt")
        priorities = [0] * len(items) if priority is None else list(priority)
        if len(priorities) != len(items):  # each one's type is the engine's to check
            raise InvalidRequestError("priority", f"must be {len(items)} ints, one per prompt")
        ids = self._submit(self._build(items, params, priorities))
        bar = tqdm(total=len(ids), desc="generate", unit="req", disable=not use_tqdm)
        prompt_tokens = output_tokens = 0
        try:
            todo = set(ids)
            while todo:
                if not self.engine.has_unfinished_requests():
                    raise RuntimeError(f"the engine lost requests {sorted(todo)}")
                for out in self._pump():  # only this call's steps finish its requests
                    if not out.finished or out.request_id not in todo:
                        continue
                    todo.discard(out.request_id)
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
            return [self._latest[i] for i in ids]
        finally:
            bar.close()
            self._release(ids)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        thinking: bool = False,
        reasoning_effort: str | None = None,
        response_format: dict[str, Any] | None = None,
        model_name: str = DEFAULT_CHAT_MODEL,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Chat Completions through ``deepseek_recipe``: one output per conversation, with
        one ``SamplingParams`` for all or one per conversation.

        Each output's text is the answer; ``reasoning_content`` and ``tool_calls`` hold what
        the recipe's parser found. A ``response_format`` (with thinking off) becomes a
        structured-output constraint.
        """
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("messages", "must be a non-empty list of messages")
        convs = [messages] if isinstance(messages[0], dict) else messages
        if not all(isinstance(c, list) for c in convs):
            raise InvalidRequestError(
                "messages", "must be a list of message dicts, or a list of such lists"
            )
        if not isinstance(thinking, bool):
            raise InvalidRequestError("thinking", "must be a boolean")
        params = _per_prompt(sampling_params, len(convs), SamplingParams(max_tokens=256))
        if self._chat is None:
            self._chat = ChatFormatter(self.tokenizer_path)
        prompts, constrained = [], []
        for i, (conv, given) in enumerate(zip(convs, params, strict=True)):
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
            sp = given
            try:
                prompt = self._chat.prompt(body)
                if prompt.constraint is not None:
                    if sp.structured_outputs is not None:
                        raise InvalidRequestError(
                            "structured_outputs", "the request's response_format already sets one"
                        )
                    sp = copy.copy(sp)
                    sp.structured_outputs = prompt.constraint
            except InvalidRequestError as exc:
                raise exc.at(i) if len(convs) > 1 else exc from None
            prompts.append(prompt)
            constrained.append(sp)
        outs = self.generate([p.token_ids for p in prompts], constrained, use_tqdm=use_tqdm)
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
        self, prompt: PromptType, sampling_params: SamplingParams | None = None
    ) -> Iterator[RequestOutput]:
        """Yield the growing output of one prompt after every step that changed it, the last
        one finished; close the iterator to abort the request.

        Other calls may run steps in between (another stream, a ``generate``): the stream
        then yields its request's latest output, and always the final one.
        """
        if isinstance(prompt, (list, tuple)) and prompt and not is_token_ids(prompt):
            raise InvalidRequestError("prompt", "stream takes one prompt, not a list of them")
        params = _per_prompt(sampling_params, 1, SamplingParams())
        return self._stream(self._build([prompt], params, [0]))

    def _stream(self, built: list[list[Request]]) -> Iterator[RequestOutput]:
        # Queued when first advanced: a stream never iterated leaves nothing behind.
        (request_id,) = self._submit(built)
        self._streaming.add(request_id)
        try:
            while True:
                out = self._latest.pop(request_id, None)
                if out is None:
                    if request_id not in self.engine.groups:
                        raise RuntimeError(f"the engine lost request {request_id}")
                    self._pump()
                    continue
                if out.finished:  # released before the last yield, as it may be the last call
                    self._latest[request_id] = out
                    self._release([request_id])
                yield out
                if out.finished:
                    return
        finally:
            self._release([request_id])


def _per_prompt(params: object, count: int, default: SamplingParams) -> list[SamplingParams]:
    """One SamplingParams per prompt from one for all, a list, or None (``default``)."""
    if params is None or isinstance(params, SamplingParams):
        return [params or default] * count
    if isinstance(params, Mapping):
        raise InvalidRequestError(
            "sampling_params", "must be SamplingParams; build one with SamplingParams.from_dict"
        )
    if not isinstance(params, (list, tuple)):
        raise InvalidRequestError(
            "sampling_params",
            f"must be SamplingParams or a list of them, got {type(params).__name__}",
        )
    if len(params) != count:
        raise InvalidRequestError("sampling_params", f"got {len(params)} for {count} prompts")
    for i, sp in enumerate(params):
        if not isinstance(sp, SamplingParams):
            raise InvalidRequestError(
                "sampling_params", f"must be SamplingParams, got {type(sp).__name__}", i
            )
    return list(params)
