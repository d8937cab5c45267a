"""Byte-level output parser: reasoning, answer text, DSML tool calls, JSON, stop sequences.

The parser turns model output into `(action, length)` segments, counted in
symbols: bytes of text, or whole control tokens when the input is token ids.  It keeps
no text itself; the stream processor slices its own buffer by the lengths, so
segment boundaries can be mapped back to the input chunks (tokens) that
produced them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, auto

from deepseek_recipe.matchers import (
    LeadingNewlineMatcher,
    LiteralMatcher,
    Matcher,
    NewlinesThenMatcher,
)
from deepseek_recipe.parsing_options import ParsingOptions, ThinkingInitialStage

JSON_FENCES = ("```json\n", "```\n")
RAW_JSON_STARTS = ("{", "[")
JSON_END = "\n```"
DSML_BEGIN = "<｜DSML｜"
DSML_END = "</｜DSML｜"
TOOL_CALLS_ENDS = ("</｜DSML｜tool_calls>", "</｜DSML｜ calls>")
REASONING_END = "</think>"


class Kind(Enum):
    RAW = auto()
    TO_SPACE = auto()
    SKIP_INVALID = auto()
    SKIP = auto()
    STOP_SEQUENCE = auto()
    TOOL_CALL_BEGIN = auto()
    TOOL_NAME = auto()
    TOOL_NAME_END = auto()
    ARGS_LABEL = auto()
    ARGS_RAW = auto()
    ARGS_END = auto()
    REASONING = auto()
    LABEL = auto()


@dataclass(frozen=True)
class Action:
    """What a segment is; `text` carries a label or the closing text of arguments."""

    kind: Kind
    text: str = ""
    label_id: int = -1
    string: bool = False


RAW = Action(Kind.RAW)
TO_SPACE = Action(Kind.TO_SPACE)
SKIP = Action(Kind.SKIP)
SKIP_INVALID = Action(Kind.SKIP_INVALID)
REASONING = Action(Kind.REASONING)


class Stage(Enum):
    COMMON = auto()
    COMMON_LEADING = auto()
    JSON = auto()
    MATCHED_JSON = auto()
    TOOL_CALLS = auto()
    TOOL_NAME = auto()
    ARGS_FIRST = auto()
    ARGS_NEXT = auto()
    PARAM_NAME = auto()
    PARAM_TYPE = auto()
    VALUE_STRING = auto()
    VALUE_RAW = auto()
    REASONING = auto()
    REASONING_LEADING = auto()
    FINISHED = auto()


@dataclass
class _Branch:
    matcher: Matcher
    next_stage: Stage
    action: Action


Encoder = Callable[[str], tuple[int, ...]]


def byte_encoder(pattern: str) -> tuple[int, ...]:
    return tuple(pattern.encode("utf-8"))


def symbol_encoder(specials: dict[str, int]) -> Encoder:
    """Patterns over token symbols: a control-token spelling is one symbol, the rest bytes.

    Token input only forms a marker from the control token itself, never from plain
    tokens that happen to spell it, so the pattern must use the symbol too.
    """
    by_first: dict[str, list[str]] = {}
    for name in sorted(specials, key=len, reverse=True):
        if name:
            by_first.setdefault(name[0], []).append(name)

    @functools.lru_cache(maxsize=256)
    def encode(pattern: str) -> tuple[int, ...]:
        out: list[int] = []
        i = 0
        while i < len(pattern):
            for name in by_first.get(pattern[i], ()):
                if pattern.startswith(name, i):
                    out.append(specials[name])
                    i += len(name)
                    break
            else:
                out.extend(pattern[i].encode("utf-8"))
                i += 1
        return tuple(out)

    return encode


def _branches(
    stage: Stage, opts: ParsingOptions, stops: list[str], enc: Encoder
) -> tuple[list[_Branch], Action]:
    """The markers that can end `stage`, in priority order, and what unmatched symbols are."""

    def _lit(pattern: str, stage: Stage, action: Action) -> _Branch:
        return _Branch(LiteralMatcher(enc(pattern)), stage, action)

    out: list[_Branch] = []
    stop_branches = [_lit(s, Stage.FINISHED, Action(Kind.STOP_SEQUENCE, s)) for s in stops]
    tool_begin = _Branch(NewlinesThenMatcher(enc(DSML_BEGIN)), Stage.TOOL_CALLS, SKIP)
    if stage in (Stage.COMMON, Stage.COMMON_LEADING):
        if opts.parse_json_output:
            out += [_lit(f, Stage.JSON, SKIP) for f in JSON_FENCES]
            out += [_lit(s, Stage.JSON, Action(Kind.LABEL, s)) for s in RAW_JSON_STARTS]
        else:
            out += stop_branches
        if opts.parse_tool_calls:
            out.append(tool_begin)
        if stage is Stage.COMMON_LEADING:
            out.append(_Branch(LeadingNewlineMatcher(), Stage.COMMON_LEADING, SKIP))
        out.append(_lit(REASONING_END, Stage.COMMON, SKIP_INVALID))
        return out, TO_SPACE if opts.parse_json_output else RAW
    if stage is Stage.JSON:
        return [*stop_branches, _lit(JSON_END, Stage.MATCHED_JSON, SKIP)], RAW
    if stage is Stage.MATCHED_JSON:
        return ([tool_begin] if opts.parse_tool_calls else []), TO_SPACE
    if stage is Stage.TOOL_CALLS:
        out.append(_lit('invoke name="', Stage.TOOL_NAME, Action(Kind.TOOL_CALL_BEGIN)))
        out += [_lit(end, Stage.FINISHED, SKIP) for end in TOOL_CALLS_ENDS]
        return out, SKIP
    if stage is Stage.TOOL_NAME:
        return [_lit('"', Stage.ARGS_FIRST, Action(Kind.TOOL_NAME_END))], Action(Kind.TOOL_NAME)
    if stage in (Stage.ARGS_FIRST, Stage.ARGS_NEXT):
        first = stage is Stage.ARGS_FIRST
        # The name's quotes are not part of the marker: they pass through as raw name text.
        label = Action(Kind.ARGS_LABEL, "{", 0) if first else Action(Kind.ARGS_LABEL, ", ", 1)
        end = Action(Kind.ARGS_END, "{}" if first else "}")
        return [
            _lit("parameter name=", Stage.PARAM_NAME, label),
            _lit(DSML_END, Stage.TOOL_CALLS, end),
        ], SKIP
    if stage is Stage.PARAM_NAME:
        # The name runs to the first space, so its quotes are part of the raw name text.
        return [_lit(" ", Stage.PARAM_TYPE, Action(Kind.ARGS_LABEL, ": ", 2))], Action(
            Kind.ARGS_RAW
        )
    if stage is Stage.PARAM_TYPE:
        return [
            _lit('true">', Stage.VALUE_STRING, Action(Kind.ARGS_LABEL, '"', 3)),
            _lit('false">', Stage.VALUE_RAW, SKIP),
        ], SKIP
    if stage is Stage.VALUE_STRING:
        return [_lit(DSML_END, Stage.ARGS_NEXT, Action(Kind.ARGS_LABEL, '"', 4))], Action(
            Kind.ARGS_RAW, string=True
        )
    if stage is Stage.VALUE_RAW:
        return [_lit(DSML_END, Stage.ARGS_NEXT, SKIP)], Action(Kind.ARGS_RAW)
    if stage in (Stage.REASONING, Stage.REASONING_LEADING):
        if opts.parse_tool_calls:
            out.append(tool_begin)
        if stage is Stage.REASONING_LEADING:
            out.append(_Branch(LeadingNewlineMatcher(), Stage.REASONING_LEADING, SKIP))
        out.append(_Branch(NewlinesThenMatcher(enc(REASONING_END)), Stage.COMMON_LEADING, SKIP))
        return out, REASONING
    return [], SKIP_INVALID


def initial_stage(opts: ParsingOptions) -> Stage:
    if opts.starts_in_tool_calls:
        return Stage.TOOL_CALLS
    stage = opts.thinking_initial_stage
    if stage is None:
        return Stage.COMMON_LEADING
    if stage is ThinkingInitialStage.ReasoningStart:
        return Stage.REASONING_LEADING
    if stage is ThinkingInitialStage.ReasoningContinuation:
        return Stage.REASONING
    return Stage.COMMON


class StateMachine:
    """Incremental parser; `feed` returns segments as `(Action, byte_length)` pairs."""

    def __init__(self, options: ParsingOptions, encoder: Encoder = byte_encoder) -> None:
        self.options = options
        self.stops = [s for s in options.stop_sequences if s]
        self.encoder = encoder
        self._enter(initial_stage(options))

    def _enter(self, stage: Stage) -> None:
        self.stage = stage
        self.branches, self.unmatched = _branches(stage, self.options, self.stops, self.encoder)
        self.stashed = 0
        self._starters = frozenset().union(*(b.matcher.starters for b in self.branches))
        self._idle = all(b.matcher.idle for b in self.branches)

    def feed(self, data: Sequence[int]) -> list[tuple[Action, int]]:
        out: list[tuple[Action, int]] = []
        i, n = 0, len(data)
        while i < n:
            if self._idle:
                # No marker can start before the next starter symbol: take plain text in bulk.
                j, starters = i, self._starters
                while j < n and data[j] not in starters:
                    j += 1
                self.stashed += j - i
                i = j
                if i == n:
                    break
            byte = data[i]
            i += 1
            self.stashed += 1
            hit: _Branch | None = None
            for branch in self.branches:
                if branch.matcher.feed(byte):
                    hit = branch
                    break
            if hit is not None:
                held = hit.matcher.held
                if held < self.stashed:
                    out.append((self.unmatched, self.stashed - held))
                if held > 0:
                    out.append((hit.action, held))
                self._enter(hit.next_stage)
            else:
                self._idle = all(b.matcher.idle for b in self.branches)
        held = max((b.matcher.held for b in self.branches), default=0)
        if held < self.stashed:
            out.append((self.unmatched, self.stashed - held))
            self.stashed = held
        return out

    def finish(self) -> list[tuple[Action, int]]:
        out: list[tuple[Action, int]] = []
        if self.stashed:
            out.append((self.unmatched, self.stashed))
            self.stashed = 0
        return out
