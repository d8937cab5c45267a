#!/usr/bin/env python3
"""Acceptance battery for structured outputs: does every constrained output validate?

Schemas: every schema of the official JSON-Schema-Test-Suite, draft 2020-12, as vendored in the
``jsonschema`` 4.26.0 sdist (``jsonschema-4.26.0/json/tests/draft2020-12/*.json``, 368 schemas;
loader in ``packages/deepinfer-structured/tests/schema_suite.py``), plus a set of common regexes
and EBNF grammars with independent recognisers. Each schema is first classified under the
backend's policy (compiled, or refused: a listed keyword / xgrammar warned it was inexact / no
grammar at all). Then every schema xgrammar compiles at all, refused ones included, is probed
three ways, so the refusal list rests on evidence:

- suite instances: the grammar must reject every instance the suite marks invalid
  (serialised the way the grammar writes JSON); one accepted invalid instance = unsound;
- fuzzing: random walks through the grammar (uniform over the allowed tokens), validated;
- the model: the trained tiny model samples under the grammar (temperature 1, several seeds),
  each output validated with ``jsonschema`` (draft 2020-12; ``format`` checked both as the
  draft's default annotation and as an assertion).

An output cut by ``max_tokens`` is counted apart (xgrammar has no way to force the grammar
closed within a budget). Usage:

    python benchmarks/structured_schema_battery.py [--seeds 4] [--max-tokens 192] [--fuzz 64]
        [--only FILE_PREFIX] [--out benchmarks/results/structured_schema_battery.json]
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
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "deepinfer-structured" / "tests"))

from schema_suite import (  # noqa: E402
    MEMBER_PREFIX,
    SDIST,
    SDIST_SHA256,
    SuiteCase,
    suite_cases,
    validator,
)

from deepinfer.errors import InvalidRequestError  # noqa: E402
from deepinfer.llm import LLM  # noqa: E402
from deepinfer.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from deepinfer_structured.matcher import XGrammarMatcher  # noqa: E402
from deepinfer_structured.xgrammar_backend import (  # noqa: E402
    UNENFORCED_KEYWORDS,
    UnenforcedSchemaError,
    XGrammarBackend,
    exactly,
    prepare_schema,
    unenforced_keyword,
)

#: Keywords no longer refused: xgrammar enforces them (``propertyNames`` once bounded strings are
#: rewritten; ``unevaluated*`` once keywords beside combinators and ``$ref`` are refused), or
#: warns, and the backend refuses, where it does not (``multipleOf`` on numbers or with a
#: non-integer divisor).
RELAXED_KEYWORDS = frozenset(
    {"multipleOf", "propertyNames", "unevaluatedProperties", "unevaluatedItems"}
)

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


# EBNF grammars with an independent recogniser each.
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


# Targeted probes, one per refused keyword (or a variant xgrammar handles differently): each
# schema with instances on both sides of the keyword; validity comes from ``jsonschema``.
TARGETED: dict[str, tuple[dict[str, Any], list[Any]]] = {
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
}


def targeted_cases() -> list[SuiteCase]:
    cases = []
    for label, (schema, instances) in TARGETED.items():
        check = validator(schema)
        tests = tuple((i, bool(check.is_valid(i))) for i in instances)
        cases.append(SuiteCase(f"targeted:{label}", label, schema, tests))
    return cases


def refused_keywords_used(schema: Any) -> set[str]:
    """Every listed keyword ``schema`` uses, at any depth (same walk as the backend's)."""
    found: set[str] = set()
    while (keyword := unenforced_keyword(schema, UNENFORCED_KEYWORDS - found)) is not None:
        found.add(keyword)
    return found


def classify(backend: XGrammarBackend, schema: Any) -> tuple[str, str]:
    """The backend's verdict: ("compiled", "") or ("refused_<why>", reason)."""
    try:
        prepare_schema(schema)
    except UnenforcedSchemaError as exc:
        keyword = "is not supported by this backend" in str(exc)
        return ("refused_keyword" if keyword else "refused_structure"), str(exc)
    try:
        backend.compile(StructuredOutputsParams(json=schema))
    except InvalidRequestError as exc:
        reason = exc.reason
        if "not enforced exactly" in reason:
            return "refused_inexact", reason
        return "refused_error", reason
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


def grammar_accepts(xgr: Any, compiled: Any, text: str, stop: int) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    return bool(matcher.accept_string(text)) and bool(matcher.accept_token(stop))


def random_walk(matcher: Any, stop: int, rng: random.Random, *, steps: int) -> list[int] | None:
    """Token ids of one uniform random walk over the matcher's allowed tokens to the grammar's
    end (None if cut at ``steps``)."""
    ids: list[int] = []
    for _ in range(steps):
        allowed = matcher.allowed().nonzero()[:, 0].tolist()
        token = stop if stop in allowed and rng.random() < 0.5 else rng.choice(allowed)
        assert matcher.accept(token)
        if token == stop:
            return ids
        ids.append(token)
    return None


_VALIDATORS: dict[tuple[str, bool], Any] = {}


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
    """Whether the output's bytes are UTF-8 (xgrammar lets UTF-8-encoded surrogates and some
    overlong forms through its character classes; the detokenizer turns them into U+FFFD)."""
    try:
        b"".join(table[t] for t in ids).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_json(schema: Any, text: str) -> str:
    """ "ok", "format" (valid, but a ``format`` assertion fails), "invalid" or "unverifiable"."""
    try:
        instance = json.loads(text)
    except json.JSONDecodeError:
        return "invalid"
    key = json.dumps(schema, sort_keys=True)
    for formats in (False, True):
        if (key, formats) not in _VALIDATORS:
            _VALIDATORS[key, formats] = validator(schema, formats=formats)
    try:
        if not _VALIDATORS[key, False].is_valid(instance):
            return "invalid"
        return "ok" if _VALIDATORS[key, True].is_valid(instance) else "format"
    except OverflowError:  # a number beyond float range (1e999): valid JSON, not checkable here
        return "unverifiable"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--fuzz", type=int, default=64, help="random walks per schema")
    p.add_argument("--only", default="", help="only suite files starting with this")
    p.add_argument("--out", default="benchmarks/results/structured_schema_battery.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    llm = LLM("tiny", dtype="float32", enable_prefix_caching=False)
    engine = llm.engine
    backend = engine.grammar_backend()
    assert isinstance(backend, XGrammarBackend)
    import xgrammar as xgr

    stop = backend.stop_token_ids[0]
    vocab = backend.vocab_size
    cases = [c for c in [*suite_cases(), *targeted_cases()] if c.name.startswith(args.only)]
    byte_table = token_bytes_table(llm.tokenizer, vocab)

    verdicts: dict[str, tuple[str, str]] = {}
    probes: dict[str, tuple[Any, list[str], bool]] = {}
    unsound: dict[str, list[Any]] = {}
    rejected_valid: Counter[str] = Counter()
    fuzz: dict[str, Counter[str]] = {}
    failures: list[dict[str, Any]] = []
    kept: Counter[bool] = Counter()

    def record(failure: dict[str, Any]) -> None:
        """Keep up to 200 failures of compiled schemas and 200 of the others."""
        compiled = verdicts.get(failure["case"], ("",))[0] == "compiled"
        if kept[compiled] < 200:
            kept[compiled] += 1
            failures.append(failure)

    for case in cases:
        verdicts[case.name] = classify(backend, case.schema)
        compiled, warnings, rewrite = probe(backend, case.schema)
        if compiled is None:
            continue
        probes[case.name] = (compiled, warnings, rewrite)
        for instance, valid in case.tests:
            text = json.dumps(instance, ensure_ascii=False)
            accepted = grammar_accepts(xgr, compiled, text, stop)
            if accepted and not valid:
                unsound.setdefault(case.name, []).append(instance)
            elif valid and not accepted:
                rejected_valid[case.name] += 1
        rng = random.Random(case.name)
        counts: Counter[str] = Counter()
        for _ in range(args.fuzz):
            matcher = XGrammarMatcher(xgr, compiled, vocab, backend.utf8)
            ids = random_walk(matcher, stop, rng, steps=96)
            if ids is None:
                counts["cut"] += 1
                continue
            text = llm.tokenizer.decode(ids)
            verdict = check_json(case.schema, text)
            if verdict != "ok" and not valid_utf8(ids, byte_table):
                verdict = "invalid_utf8"
            counts[verdict] += 1
            if verdict != "ok":
                record({"case": case.name, "by": "fuzz", "verdict": verdict, "text": text})
        fuzz[case.name] = counts
    print(f"probed {len(probes)}/{len(cases)} schemas in {time.time() - started:.0f}s", flush=True)

    # The model, under every grammar xgrammar builds (policy loosened to probe refused ones).
    backend.refused_keywords = frozenset()
    backend.refuse_inexact = False
    jobs: dict[str, tuple[str, int]] = {}
    for case in cases:
        if case.name not in probes:
            continue
        for seed in range(args.seeds):
            prompt = llm.tokenizer.encode(PROMPTS[seed % len(PROMPTS)]).ids
            params = SamplingParams(
                temperature=1.0,
                seed=seed,
                max_tokens=args.max_tokens,
                structured_outputs=StructuredOutputsParams(json=case.schema),
            )
            backend.rewrite_schemas = probes[case.name][2]
            jobs[engine.add_request(prompt, params)] = (case.name, seed)
    for kind, table in (("regex", REGEXES), ("grammar", {k: v[0] for k, v in GRAMMARS.items()})):
        for label, value in table.items():
            for seed in range(4 * args.seeds):
                prompt = llm.tokenizer.encode(PROMPTS[seed % len(PROMPTS)]).ids
                params = SamplingParams(
                    temperature=1.0,
                    seed=seed,
                    max_tokens=args.max_tokens,
                    structured_outputs={kind: value},
                )
                jobs[engine.add_request(prompt, params)] = (f"{kind}:{label}", seed)
    model: dict[str, Counter[str]] = defaultdict(Counter)
    tokens = 0
    gen_start = time.time()
    schemas = {c.name: c.schema for c in cases}
    for rid, out in engine.run(list(jobs)).items():
        name, seed = jobs[rid]
        completion = out.outputs[0]
        tokens += len(completion.token_ids)
        if completion.finish_reason == "length":
            model[name]["cut"] += 1
            continue
        text = completion.text
        if name.startswith("regex:"):
            verdict = "ok" if re.fullmatch(REGEXES[name[6:]], text) else "invalid"
        elif name.startswith("grammar:"):
            verdict = "ok" if GRAMMARS[name[8:]][1](text) else "invalid"
        else:
            verdict = check_json(schemas[name], text)
        if verdict != "ok" and not valid_utf8(completion.token_ids, byte_table):
            verdict = "invalid_utf8"
        model[name][verdict] += 1
        if verdict != "ok":
            record({"case": name, "by": f"model seed {seed}", "verdict": verdict, "text": text})
    gen_time = time.time() - gen_start
    print(f"generated {len(jobs)} outputs, {tokens} tokens in {gen_time:.0f}s", flush=True)

    def evidence(names: list[str]) -> dict[str, int]:
        total: Counter[str] = Counter()
        for n in names:
            total["schemas"] += 1
            total["suite_invalid_instances_accepted"] += len(unsound.get(n, []))
            total["suite_valid_instances_rejected"] += rejected_valid[n]
            for k, v in fuzz.get(n, {}).items():
                total[f"fuzz_{k}"] += v
            for k, v in model.get(n, {}).items():
                total[f"model_{k}"] += v
        return dict(total)

    groups: dict[str, list[str]] = defaultdict(list)
    for case in cases:
        status, _ = verdicts[case.name]
        groups[status].append(case.name)
    per_keyword: dict[str, Any] = {}
    for keyword in sorted(UNENFORCED_KEYWORDS):
        alone = [
            c.name
            for c in cases
            if c.name in probes
            and not probes[c.name][1]
            and probes[c.name][2]
            and refused_keywords_used(c.schema) == {keyword}
        ]
        per_keyword[keyword] = evidence(alone) | {"cases": alone}
    # Keywords taken off the refused list, with the evidence over the schemas that use them.
    per_relaxed_keyword: dict[str, Any] = {}
    for keyword in sorted(RELAXED_KEYWORDS):
        using = [
            c.name
            for c in cases
            if c.name in probes and unenforced_keyword(c.schema, frozenset({keyword})) is not None
        ]
        compiled_using = [n for n in using if verdicts[n][0] == "compiled"]
        per_relaxed_keyword[keyword] = {
            "compiled": evidence(compiled_using) | {"cases": compiled_using},
            "refused_for_another_reason": {
                n: verdicts[n][1] for n in using if verdicts[n][0] != "compiled"
            },
        }
    warned: dict[str, list[str]] = defaultdict(list)
    for name, (_, warnings, _) in probes.items():
        for w in sorted(set(re.sub(r" but got .*", "", w) for w in warnings)):
            warned[w].append(name)
    result = {
        "source": {
            "suite": "JSON-Schema-Test-Suite, draft 2020-12",
            "sdist": SDIST,
            "sdist_sha256": SDIST_SHA256,
            "path": MEMBER_PREFIX + "*.json",
            "schemas": sum(not c.name.startswith("targeted:") for c in cases),
            "targeted_schemas_added": sum(c.name.startswith("targeted:") for c in cases),
        },
        "xgrammar": version("xgrammar"),
        "model": "tiny (trained DeepSeek-V4.1, embedded)",
        "sampling": {"temperature": 1.0, "seeds": args.seeds, "max_tokens": args.max_tokens},
        "fuzz_walks_per_schema": args.fuzz,
        "refused_keywords": sorted(UNENFORCED_KEYWORDS),
        "policy": {k: len(v) for k, v in sorted(groups.items())},
        "policy_suite_only": {
            k: sum(not n.startswith("targeted:") for n in v) for k, v in sorted(groups.items())
        },
        "compiled": evidence(groups["compiled"]),
        "compiled_failures": [
            f for f in failures if verdicts.get(f["case"], ("",))[0] == "compiled"
        ],
        "compiled_model_cut_by_case": dict(
            sorted(
                ((n, model[n]["cut"]) for n in groups["compiled"] if model[n]["cut"]),
                key=lambda item: -item[1],
            )
        ),
        "regex_and_ebnf": {name: dict(counts) for name, counts in model.items() if ":" in name},
        "per_refused_keyword": per_keyword,
        "per_relaxed_keyword": per_relaxed_keyword,
        "per_xgrammar_warning": {
            w: evidence(names) | {"cases": names} for w, names in warned.items()
        },
        "refused_structure": {n: verdicts[n][1] for n in groups["refused_structure"]},
        "refused_structure_evidence": evidence(groups["refused_structure"]),
        "refused_error": {n: verdicts[n][1] for n in groups["refused_error"]},
        "unsound_cases": {n: len(v) for n, v in unsound.items()},
        "failures_sample": failures[:120],
        "generation": {"outputs": len(jobs), "tokens": tokens, "seconds": round(gen_time)},
        "seconds": round(time.time() - started),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({k: result[k] for k in ("policy", "compiled", "generation")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
