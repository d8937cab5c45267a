#!/usr/bin/env python3
"""Acceptance battery for structured outputs: does every constrained output validate?

Each grammar backend (``xgrammar``, ``llguidance`` and ``auto``, the engine's default) is run
over the same groups of JSON schemas:

- ``suite``: every schema of the official JSON-Schema-Test-Suite, draft 2020-12, as vendored
  in the ``jsonschema`` 4.26.0 sdist (368 schemas; loader in
  ``packages/deepinfer-structured/tests/schema_suite.py``);
- ``targeted``: probes of single keywords, with instances on both sides of each;
- ``annotations``: annotations and keys no draft defines (``title``, ``deprecated``,
  ``readOnly``, ``readonly``, ``x-intellij-enum-metadata``...) beside ``enum``, a combinator,
  a ``$ref``, in a property and at the top: none may be refused;
- ``schemastore/<group>``: a sample of real schemas from the SchemaStore catalog, vendored in
  ``benchmarks/data/schemastore`` (``vendor_keys``, ``pattern_properties``, ``spread``),
  validated by the draft each declares;

plus common regexes and EBNF grammars with independent recognisers. A schema is accepted
(compiled) or refused with a reason. Under each accepted one:

- instances: the grammar must reject every instance the suite marks invalid (serialised the
  way the grammar writes JSON, fed as tokens); one accepted invalid instance = unsound;
- fuzzing: random walks through the matcher (uniform over the allowed tokens), validated;
- the model: the trained tiny model samples under the constraint (temperature 1, several
  seeds), each output validated with ``jsonschema`` (``format`` checked both as the draft's
  default annotation and as an assertion; "format" counts outputs valid as annotated that a
  format assertion would reject).

A JSON text with a repeated key is validated as each common parser reads it (the first and
the last value kept): both must validate. Outputs cut by ``max_tokens`` are counted apart
(neither backend can force a grammar closed within a budget). ``invalid_outputs`` sums every
output or instance that broke its schema; it must be 0.

Then, for xgrammar only, the schemas its policy refuses are probed with the policy loosened
(``per_refused_keyword``, by the refused keywords a schema uses, and ``per_xgrammar_warning``):
the evidence that keeps each keyword refused. Usage:

    python benchmarks/structured_schema_battery.py [--backends xgrammar,llguidance,auto]
        [--seeds 2] [--max-tokens 160] [--fuzz 16] [--only GROUP_OR_NAME_PREFIX]
        [--no-evidence] [--out benchmarks/results/structured_schema_battery.json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "deepinfer-structured" / "tests"))

from matcher_walks import random_walk  # noqa: E402
from schema_suite import MEMBER_PREFIX, SDIST, SDIST_SHA256, suite_cases, validator  # noqa: E402
from schemastore_sample import DATA as STORE_DATA  # noqa: E402
from schemastore_sample import store_schemas, store_validator  # noqa: E402

from deepinfer.errors import InvalidRequestError  # noqa: E402
from deepinfer.llm import LLM  # noqa: E402
from deepinfer.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from deepinfer_structured.auto_backend import AutoBackend  # noqa: E402
from deepinfer_structured.matcher import XGrammarMatcher  # noqa: E402
from deepinfer_structured.xgrammar_backend import (  # noqa: E402
    UNENFORCED_KEYWORDS,
    UnenforcedSchemaError,
    XGrammarBackend,
    exactly,
    prepare_schema,
    unenforced_keyword,
)

BACKENDS = ("xgrammar", "llguidance", "auto")
PROMPTS = ["ROMEO:\n", "JULIET:\n", "HAMLET:\n", "KING LEAR:\n", "OTHELLO:\n", "PORTIA:\n"]

# Common real-world regexes (full-match semantics) checked with Python's ``re``.
REGEXES = {
    "iso_date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "time_24h": r"([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}"
    r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])",
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[1-5][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
    "email": r"[a-z0-9._%+-]{1,16}@[a-z0-9-]{1,12}(\.[a-z]{2,6}){1,2}",
    "phone_us": r"\(?[2-9][0-9]{2}\)?[-. ]?[0-9]{3}[-. ]?[0-9]{4}",
    "hex_color": r"#([0-9A-Fa-f]{3}|[0-9A-Fa-f]{6})",
    "semver": r"(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})(-[a-z0-9]{1,8})?",
    "slug": r"[a-z0-9]{1,10}(-[a-z0-9]{1,10}){0,4}",
    "speaker_line": r"[A-Z][A-Z ]{1,15}\. [A-Z][a-z]+( [a-z]+){0,6}[.!?]",
}


def _nested(text: str) -> bool:
    """root ::= "(" item ("," item){0,3} ")";  item ::= "a" | "bb" | "ccc" | root"""

    def item(i: int) -> int | None:
        for lit in ("ccc", "bb", "a"):
            if text.startswith(lit, i):
                return i + len(lit)
        return root(i)

    def root(i: int) -> int | None:
        if not text.startswith("(", i):
            return None
        j = item(i + 1)
        for _ in range(3):
            if j is None or not text.startswith(",", j):
                break
            j = item(j + 1)
        return j + 1 if j is not None and text.startswith(")", j) else None

    return root(0) == len(text)


def _arith(text: str) -> bool:
    """expr ::= term (("+" | "-") term)*; term ::= factor (("*" | "/") factor)*;
    factor ::= [1-9] [0-9]{0,2} | "(" expr ")"  — checked by Python's own expression parser."""
    if not re.fullmatch(r"[0-9+\-*/()]+", text) or re.search(r"(^|[^0-9])0", text):
        return False
    if re.search(r"[0-9]{4}", text) or "()" in text:
        return False
    try:
        import ast

        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    allowed = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)
    return all(isinstance(node, allowed) for node in ast.walk(tree))


