"""Chat on top of ``deepseek_recipe``: messages -> prompt ids, output ids -> message.

The recipe owns the DeepSeek chat format (both model versions), request validation and output
parsing; this module only wires it to the engine: the request's output constraint
(``response_format``, a required or named ``tool_choice``) becomes a structured-output
constraint, and the generated tokens go through the recipe's stream parser so reasoning, answer
and tool calls come out exactly as DeepSeek's API returns them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import StructuredOutputsParams
from deepinfer.structured import DsmlTool, ReplyConstraint

DEFAULT_CHAT_MODEL = "DeepSeek-V4.1-Flash"


@dataclass
class ChatPrompt:
    request: Any  # deepseek_recipe.ConversationRequest
    token_ids: list[int]
    constraint: StructuredOutputsParams | None


@dataclass
class ChatMessage:
    content: str | None
    reasoning_content: str | None
    tool_calls: list[dict] | None
    finish_reason: str | None


class ChatFormatter:
    """Renders chat requests for one tokenizer file and parses the model's replies."""

    def __init__(self, tokenizer_path: str | Path) -> None:
        import deepseek_recipe as dr

        self._dr = dr
        self.tokenizer = dr.Tokenizer.from_file(str(tokenizer_path))

    def prompt(self, body: dict[str, Any]) -> ChatPrompt:
        dr = self._dr
        try:
            request = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions())
        except (dr.ConversionError, ValueError) as exc:
            raise InvalidRequestError("messages", str(exc)) from exc
        if request.model_version == dr.ModelVersion.DeepseekV41Flash:
            encoding = dr.DeepseekV41Encoding()
        else:
            encoding = dr.DeepseekV4Encoding()
        ids = encoding.with_tokenizer(self.tokenizer).encode(request.conversation)
        return ChatPrompt(request, ids, self._constraint(request, body))

    def _constraint(self, request: Any, body: dict[str, Any]) -> StructuredOutputsParams | None:
        """The request's output constraint as a structured-output constraint.

        ``response_format`` gives a JSON-schema / any-JSON / regex constraint and a required or
        named ``tool_choice`` a DSML tool-call block (the prompt already opened it). With
        thinking on, the constraint starts after ``</think>`` and the reasoning is free;
        ``thinking.budget_tokens`` then caps the reasoning (forcing ``</think>``), which is the
        only way to bound it since the answer must follow. ``tool_choice`` auto constrains
        nothing: the model may answer or call.
        """
        dr = self._dr
        oc = request.inference_options.output_constraint
        thinking = request.parsing_options.thinking_initial_stage is not None
        options = body.get("thinking") if isinstance(body.get("thinking"), dict) else {}
        budget = options.get("budget_tokens") if thinking else None
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
            raise InvalidRequestError("thinking.budget_tokens", "must be an integer")
        reasoning = {"reasoning_end": "</think>", "reasoning_budget": budget} if thinking else {}
        if oc is None or oc.kind == "tool_call":  # tool calls are allowed, not required
            return ReplyConstraint(**reasoning) if budget is not None else None
        messages = request.conversation.messages
        if messages and getattr(messages[-1], "prefix", False) and messages[-1].content:
            raise NotImplementedError(
                "a constrained reply cannot continue a prefix assistant message: the grammar "
                "would restart in the middle of the answer"
            )
        if oc.kind == "tool_call_required":
            dialect = "v4.1" if request.model_version == dr.ModelVersion.DeepseekV41Flash else "v4"
            tools = _dsml_tools(oc.schema, _declared_parameters(body))
            return ReplyConstraint(tool_calls=tools, dsml=dialect, **reasoning)
        if oc.kind == "json":
            kind: dict[str, Any] = {"json_object": True}
            if oc.schema:
                # The recipe's strict-mode schema keeps only the keywords of OpenAI's strict
                # subset (no maxLength, minItems, const...): enforce the user's schema, closed
                # the way strict mode closes it.
                normalized = json.loads(oc.schema)
                user = request.conversation.response_schema
                schema = normalized if user is None else _with_strict_closure(user, normalized)
                kind = {"json": schema}
        elif oc.kind == "regex":
            kind = {"regex": oc.schema}
        else:
            raise NotImplementedError(f"output constraint kind {oc.kind!r} is not supported")
        return ReplyConstraint(**kind, **reasoning) if thinking else StructuredOutputsParams(**kind)

    def stream(self, prompt: ChatPrompt) -> ChatStream:
        return ChatStream(self._dr, prompt, self.tokenizer)

    def parse(self, prompt: ChatPrompt, token_ids: list[int], finish_reason: str) -> ChatMessage:
        dr = self._dr
        stream = self.stream(prompt)
        chunks = stream.chunks(token_ids) + stream.finish_chunks(finish_reason)
        response = dr.ChatCompletionResponse("chat", "deepinfer", 0, len(prompt.token_ids), 0)
        for chunk in chunks:
            response.accumulate(chunk)
        choices = response.to_dict()["choices"]
        if not choices:
            return ChatMessage(None, None, None, finish_reason)
        message = choices[0]["message"]
        return ChatMessage(
            message.get("content"),
            message.get("reasoning_content"),
            message.get("tool_calls"),
            choices[0]["finish_reason"],
        )


