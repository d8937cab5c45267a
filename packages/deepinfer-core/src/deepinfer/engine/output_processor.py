"""From a request's tokens to what callers see: the stop decision and the RequestOutput.

The engine owns the requests and the scheduler; these functions only read a request (and, on a
stop string, trim its text), so the rules of when generation ends sit in one place.
"""

from __future__ import annotations

from collections.abc import Container

from deepinfer.engine.detokenizer import find_stop
from deepinfer.engine.request import Request
from deepinfer.outputs import CompletionOutput, RequestOutput


def check_stop(
    req: Request, token_id: int, new_text: str, eos_token_ids: Container[int]
) -> str | None:
    """The finish reason the newest token ``token_id`` gives ``req``, or None to go on.

    Sets ``req.stop_reason`` for a stop token or string, and cuts ``req.text`` at a stop string
    (keeping it with ``include_stop_str_in_output``). ``new_text`` is the text the token added.
    """
    params = req.params
    if req.grammar is not None and not req.grammar.accept(token_id):
        return "abort"  # cannot happen while the mask is applied; never emit invalid text
    if (token_id in eos_token_ids and not params.ignore_eos) or (
        req.grammar is not None and req.grammar.is_terminated()
    ):
        return "stop"
    if token_id in params.stop_token_ids:
        req.stop_reason = token_id
        return "stop"
    if params.stop and (hit := find_stop(req.text, len(new_text), params.stop)):
        stop, idx = hit
        req.stop_reason = stop
        req.text = req.text[: idx + len(stop) if params.include_stop_str_in_output else idx]
        return "stop"
    if req.num_prompt_tokens + len(req.output_token_ids) >= req.max_total_tokens:
        return "length"
    return None


def request_output(group_id: str, members: list[Request]) -> RequestOutput:
    """A group's output as it stands: one CompletionOutput per sample."""
    first = members[0]
    outputs = [
        CompletionOutput(
            index=r.index,
            text=r.text,
            token_ids=list(r.output_token_ids),
            finish_reason=r.finish_reason,
            stop_reason=r.stop_reason,
            error=r.error,
            logprobs=list(r.logprobs) if r.params.logprobs is not None else None,
            cumulative_logprob=r.cumulative_logprob if r.params.logprobs is not None else None,
        )
        for r in members
    ]
    return RequestOutput(
        request_id=group_id,
        prompt=first.prompt,
        prompt_token_ids=list(first.prompt_token_ids),
        outputs=outputs,
        finished=all(r.finished for r in members),
        prompt_logprobs=list(first.prompt_logprobs) if first.prompt_logprobs is not None else None,
        metrics=first.metrics,
    )
