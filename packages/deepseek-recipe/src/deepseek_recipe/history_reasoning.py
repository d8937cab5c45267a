"""The reasoning an assistant message of the history keeps, the same in every protocol.

Outside thinking mode reasoning is dropped.  In thinking mode a message keeps
its reasoning, and one without any gets empty reasoning, unless the options
reject missing reasoning and the message belongs to a tool-using turn after the
last user message: the model would then continue a turn whose thinking it
cannot see.  Only the name of the missing field differs between protocols.
"""

from __future__ import annotations

from collections.abc import Sequence

from deepseek_recipe.errors import ConversionError
from deepseek_recipe.history_options import HistoryOptions
from deepseek_recipe.messages import AssistantMessage, Message


def carried_reasoning(
    reasoning: str | None,
    opts: HistoryOptions,
    *,
    has_calls: bool,
    after_last_user: bool,
    field: str,
) -> str | None:
    """The reasoning kept for one assistant message; `field` names it in the error."""
    if not opts.thinking:
        return None
    if reasoning is None:
        if opts.reject_missing_reasoning and (opts.has_tools or has_calls) and after_last_user:
            raise ConversionError(
                f"The `{field}` in the thinking mode must be passed back to the API."
            )
        return ""
    return reasoning


def settle_reasoning(
    messages: Sequence[Message],
    positions: Sequence[int],
    last_user: int,
    opts: HistoryOptions,
    field: str,
) -> list[Message]:
    """The messages with each assistant message's reasoning settled.

    `positions` places each message against `last_user`, the position of the last
    user message, on one scale (request index or message index).
    """
    out: list[Message] = []
    for position, message in zip(positions, messages, strict=True):
        if isinstance(message, AssistantMessage):
            reasoning = carried_reasoning(
                message.reasoning_content,
                opts,
                has_calls=bool(message.tool_calls),
                after_last_user=position > last_user,
                field=field,
            )
            out.append(AssistantMessage(message.content, reasoning, message.tool_calls))
        else:
            out.append(message)
    return out