# EBNF grammars (GBNF-style, which both backends read) with an independent recogniser each.
GRAMMARS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "nested_list": (
        'root ::= "(" item ("," item){0,3} ")"\nitem ::= "a" | "bb" | "ccc" | root',
        _nested,
    ),
    "arithmetic": (
        'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\n'
        'factor ::= [1-9] [0-9]{0,2} | "(" expr ")"',
        _arith,
    ),
    "csv_row": (
        'root ::= field ("," field){1,4}\nfield ::= [a-z]{1,8} | "\\"" [a-z ,]{0,8} "\\""',
        lambda t: (
            re.fullmatch(r'([a-z]{1,8}|"[a-z ,]{0,8}")(,([a-z]{1,8}|"[a-z ,]{0,8}")){1,4}', t)
            is not None
        ),
    ),
    "key_values": (
        'root ::= pair ("; " pair)*\npair ::= [a-z]+ "=" ([0-9]+ | "true" | "false")',
        lambda t: (
            re.fullmatch(r"[a-z]+=([0-9]+|true|false)(; [a-z]+=([0-9]+|true|false))*", t)
            is not None
        ),
    ),
}

# Targeted probes, one per keyword (or a variant a backend handles differently): each schema
# with instances on both sides of the keyword; validity comes from ``jsonschema``.
TARGETED: dict[str, tuple[Any, list[Any]]] = {
    "multipleOf_integer": ({"type": "integer", "multipleOf": 3}, [3, 4, 0, -6, 7]),
    "multipleOf_integer_range": (
        {"type": "integer", "multipleOf": 3, "minimum": 1, "maximum": 20},
        [4, 3, 21, 18],
    ),
    "multipleOf_number": ({"type": "number", "multipleOf": 0.5}, [0.3, 1.5, 2]),
    "uniqueItems": (
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        [[1, 1], [1, 2], []],
    ),
    "contains": (
        {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}},
        [[1], [5], []],
    ),
    "minContains": (
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}, "minContains": 2},
        [[1], [1, 1], [1, 2]],
    ),
    "maxContains": (
        {
            "type": "array",
            "items": {"type": "integer"},
            "contains": {"minimum": 5},
            "maxContains": 1,
        },
        [[5, 6], [5], [5, 1]],
    ),
    "dependentRequired": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
        },
        [{"a": 1}, {"a": 1, "b": 2}, {}],
    ),
    "dependentSchemas": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentSchemas": {"a": {"required": ["b"]}},
        },
        [{"a": 1}, {"a": 1, "b": 2}, {}],
    ),
    "not": ({"type": "integer", "not": {"const": 3}}, [3, 4]),
    "if_then": ({"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}}, [7, 4, 1]),
    "if_then_else": (
        {"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}, "else": {"const": 0}},
        [7, 1, 0, 4],
    ),
    "unevaluatedProperties": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "unevaluatedProperties": {"type": "string"},
        },
        [{"b": 1}, {"b": "x"}, {"a": 1}],
    ),
    "unevaluatedItems_false": (
        {"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False},
        [[1, 2], [1]],
    ),
    "unevaluatedItems_schema": (
        {
            "type": "array",
            "prefixItems": [{"type": "integer"}],
            "unevaluatedItems": {"type": "string"},
        },
        [[1, 2], [1, "x"]],
    ),
    "propertyNames": (
        {
            "type": "object",
            "propertyNames": {"type": "string", "maxLength": 3},
            "additionalProperties": {"type": "integer"},
        },
        [{"abcd": 1}, {"abc": 1}, {"a\u0001": 1}],
    ),
    "enum_with_type": ({"type": "string", "enum": [1, "a", None]}, [1, "a", None]),
    "typeless_minimum": ({"minimum": 2}, [1, 3, "x"]),
    "typeless_required": ({"properties": {"a": {}}, "required": ["a"]}, [{}, {"a": 1}, 2]),
    # Refused by xgrammar's policy, enforced by llguidance (auto's fallback).
    "patternProperties_overlapping_property": (
        {
            "type": "object",
            "properties": {"foo": {"type": "integer"}},
            "patternProperties": {"^f": {"type": "integer", "minimum": 3}},
            "additionalProperties": False,
        },
        [{"foo": 1}, {"foo": 4}, {"fa": 2}, {"fa": 3}, {"b": 1}],
    ),
    "patternProperties_two_disjoint": (
        {
            "type": "object",
            "patternProperties": {"^a": {"type": "integer"}, "^b": {"type": "string"}},
            "additionalProperties": False,
        },
        [{"a1": 1}, {"a1": "x"}, {"b": "x"}, {"b": 1}, {"c": 1}],
    ),
    "patternProperties_with_additional": (
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "string"}},
            "additionalProperties": {"type": "integer"},
        },
        [{"x-a": "s"}, {"x-a": 1}, {"b": 1}, {"b": "s"}],
    ),
    "pattern_with_maxLength": (
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
        ["abc", "abcd", "ab1", ""],
    ),
    "keyword_beside_enum": ({"enum": [1, 2, 3, "x"], "minimum": 2}, [1, 2, "x", 4]),
    "oneOf_exclusive_types": (
        {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
        [1, "ab", "abc", None],
    ),
    "minProperties_map": (
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
        [{"a": 1}, {"a": 1, "b": 2}, {}],
    ),
}