def _dsml_tools(listed: str, declared: dict[str, Any]) -> tuple[DsmlTool, ...]:
    """The recipe's tool list (compact JSON, OpenAI shape) as the tools a DSML call may name;
    a strict tool's arguments follow the parameters as declared (``declared``, by name), closed
    the way strict mode closes them."""
    tools = []
    for entry in json.loads(listed):
        function = entry.get("function") or {}
        parameters = function.get("parameters")
        name = function["name"]
        if function.get("strict") and parameters is not None and name in declared:
            parameters = _with_strict_closure(declared[name], parameters)
        text = json.dumps(parameters, separators=(",", ":")) if parameters is not None else ""
        tools.append(DsmlTool(name=name, parameters=text))
    return tuple(tools)


def _declared_parameters(body: dict[str, Any]) -> dict[str, Any]:
    """Each tool's ``parameters`` as the request declared them, by tool name."""
    declared: dict[str, Any] = {}
    for entry in body.get("tools") or []:
        function = entry.get("function") if isinstance(entry, dict) else None
        if (
            isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and function.get("parameters") is not None
        ):
            declared[function["name"]] = function["parameters"]
    return declared


def _with_strict_closure(user: Any, strict: Any) -> Any:
    """The user's schema ``user`` with what strict mode adds to it, as ``strict`` (the recipe's
    normalized copy) shows: every object closed (``additionalProperties: false``) and all its
    properties required.

    The normalized copy keeps only the keywords of the strict subset, so it is never enforced
    by itself; every keyword of ``user`` is kept. Both schemas walk the same nodes
    (``properties``, ``items``, ``anyOf``); strict mode only ever narrows, so the result's
    instances are valid under both.
    """
    if not isinstance(user, dict) or not isinstance(strict, dict):
        return user
    out = dict(user)
    for key, value in strict.items():
        mine = user.get(key)
        if key not in user:
            out[key] = value
        elif key == "additionalProperties" and value is False:
            out[key] = False
        elif key == "required" and isinstance(value, list) and isinstance(mine, list):
            out[key] = [*mine, *(name for name in value if name not in mine)]
        elif key == "properties" and isinstance(value, dict) and isinstance(mine, dict):
            out[key] = {k: _with_strict_closure(v, value.get(k)) for k, v in mine.items()}
        elif key == "items":
            out[key] = _with_strict_closure(mine, value)
        elif key == "anyOf" and isinstance(value, list) and isinstance(mine, list):
            out[key] = [_with_strict_closure(u, s) for u, s in zip(mine, value, strict=False)]
    return out


class ChatStream:
    """Incremental parsing of one reply: feed new token ids, get content/reasoning deltas."""

    def __init__(self, dr: Any, prompt: ChatPrompt, tokenizer: Any) -> None:
        self._dr = dr
        generator = dr.ChatCompletionRequest.chunk_generator(prompt.request, "chat", "deepinfer")
        self._processor = dr.StreamProcessor(generator, prompt.request.parsing_options, tokenizer)
        usage = dr.PromptUsage(prompt_tokens=len(prompt.token_ids))
        self._pending = self._processor.push(dr.InferenceChunk.ready(prompt_usage=usage))

    def chunks(self, token_ids: list[int]) -> list[Any]:
        pending, self._pending = self._pending, []
        return pending + self._processor.push(self._dr.InferenceChunk.tokens(token_ids))

    def finish_chunks(self, finish_reason: str) -> list[Any]:
        dr = self._dr
        reason = (
            dr.InferenceFinishReason.Length
            if finish_reason == "length"
            else dr.InferenceFinishReason.Stop
        )
        pending, self._pending = self._pending, []
        return pending + self._processor.push(dr.InferenceChunk.finish(reason))

    @staticmethod
    def deltas(chunks: list[Any]) -> list[tuple[str, str]]:
        """(field, text) pairs: field is "reasoning_content" or "content"."""
        out: list[tuple[str, str]] = []
        for chunk in chunks:
            for choice in json.loads(chunk.to_json()).get("choices", []):
                delta = choice.get("delta") or {}
                for key in ("reasoning_content", "content"):
                    if delta.get(key):
                        out.append((key, delta[key]))
        return out
