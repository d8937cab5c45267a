"""The DSML tool-call grammar: what a reply must be once the prompt opened a tool-call block.

With ``tool_choice`` required or named, the chat template ends the prompt inside the block
(``<｜DSML｜ calls>\\n`` on V4.1, ``<｜DSML｜tool_calls>\\n`` on V4), so the reply is one or more
invokes and the block's end, spelled exactly as the template renders an assistant's tool calls::

    <D invoke name="get_weather">
    <D parameter name="city" string="true">Paris</D parameter>
    <D parameter name="days" string="false">2</D parameter>
    </D invoke>
    </D calls>

(``D`` is the ``｜DSML｜`` control token; V4 writes ``invoke``/``parameter``/``tool_calls`` with
no space after it, and no blank line in an invoke without parameters.) The chat parser finds
these tags by the control token only: the same text spelled from ordinary tokens is plain text.
The grammar therefore places the token by id, and the backend compiles it against a vocabulary
in which that token's text is a byte no UTF-8 character contains, so no string value can hold
it while any other text stays allowed.

Each argument is constrained by its property's schema: a plain string (optionally with length
bounds or string enum/const) is written raw with ``string="true"`` as the template does; every
other value is compact JSON with ``string="false"``, from xgrammar's JSON-schema grammar.
Parameters follow the schema's ``properties`` order, required ones always present; properties
the schema does not list are never generated (valid whatever ``additionalProperties`` says).
Top-level keywords that would make that choice unsound are refused at submit time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepinfer.errors import InvalidRequestError
from deepinfer.structured import DsmlTool
from deepinfer_structured.schema_keywords import VALIDATING

#: Builds the grammar of one JSON value under a schema; the second argument names it in errors.
JsonGrammar = Callable[[Any, str], str]

#: Keywords a tool's top-level parameters schema may hold (annotations and vendor keys aside).
#: Any other (``minProperties``, ``patternProperties``, ``propertyNames``, ``dependentRequired``,
#: combinators, ``$ref``, ...) could make "declared properties, in order, required ones
#: present" invalid or incomplete.
_OBJECT_KEYS = frozenset(
    {"type", "properties", "required", "additionalProperties", "unevaluatedProperties"}
)
#: Keywords of a property schema that still leave it a plain string written raw
#: (``string="true"``); annotations and vendor keys beside them do not matter.
_RAW_STRING_KEYS = frozenset({"type", "minLength", "maxLength"})
_DIALECTS = {
    # block, invoke, parameter spellings after the control token; blank line in an empty invoke
    "v4.1": (" calls", " invoke", " parameter", True),
    "v4": ("tool_calls", "invoke", "parameter", False),
}


@dataclass(frozen=True)
class DsmlParameter:
    """One parameter of a tool as the grammar writes it."""

    key: str
    required: bool
    where: str  # the request field that names it in errors
    #: A raw string value (``string="true"``): the literal choices, or else (min, max) length.
    raw_values: tuple[str, ...] | None = None
    raw_bounds: tuple[int, int | None] | None = None
    #: Otherwise the JSON schema of its compact-JSON value (the root's ``$defs`` kept reachable).
    schema: Any = None

    @property
    def raw(self) -> bool:
        return self.raw_values is not None or self.raw_bounds is not None


@dataclass(frozen=True)
class DsmlInvoke:
    name: str
    parameters: tuple[DsmlParameter, ...]


def _ebnf_string(text: str) -> str:
    """An EBNF / Lark string literal for ``text`` (JSON escapes, which both read)."""
    return json.dumps(text, ensure_ascii=False)


def _raw_string(
    schema: dict[str, Any],
) -> tuple[tuple[str, ...] | None, tuple[int, int | None] | None]:
    """How a string argument is written raw: (choices, None) or (None, (min, max)); (None, None)
    when it must be JSON. Annotations and vendor keys do not matter; ``format`` keeps the
    value JSON, where the backend's string grammar may check it."""
    keys = {k for k in schema if k in VALIDATING or k == "format"}
    if schema.get("type") == "string" and keys <= _RAW_STRING_KEYS:
        high = schema.get("maxLength")
        return None, (int(schema.get("minLength", 0)), None if high is None else int(high))
    if not {"enum", "const"} & keys or keys - {"enum", "const", "type"}:
        return None, None
    values = list(schema["enum"]) if isinstance(schema.get("enum"), list) else None
    if "const" in schema:
        const = schema["const"]
        values = [const] if values is None or const in values else []
    if (
        values
        and all(isinstance(v, str) for v in values)
        and schema.get("type", "string") == "string"
    ):
        return tuple(values), None
    return None, None