#: Annotations and undefined keys, each beside enum, a combinator, a $ref, in a property and at
#: the top level: JSON Schema ignores them, so no backend may refuse any of these schemas.
ANNOTATION_KEYS: dict[str, Any] = {
    "title": "A title",
    "description": "What it is",
    "examples": ["a", 1],
    "$comment": "a comment",
    "deprecated": True,
    "readOnly": True,
    "writeOnly": False,
    "default": "anything",
    "contentMediaType": "text/plain",
    "contentEncoding": "base64",
    "contentSchema": {"not": {}},
    "$anchor": "here",
    "readonly": True,
    "markdownDescription": "**bold**",
    "x-intellij-enum-metadata": {"a": {"description": "A"}, "b": {"description": "B"}},
    "x-vendor": {"not": {}, "required": ["nothing"], "minimum": 99},
    "x-guidance": {"lenient": True, "whitespace_flexible": True},
}


def annotation_schemas(key: str, value: Any) -> dict[str, tuple[Any, list[Any]]]:
    return {
        "beside_enum": ({"type": "string", "enum": ["a", "b"], key: value}, ["a", "c", 1]),
        "beside_anyOf": (
            {"anyOf": [{"type": "integer", "maximum": 3}, {"type": "string", "maxLength": 2}]}
            | {key: value},
            [2, 4, "ab", "abc"],
        ),
        "beside_ref": (
            {"$defs": {"n": {"type": "integer", "minimum": 2}}, "$ref": "#/$defs/n", key: value},
            [1, 2, "x"],
        ),
        "in_property": (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "maxLength": 3, key: value}},
                "required": ["a"],
                "additionalProperties": False,
            },
            [{"a": "abc"}, {"a": "abcd"}, {}],
        ),
        "top_level": (
            {"type": "object", "properties": {"a": {"type": "integer"}}, key: value},
            [{"a": 1}, {"a": "x"}, []],
        ),
    }


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    schema: Any
    tests: tuple[tuple[Any, bool], ...]
    store: bool = False  # validated by its declared draft (no suite remotes)

    def validator(self, formats: bool) -> Any:
        if self.store:
            return store_validator(self.schema, formats=formats)
        return validator(self.schema, formats=formats)


