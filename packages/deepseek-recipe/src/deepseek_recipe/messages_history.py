"""Anthropic Messages history → conversation messages.

Messages packs a whole turn into content blocks; the prompt wants one message
per user block, one assistant message per assistant turn (thinking, text and
tool uses gathered), and one tool message per `tool_result`.  The checks are
Anthropic's: every `tool_use` is answered by a `tool_result` at the start of the
very next user message, and blocks appear only in the roles that may carry them.

Tools can be loaded mid-conversation on V4.1 (deferred tool loading): a
`tool_reference` in a tool result loads the named tool after the user message
that carries it, a `tool_addition` block loads it with the system message that
carries it.  Either must name a declared tool; V4 checks the name and shows a
reference as its name only.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from deepseek_recipe.content_segments import PART_SEPARATOR, UNSUPPORTED_IMAGE, merge_text
from deepseek_recipe.deferred_tools import loading_message
from deepseek_recipe.errors import ConversionError
from deepseek_recipe.history_options import HistoryOptions
from deepseek_recipe.history_reasoning import settle_reasoning
from deepseek_recipe.messages import (
    AssistantMessage,
    DataUrlImageSource,
    ImagePlaceholder,
    ImageSource,
    Message,
    Segment,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UrlImageSource,
    UserMessage,
)
from deepseek_recipe.options import ModelVersion
from deepseek_recipe.pyjson import dumps_python

_SERVER_BLOCKS = ("server_tool_use", "web_search_tool_result")
#: Blocks that only assistant messages carry, and the name the error gives them.
_ASSISTANT_ONLY = {
    "tool_use": "tool_use",
    "server_tool_use": "tool_use",
    "web_search_tool_result": "web_search_tool_result",
}


def _document(block: dict[str, Any]) -> str:
    media_type = block["source"]["media_type"]
    return f"[Unsupported document type: {media_type or 'unknown'}]"


def _image_source(source: dict[str, Any], path: str) -> ImageSource:
    """A V4.1 image source; base64 data is checked here because it becomes a data URL."""
    kind = source["type"]
    if kind == "file":
        raise ConversionError(
            f"{path}: file_id is not supported. Pass the image as a base64 data url instead."
        )
    if kind == "url":
        return UrlImageSource(source["url"], "high", path=path)
    try:
        base64.b64decode(source["data"], validate=True)
    except (binascii.Error, ValueError):
        raise ConversionError(f"{path}: base64 decode error") from None
    return DataUrlImageSource(
        f"data:{source['media_type']};base64,{source['data']}", "high", path=path
    )


def _with_path(source: ImageSource, path: str) -> ImageSource:
    """The same source recorded at another request location."""
    if isinstance(source, UrlImageSource):
        return UrlImageSource(source.url or "", source.detail, path=path)
    return DataUrlImageSource(source.data_url or "", source.detail, path=path)


def _append_all(texts: list[str]) -> str:
    """Text blocks appended with a blank line before each one after the first non-empty text.

    An empty leading block adds nothing, a later one still adds its separator, exactly as the
    official converter accumulates assistant text.
    """
    out = ""
    for text in texts:
        if out:
            out += PART_SEPARATOR
        out += text
    return out


def _ids(ids: list[str]) -> str:
    return ", ".join(ids)


def _missing_results(where: str, ids: list[str]) -> ConversionError:
    return ConversionError(
        f"{where}`tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{_ids(ids)}. Each `tool_use` block must have a corresponding `tool_result` block in "
        "the next message."
    )


class _Builder:
    def __init__(self, opts: HistoryOptions) -> None:
        self.opts = opts
        self.out: list[Message] = []
        self.pending: list[str] = []
        self.pending_at = -1
        self.user_turns: list[int] = []
        #: Tools referenced by the tool results of the user message being read (V4.1).
        self.references: list[str] = []

    def _server_block(self) -> None:
        if not self.opts.drop_server_blocks:
            raise ConversionError("Unsupported content block: server tools are not supported")

    def _segments(
        self, blocks: list[dict[str, Any]], path: str
    ) -> tuple[list[Segment], list[ImageSource]]:
        """Tool-result or system content: text, images and documents joined by a blank line.

        Image sources record `path`; an image error names the block within it.
        """
        segments: list[Segment] = []
        sources: list[ImageSource] = []
        for k, block in enumerate(blocks):
            if k:
                segments.append(PART_SEPARATOR)
            kind = block["type"]
            if kind == "text":
                if block["text"]:
                    segments.append(block["text"])
            elif kind == "document":
                segments.append(_document(block))
            elif kind == "tool_reference":
                if block["tool_name"] not in self.opts.tool_names:
                    raise ConversionError(
                        f"{path.removesuffix('.tool_result')}: tool reference "
                        f"'{block['tool_name']}' not found in available tools"
                    )
                segments.append(block["tool_name"])
                if self.opts.version is ModelVersion.DeepseekV41Flash:
                    self.references.append(block["tool_name"])
            elif self.opts.version is ModelVersion.DeepseekV41Flash:
                source = _image_source(block["source"], f"{path}.content[{k}]")
                sources.append(_with_path(source, path))
                segments.append(ImagePlaceholder(self.opts.image_token))
            else:
                segments.append(UNSUPPORTED_IMAGE)
        return merge_text(segments), sources

    def _expect_results(self, index: int) -> None:
        """A message other than the answering user message arrived while calls are open."""
        if self.pending:
            raise _missing_results(f"messages.{index}: ", self.pending)

    def system(self, index: int, content: str | list[dict[str, Any]]) -> None:
        self._expect_results(index)
        if isinstance(content, str):
            blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
        else:
            blocks = content
        kept = []
        added: list[str] = []
        for k, block in enumerate(blocks):
            kind = block["type"]
            if kind == "thinking":
                raise ConversionError(
                    f"messages.{index}.content: thinking blocks may only be in `assistant` messages"
                )
            if kind in _ASSISTANT_ONLY:
                raise ConversionError(
                    f"messages.{index}: `{_ASSISTANT_ONLY[kind]}` blocks can only be in "
                    "`assistant` messages"
                )
            if kind == "tool_result":
                raise ConversionError(
                    f"messages.{index}: `tool_result` blocks can only be in `user` messages"
                )
            if kind == "tool_addition":
                name = block["tool"]["name"]
                if name not in self.opts.tool_names:
                    raise ConversionError(
                        f"messages.{index}.content.{k}: `tool_addition` references unknown tool "
                        f"'{name}'"
                    )
                added.append(name)
            else:
                kept.append(block)
        segments, sources = self._segments(kept, f"messages.{index}")
        if self.opts.version is ModelVersion.DeepseekV41Flash:
            if added:
                self.out.append(loading_message(added, segments, sources))
            else:
                self.out.append(SystemMessage(segments, sources))
            return
        text = "".join(s for s in segments if isinstance(s, str))
        if text:
            self.out.append(UserMessage([f"<system-reminder>\n{text}\n</system-reminder>"]))

    def user(self, index: int, content: str | list[dict[str, Any]]) -> None:
        if isinstance(content, str):
            if self.pending:
                raise _missing_results(f"messages.{index}: ", self.pending)
            self.user_turns.append(index)
            self.out.append(UserMessage([content] if content else []))
            return
        answered: set[str] = set()
        results_open = bool(self.pending)
        for k, block in enumerate(content):
            kind = block["type"]
            if kind == "tool_result":
                call_id = block["tool_use_id"]
                if call_id in answered:
                    raise ConversionError(
                        f"messages.{index}.content.{k}: each tool_use must have a single result. "
                        f"Found multiple `tool_result` blocks with id: {call_id}"
                    )
                if not results_open or call_id not in self.pending:
                    raise ConversionError(
                        f"unexpected `messages.{index}.content.{k}: tool_use_id` found in "
                        f"`tool_result` blocks: {call_id}. Each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message."
                    )
                answered.add(call_id)
                result = block["content"]
                if result is None or isinstance(result, str):
                    segments: list[Segment] = [result] if result else []
                    sources: list[ImageSource] = []
                else:
                    path = f"messages.{index}.content.{k}.tool_result"
                    segments, sources = self._segments(result, path)
                self.out.append(ToolMessage(segments, call_id, sources))
                continue
            if results_open:
                missing = [c for c in self.pending if c not in answered]
                if missing:
                    raise _missing_results(f"messages.{index}: ", missing)
                results_open = False
                self.pending = []
            self._user_block(index, k, block)
        if results_open:
            missing = [c for c in self.pending if c not in answered]
            if missing:
                raise _missing_results(f"messages.{self.pending_at}:", missing)
            self.pending = []
        if self.references:
            # The referenced tools are loaded once the whole user message is read.
            self.out.append(loading_message(self.references))
            self.references = []

    def _user_block(self, index: int, k: int, block: dict[str, Any]) -> None:
        kind = block["type"]
        if kind == "text":
            self.out.append(UserMessage([block["text"]] if block["text"] else []))
        elif kind == "document":
            self.out.append(UserMessage([_document(block)]))
        elif kind == "image":
            if self.opts.version is ModelVersion.DeepseekV41Flash:
                source = _image_source(block["source"], f"messages.{index}.content[{k}]")
                self.out.append(UserMessage([ImagePlaceholder(self.opts.image_token)], [source]))
            else:
                self.out.append(UserMessage([UNSUPPORTED_IMAGE]))
        elif kind == "thinking":
            raise ConversionError(
                f"messages.{index}.content: thinking blocks may only be in `assistant` messages"
            )
        elif kind in ("tool_use", "server_tool_use"):
            raise ConversionError(
                f"messages.{index}: `tool_use` blocks can only be in `assistant` messages"
            )
        elif kind == "web_search_tool_result":
            raise ConversionError(
                f"messages.{index}: `web_search_tool_result` blocks can only be in `assistant` "
                "messages"
            )
        elif kind == "tool_addition":
            raise ConversionError(
                f"messages.{index}: `tool_addition` blocks can only be in `system` messages"
            )
        else:
            return
        if index not in self.user_turns:
            self.user_turns.append(index)

    def assistant(self, index: int, content: str | list[dict[str, Any]]) -> None:
        self._expect_results(index)
        reasoning: list[str] | None = None
        texts: list[str] = []
        calls: list[ToolCall] = []
        blocks: list[dict[str, Any]] = (
            [{"type": "text", "text": content}] if isinstance(content, str) else content
        )
        for k, block in enumerate(blocks):
            kind = block["type"]
            if kind == "thinking":
                reasoning = (reasoning or []) + [block["thinking"]]
            elif kind == "tool_use":
                if any(c.id == block["id"] for c in calls):
                    raise ConversionError(
                        f"messages.{index}.content.{k}: `tool_use` ids must be unique"
                    )
                calls.append(ToolCall(block["id"], block["name"], dumps_python(block["input"])))
            elif kind == "tool_result":
                raise ConversionError(
                    f"messages.{index}: `tool_result` blocks can only be in `user` messages"
                )
            elif kind in _SERVER_BLOCKS:
                self._server_block()
            elif kind == "tool_addition":
                raise ConversionError(
                    f"messages.{index}: `tool_addition` blocks can only be in `system` messages"
                )
            else:
                if calls:
                    raise _missing_results(f"messages.{index}.{k}: ", [c.id for c in calls])
                if kind == "text":
                    texts.append(block["text"])
                elif kind == "document":
                    texts.append(_document(block))
                elif self.opts.version is ModelVersion.DeepseekV41Flash:
                    # The source is checked first, as it would be for a user image.
                    _image_source(block["source"], f"messages.{index}.content[{k}]")
                    raise ConversionError("Image in assistant message is unsupported")
                else:
                    texts.append(UNSUPPORTED_IMAGE)
        joined_reasoning = None if reasoning is None else PART_SEPARATOR.join(reasoning)
        self.out.append(AssistantMessage(_append_all(texts), joined_reasoning, calls or None))
        self.pending = [c.id for c in calls]
        self.pending_at = index

    def finish(self) -> None:
        if self.pending:
            raise _missing_results(f"messages.{self.pending_at}:", self.pending)


def build_messages(
    system: str | list[dict[str, Any]] | None,
    messages: list[dict[str, Any]],
    opts: HistoryOptions,
) -> list[Message]:
    """The conversation messages of a request, with the history checks."""
    if not messages:
        raise ConversionError("messages: at least one message is required")
    builder = _Builder(opts)
    if system is not None:
        if isinstance(system, str):
            builder.out.append(SystemMessage([system] if system else []))
        else:
            texts = [blk["text"] for blk in system]
            builder.out.append(SystemMessage([PART_SEPARATOR.join(texts)] if any(texts) else []))
    # Request index of each produced message, for the missing-reasoning check.
    origins: list[int] = [-1] * len(builder.out)
    for index, msg in enumerate(messages):
        role, content = msg["role"], msg["content"]
        if role != "system" and isinstance(content, list) and not content:
            raise ConversionError(f"messages.{index}: all messages must have non-empty content")
        before = len(builder.out)
        if role == "system":
            builder.system(index, content)
        elif role == "user":
            builder.user(index, content)
        else:
            builder.assistant(index, content)
        origins += [index] * (len(builder.out) - before)
    builder.finish()
    last_user = builder.user_turns[-1] if builder.user_turns else -1
    return settle_reasoning(builder.out, origins, last_user, opts, "content[].thinking")