def _tool_parameters(tool: DsmlTool) -> dict[str, Any]:
    if not tool.parameters:
        return {"type": "object", "properties": {}}
    schema = json.loads(tool.parameters)
    if not isinstance(schema, dict):
        raise InvalidRequestError(
            "tools", f"tool {tool.name!r}: parameters must be a JSON-schema object"
        )
    return schema


def plan_tool_calls(tools: tuple[DsmlTool, ...]) -> list[DsmlInvoke]:
    """What each tool's invoke holds, in schema order; refuses top-level keywords that would
    make "declared properties, in order, required ones present" invalid or incomplete."""
    invokes = []
    for tool in tools:
        _ebnf_attr(tool.name)
        schema = _tool_parameters(tool)
        where = f"tools[{tool.name}].parameters"
        extra = sorted(k for k in schema if k in VALIDATING and k not in _OBJECT_KEYS)
        if extra:
            raise InvalidRequestError(
                where, f"keyword '{extra[0]}' is not supported in a constrained tool call"
            )
        if schema.get("type", "object") != "object":
            raise InvalidRequestError(where, "must describe an object")
        properties = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        missing = [k for k in required if k not in properties]
        if missing:
            raise InvalidRequestError(
                where, f"required property '{missing[0]}' is not among its properties"
            )
        defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        params = []
        for key, sub in properties.items():
            _ebnf_attr(key)
            spot = f"{where}.properties.{key}"
            values, bounds = _raw_string(sub) if isinstance(sub, dict) else (None, None)
            full = sub
            if values is None and bounds is None and isinstance(sub, dict) and defs:
                full = dict(sub)  # keep the root's $defs reachable
                for name, table in defs.items():
                    full[name] = {**table, **(sub.get(name) or {})}
            params.append(DsmlParameter(key, key in required, spot, values, bounds, full))
        invokes.append(DsmlInvoke(tool.name, tuple(params)))
    return invokes


def tool_call_tag(
    tools: tuple[DsmlTool, ...], dialect: str, dsml_token_id: int, json_grammar: JsonGrammar
) -> Any:
    """The structural tag of a tool-call block's remainder (xgrammar ``StructuralTag``).

    ``json_grammar(schema, where)`` returns the EBNF of one JSON value under ``schema`` and
    raises InvalidRequestError (naming ``where``) when the backend cannot enforce it.
    """
    from xgrammar.structural_tag import (
        ConstStringFormat,
        GrammarFormat,
        OptionalFormat,
        OrFormat,
        SequenceFormat,
        StarFormat,
        StructuralTag,
        TokenFormat,
    )

    block, invoke, parameter, blank_when_empty = _DIALECTS[dialect]
    token = TokenFormat(token=dsml_token_id)

    def text(value: str) -> Any:
        return ConstStringFormat(value=value)

    def seq(*items: Any) -> Any:
        return SequenceFormat(elements=list(items))

    def param(p: DsmlParameter) -> Any:
        if p.raw_values is not None:
            grammar = "root ::= " + " | ".join(_ebnf_string(v) for v in p.raw_values)
        elif p.raw_bounds is not None:
            low, high = p.raw_bounds
            bound = f"{{{low},{high}}}" if high is not None else f"{{{low},}}" if low else "*"
            grammar = f"root ::= [\\0-\\U0010ffff]{bound}"
        else:
            grammar = json_grammar(p.schema, p.where)
        flag = "true" if p.raw else "false"
        head = f'{parameter} name="{p.key}" string="{flag}">'
        value = GrammarFormat(grammar=grammar)
        return seq(text("<"), token, text(head), value, text("</"), token, text(f"{parameter}>\n"))

    invokes = []
    for tool in plan_tool_calls(tools):
        params = [(p.required, param(p)) for p in tool.parameters]
        head = seq(text("<"), token, text(f'{invoke} name="{tool.name}">\n'))
        tail = seq(text("</"), token, text(f"{invoke}>"))
        if any(req for req, _ in params):
            body = seq(*(p if req else OptionalFormat(content=p) for req, p in params))
        else:
            # All optional: the template writes a blank line (V4.1) when none is given.
            nonempty = [
                seq(params[i][1], *(OptionalFormat(content=p) for _, p in params[i + 1 :]))
                for i in range(len(params))
            ]
            empty = text("\n" if blank_when_empty else "")
            body = OrFormat(elements=[*nonempty, empty]) if nonempty else empty
        invokes.append(seq(head, body, tail))
    one = invokes[0] if len(invokes) == 1 else OrFormat(elements=invokes)
    more = StarFormat(content=seq(text("\n"), one))
    end = seq(text("\n</"), token, text(f"{block}>"))
    return StructuralTag(format=seq(one, more, end))