def all_cases() -> list[Case]:
    cases = [Case(c.name, "suite", c.schema, c.tests) for c in suite_cases()]

    def probed(name: str, group: str, schema: Any, instances: list[Any]) -> Case:
        check = validator(schema)
        tests = tuple((i, bool(check.is_valid(i))) for i in instances)
        return Case(name, group, schema, tests)

    for label, (schema, instances) in TARGETED.items():
        cases.append(probed(f"targeted:{label}", "targeted", schema, instances))
    for key, value in ANNOTATION_KEYS.items():
        for where, (schema, instances) in annotation_schemas(key, value).items():
            cases.append(probed(f"annotation:{key}:{where}", "annotations", schema, instances))
    for entry in store_schemas():
        group = f"schemastore/{entry.group}"
        cases.append(Case(f"schemastore:{entry.file}", group, entry.schema, (), store=True))
    return cases


def _pairs_first(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


class Checker:
    """Validates outputs of one case: ``ok``, ``format`` (valid, but a format assertion
    fails), ``invalid`` or ``unverifiable`` (a number beyond float range)."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self._validators: dict[bool, Any] = {}
        self.repeated_keys = 0

    def _valid(self, instance: Any, formats: bool) -> bool:
        if formats not in self._validators:
            self._validators[formats] = self.case.validator(formats)
        return bool(self._validators[formats].is_valid(instance))

    def __call__(self, text: str) -> str:
        repeated = False

        def last(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            nonlocal repeated
            repeated = repeated or len({k for k, _ in pairs}) < len(pairs)
            return dict(pairs)

        try:
            readings = [json.loads(text, object_pairs_hook=last)]
            if repeated:
                self.repeated_keys += 1
                readings.append(json.loads(text, object_pairs_hook=_pairs_first))
        except json.JSONDecodeError:
            return "invalid"
        try:
            if not all(self._valid(r, False) for r in readings):
                return "invalid"
            return "ok" if all(self._valid(r, True) for r in readings) else "format"
        except OverflowError:
            return "unverifiable"


def token_bytes_table(tokenizer: Any, vocab: int) -> list[bytes]:
    """The raw bytes of every token (byte-level BPE: each character stands for one byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {chr(b): b for b in printable}
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            chars[chr(256 + shifted)] = byte
            shifted += 1
    table = [b""] * vocab
    for text, index in tokenizer.get_vocab(with_added_tokens=True).items():
        if index < vocab:
            known = all(c in chars for c in text)
            table[index] = bytes(chars[c] for c in text) if known else text.encode()
    return table


def valid_utf8(ids: list[int], table: list[bytes]) -> bool:
    """Whether the output's bytes are UTF-8 (the detokenizer would turn others into U+FFFD)."""
    try:
        b"".join(table[t] for t in ids).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def accepts(matcher: Any, ids: list[int], stop: int) -> bool:
    return all(matcher.accept(t) for t in ids) and matcher.accept(stop)


def _reason(reason: str) -> str:
    """A refusal reason without the location, so that equal reasons group together."""
    reason = reason.removeprefix("cannot be compiled: ")
    reason = re.sub(r" at #\S*", "", reason)
    reason = re.sub(r"(property|branch|reference|regexes?) ('[^']*'|/[^/]*/|\S+)", r"\1 …", reason)
    return reason[:200]


def evaluate_backend(name: str, cases: list[Case], args: argparse.Namespace) -> dict[str, Any]:
    """Every case under one backend: verdicts, instances, fuzzing, the model."""
    started = time.time()
    llm = LLM("tiny", dtype="float32", enable_prefix_caching=False, structured_outputs_backend=name)
    engine = llm.engine
    backend = engine.grammar_backend()
    stop = sorted(engine.eos_token_ids)[0]
    vocab = backend.vocab_size
    tok = llm.tokenizer
    table = token_bytes_table(tok, vocab)
    stats: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    refused_store: dict[str, str] = {}
    failures: list[dict[str, Any]] = []
    checkers: dict[str, Checker] = {}
    accepted: list[Case] = []
    for case in cases:
        group = stats[case.group]
        group["schemas"] += 1
        constraint = StructuredOutputsParams(json=case.schema)
        try:
            if isinstance(backend, AutoBackend):
                group[f"via_{backend.backend_for(constraint).name}"] += 1
            backend.matcher(constraint)
        except InvalidRequestError as exc:
            group["refused"] += 1
            reasons[case.group][_reason(exc.reason)] += 1
            if case.group.startswith(("schemastore", "annotations")):
                refused_store[case.name] = exc.reason
            continue
        group["accepted"] += 1
        accepted.append(case)
        checker = checkers[case.name] = Checker(case)
        for instance, valid in case.tests:
            text = json.dumps(instance, ensure_ascii=False)
            ids = tok.encode(text, add_special_tokens=False).ids
            taken = accepts(backend.matcher(constraint), ids, stop)
            if taken and not valid:
                group["suite_invalid_instances_accepted"] += 1
                failures.append({"case": case.name, "by": "instance", "instance": instance})
            elif valid and not taken:
                group["suite_valid_instances_rejected"] += 1
        rng = random.Random(case.name)
        for _ in range(args.fuzz):
            ids = random_walk(backend.matcher(constraint), stop, rng, steps=96)
            if ids is None:
                group["fuzz_cut"] += 1
                continue
            text = tok.decode(ids)
            verdict = checker(text)
            if verdict != "ok" and not valid_utf8(ids, table):
                verdict = "invalid_utf8"
            group[f"fuzz_{verdict}"] += 1
            if verdict not in ("ok", "format"):
                failures.append({"case": case.name, "by": "fuzz", "verdict": verdict, "text": text})
    print(f"[{name}] checked {len(cases)} schemas in {time.time() - started:.0f}s", flush=True)

    jobs: dict[str, tuple[str, str, int]] = {}
    for case in accepted:
        for seed in range(args.seeds):
            prompt = tok.encode(PROMPTS[seed % len(PROMPTS)]).ids
            params = SamplingParams(
                temperature=1.0,
                seed=seed,
                max_tokens=args.max_tokens,
                structured_outputs=StructuredOutputsParams(json=case.schema),
            )
            jobs[engine.add_request(prompt, params)] = (case.group, case.name, seed)
    if not args.only:
        for kind, table_ in (
            ("regex", REGEXES),
            ("grammar", {k: v[0] for k, v in GRAMMARS.items()}),
        ):
            for label, value in table_.items():
                for seed in range(4 * args.seeds):
                    prompt = tok.encode(PROMPTS[seed % len(PROMPTS)]).ids
                    params = SamplingParams(
                        temperature=1.0,
                        seed=seed,
                        max_tokens=args.max_tokens,
                        structured_outputs={kind: value},
                    )
                    jobs[engine.add_request(prompt, params)] = (kind, f"{kind}:{label}", seed)
    gen_start = time.time()
    tokens = 0
    other: dict[str, Counter[str]] = defaultdict(Counter)
    for rid, out in engine.run(list(jobs)).items():
        group_name, case_name, seed = jobs[rid]
        completion = out.outputs[0]
        tokens += len(completion.token_ids)
        counts = stats[group_name] if group_name not in ("regex", "grammar") else other[case_name]
        if completion.finish_reason == "length":
            counts["model_cut"] += 1
            continue
        text = completion.text
        if case_name.startswith("regex:"):
            verdict = "ok" if re.fullmatch(REGEXES[case_name[6:]], text) else "invalid"
        elif case_name.startswith("grammar:"):
            verdict = "ok" if GRAMMARS[case_name[8:]][1](text) else "invalid"
        else:
            verdict = checkers[case_name](text)
        if completion.finish_reason != "stop":
            verdict = f"finished_{completion.finish_reason}"
        elif verdict != "ok" and not valid_utf8(completion.token_ids, table):
            verdict = "invalid_utf8"
        counts[f"model_{verdict}"] += 1
        if verdict not in ("ok", "format"):
            failures.append(
                {"case": case_name, "by": f"model seed {seed}", "verdict": verdict, "text": text}
            )
    gen_time = time.time() - gen_start
    print(f"[{name}] generated {len(jobs)} outputs, {tokens} tokens in {gen_time:.0f}s", flush=True)
    for case in accepted:
        stats[case.group]["outputs_with_repeated_keys"] += checkers[case.name].repeated_keys
    invalid = sum(
        n
        for counts in [*stats.values(), *other.values()]
        for key, n in counts.items()
        if key == "suite_invalid_instances_accepted"
        or (
            key.startswith(("fuzz_", "model_"))
            and key.split("_", 1)[1] not in ("ok", "format", "cut")
        )
    )
    groups = {
        group: dict(counts)
        | {"valid": _valid_outputs(counts), "refusal_reasons": dict(reasons[group].most_common())}
        for group, counts in stats.items()
    }
    return {
        "invalid_outputs": invalid,
        "groups": groups,
        "refused_real_schemas": refused_store,
        "regex_and_ebnf": {k: dict(v) for k, v in other.items()},
        "failures": failures[:100],
        "generation": {"outputs": len(jobs), "tokens": tokens, "seconds": round(gen_time)},
        "seconds": round(time.time() - started),
    }


def _valid_outputs(counts: Counter[str]) -> int:
    """Outputs (fuzzed or sampled) that finished and validated."""
    return sum(counts[f"{by}_{v}"] for by in ("fuzz", "model") for v in ("ok", "format"))


def refusal_evidence(cases: list[Case], args: argparse.Namespace) -> dict[str, Any]:
    """xgrammar with its policy loosened, under the suite and targeted schemas it refuses: the
    counterexamples that keep each keyword refused."""
    started = time.time()
    llm = LLM(
        "tiny",
        dtype="float32",
        enable_prefix_caching=False,
        structured_outputs_backend="xgrammar",
    )
    engine = llm.engine
    backend = engine.grammar_backend()
    assert isinstance(backend, XGrammarBackend)
    import xgrammar as xgr

    stop = sorted(engine.eos_token_ids)[0]
    vocab = backend.vocab_size
    cases = [c for c in cases if c.group in ("suite", "targeted")]
    verdicts: dict[str, tuple[str, str]] = {}
    probes: dict[str, tuple[Any, list[str], bool]] = {}
    checkers: dict[str, Checker] = {}  # one per probed case: its validators are built once
    evidence_counts: dict[str, Counter[str]] = defaultdict(Counter)
    for case in cases:
        verdicts[case.name] = classify(backend, case.schema)
        if verdicts[case.name][0] == "compiled":
            continue
        compiled, warnings, rewrite = probe(backend, case.schema)
        if compiled is None:
            continue
        probes[case.name] = (compiled, warnings, rewrite)
        counts = evidence_counts[case.name]
        for instance, valid in case.tests:
            text = json.dumps(instance, ensure_ascii=False)
            matcher = xgr.GrammarMatcher(compiled)
            taken = bool(matcher.accept_string(text)) and bool(matcher.accept_token(stop))
            if taken and not valid:
                counts["suite_invalid_instances_accepted"] += 1
            elif valid and not taken:
                counts["suite_valid_instances_rejected"] += 1
        rng = random.Random(case.name)
        checker = checkers[case.name] = Checker(case)
        for _ in range(args.fuzz):
            ids = random_walk(
                XGrammarMatcher(xgr, compiled, vocab, backend.utf8), stop, rng, steps=96
            )
            counts[f"fuzz_{'cut' if ids is None else checker(llm.tokenizer.decode(ids))}"] += 1
    backend.refused_keywords = frozenset()
    backend.refuse_inexact = False
    jobs: dict[str, str] = {}
    for case in cases:
        if case.name not in probes:
            continue
        backend.rewrite_schemas = probes[case.name][2]
        for seed in range(args.seeds):
            prompt = llm.tokenizer.encode(PROMPTS[seed % len(PROMPTS)]).ids
            params = SamplingParams(
                temperature=1.0,
                seed=seed,
                max_tokens=args.max_tokens,
                structured_outputs=StructuredOutputsParams(json=case.schema),
            )
            jobs[engine.add_request(prompt, params)] = case.name
    by_name = {c.name: c for c in cases}
    for rid, out in engine.run(list(jobs)).items():
        completion = out.outputs[0]
        name = jobs[rid]
        verdict = "cut" if completion.finish_reason == "length" else checkers[name](completion.text)
        evidence_counts[name][f"model_{verdict}"] += 1

    def evidence(names: list[str]) -> dict[str, Any]:
        total: Counter[str] = Counter()
        for n in names:
            total["schemas"] += 1
            total.update(evidence_counts[n])
        return dict(total) | {"cases": names}

    per_keyword: dict[str, Any] = {}
    for n, (_, warnings, rewrite) in probes.items():
        used = refused_keywords_used(by_name[n].schema)
        if used and not warnings and rewrite:  # refused for these keywords only
            per_keyword.setdefault("+".join(sorted(used)), []).append(n)
    per_keyword = {k: evidence(v) for k, v in sorted(per_keyword.items())}
    warned: dict[str, list[str]] = defaultdict(list)
    for n, (_, warnings, _) in probes.items():
        for w in sorted(set(re.sub(r" but got .*", "", w) for w in warnings)):
            warned[w].append(n)
    structure = [n for n, (v, _) in verdicts.items() if v == "refused_structure"]
    return {
        "policy": dict(Counter(v for v, _ in verdicts.values())),
        "per_refused_keyword": per_keyword,
        "per_xgrammar_warning": {w: evidence(names) for w, names in warned.items()},
        "refused_structure": {n: verdicts[n][1] for n in structure},
        "refused_structure_evidence": evidence([n for n in structure if n in probes]),
        "seconds": round(time.time() - started),
    }


def refused_keywords_used(schema: Any) -> set[str]:
    """Every listed keyword ``schema`` uses, at any depth (same walk as the backend's)."""
    found: set[str] = set()
    while (keyword := unenforced_keyword(schema, UNENFORCED_KEYWORDS - found)) is not None:
        found.add(keyword)
    return found


def classify(backend: XGrammarBackend, schema: Any) -> tuple[str, str]:
    """xgrammar's verdict: ("compiled", "") or ("refused_<why>", reason)."""
    try:
        prepare_schema(schema)
    except UnenforcedSchemaError as exc:
        keyword = "is not supported by this backend" in str(exc)
        return ("refused_keyword" if keyword else "refused_structure"), str(exc)
    try:
        backend.compile(StructuredOutputsParams(json=schema))
    except InvalidRequestError as exc:
        if "not enforced exactly" in exc.reason:
            return "refused_inexact", exc.reason
        return "refused_error", exc.reason
    return "compiled", ""


def probe(backend: XGrammarBackend, schema: Any) -> tuple[Any, list[str], bool]:
    """Compile with no keyword refused and no warning refused: (compiled or None, xgrammar's
    warnings, whether the typing rewrite applied; the raw schema where the rewrite refuses)."""
    rewrite = True
    try:
        prepared = prepare_schema(schema, frozenset())
    except UnenforcedSchemaError:
        prepared, rewrite = schema, False
    try:
        text = json.dumps(prepared)
        build = backend.compiler.compile_json_schema
        compiled, warnings = exactly(lambda: build(text, any_whitespace=False), refuse=False)
    except (RuntimeError, ValueError, TypeError):
        return None, [], rewrite
    return compiled, warnings, rewrite


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--fuzz", type=int, default=16, help="random walks per schema")
    p.add_argument("--only", default="", help="only cases whose group or name starts with this")
    p.add_argument("--no-evidence", action="store_true", help="skip the xgrammar probes")
    p.add_argument("--out", default="benchmarks/results/structured_schema_battery.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    cases = [
        c for c in all_cases() if c.group.startswith(args.only) or c.name.startswith(args.only)
    ]
    results = {name: evaluate_backend(name, cases, args) for name in args.backends.split(",")}
    manifest = json.loads((STORE_DATA / "manifest.json").read_text())
    result: dict[str, Any] = {
        "sources": {
            "suite": {
                "name": "JSON-Schema-Test-Suite, draft 2020-12",
                "sdist": SDIST,
                "sdist_sha256": SDIST_SHA256,
                "path": MEMBER_PREFIX + "*.json",
            },
            "schemastore": {
                "path": "benchmarks/data/schemastore (see its README)",
                "schemas": len(manifest),
                "bytes": sum(m["bytes"] for m in manifest),
            },
        },
        "versions": {"xgrammar": version("xgrammar"), "llguidance": version("llguidance")},
        "model": "tiny (trained DeepSeek-V4.1, embedded)",
        "sampling": {"temperature": 1.0, "seeds": args.seeds, "max_tokens": args.max_tokens},
        "fuzz_walks_per_schema": args.fuzz,
        "invalid_outputs": sum(r["invalid_outputs"] for r in results.values()),
        "summary": {
            name: {
                group: {
                    k: r["groups"][group].get(k, 0)
                    for k in ("schemas", "accepted", "refused", "valid")
                }
                for group in sorted(r["groups"])
            }
            for name, r in results.items()
        },
        "backends": results,
    }
    if not args.no_evidence and "xgrammar" in results:
        result["xgrammar_refused_keywords"] = sorted(UNENFORCED_KEYWORDS)
        result["xgrammar_refusal_evidence"] = refusal_evidence(cases, args)
    result["seconds"] = round(time.time() - started)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({k: result[k] for k in ("invalid_outputs", "summary")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