def tool_call_lark(
    tools: tuple[DsmlTool, ...], dialect: str, dsml_token_id: int, json_value: JsonGrammar
) -> str:
    """The same block as a Lark grammar for llguidance (``<[id]>`` places the control token).

    ``json_value(schema, where)`` returns the Lark expression of one JSON value (an inline
    ``%json {...}``) and raises InvalidRequestError when the backend cannot enforce it. A raw
    value and the ``</`` after it are one terminal: llguidance's lexemes are greedy, and a
    value may itself hold ``</``, so the value ends only where the control token follows.
    """
    block, invoke, parameter, blank_when_empty = _DIALECTS[dialect]
    token = f"<[{dsml_token_id}]>"
    lit = _ebnf_string
    rules: list[str] = []
    invokes = []
    for i, tool in enumerate(plan_tool_calls(tools)):
        params = []
        for j, p in enumerate(tool.parameters):
            flag = "true" if p.raw else "false"
            head = lit(f'{parameter} name="{p.key}" string="{flag}">')
            tail = lit(f"{parameter}>\n")
            if p.raw_values is not None:
                value = "(" + " | ".join(lit(v + "</") for v in p.raw_values) + ")"
            elif p.raw_bounds is not None:
                low, high = p.raw_bounds
                value = f"V{i}_{j}"
                rules.append(f"{value}: /(?s:.){{{low},{'' if high is None else high}}}<\\//")
            else:
                value = f"{json_value(p.schema, p.where)} {lit('</')}"
            rules.append(f'p{i}_{j}: "<" {token} {head} {value} {token} {tail}')
            params.append((p.required, f"p{i}_{j}"))
        if any(req for req, _ in params):
            body = " ".join(n if req else f"{n}?" for req, n in params)
        else:
            # All optional: the template writes a blank line (V4.1) when none is given.
            options = [
                "(" + " ".join([params[k][1], *(f"{n}?" for _, n in params[k + 1 :])]) + ")"
                for k in range(len(params))
            ]
            if blank_when_empty:
                options.append(lit("\n"))
            body = " | ".join(options)
            if options and not blank_when_empty:
                body = f"({body})?"
        head = f'"<" {token} ' + lit(f'{invoke} name="{tool.name}">\n')
        tail = f'"</" {token} ' + lit(f"{invoke}>")
        rules.append(f"invoke{i}: {head} ({body}) {tail}" if body else f"invoke{i}: {head} {tail}")
        invokes.append(f"invoke{i}")
    one = "(" + " | ".join(invokes) + ")"
    end = f'{lit(chr(10))} "</" {token} {lit(f"{block}>")}'
    start = f"start: {one} ({lit(chr(10))} {one})* {end}"
    return "\n".join(["%llguidance {}", start, *rules]) + "\n"


def _ebnf_attr(value: str) -> str:
    """A tag attribute value as the template writes it: in double quotes, unescaped."""
    if '"' in value:
        raise InvalidRequestError("tools", f"name {value!r} cannot be written in a DSML tag")
    return f'"{value}"'
