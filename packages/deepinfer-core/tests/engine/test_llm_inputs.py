"""What the offline API accepts and refuses: vLLM's prompt types, every option type-checked
with the field named, and whole calls validated before anything is queued."""

from __future__ import annotations

from typing import Any

import pytest
from reference import greedy_reference
from tokenizers import Tokenizer

from deepinfer.assets import TINY_TOKENIZER
from deepinfer.errors import InvalidRequestError
from deepinfer.llm import LLM
from deepinfer.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", device="cpu")


def assert_idle(llm: LLM) -> None:
    """Nothing queued, running, held or owned."""
    engine = llm.engine
    assert not engine.has_unfinished_requests() and not engine.groups
    assert engine.pool.used_bytes == 0
    assert not llm._owned and not llm._latest


def reference(llm: LLM, ids: list[int], n: int = 4) -> list[int]:
    return greedy_reference(llm.engine.model, ids, n, eos=1)


# -- prompt types -----------------------------------------------------------------------------


def test_vllm_prompt_dicts(llm: LLM) -> None:
    text = "ROMEO:"
    ids = llm.tokenizer.encode(text, add_special_tokens=False).ids
    outs = llm.generate(
        [{"prompt": text}, {"prompt_token_ids": ids}, {"prompt_token_ids": ids, "prompt": "x"}],
        GREEDY,
        use_tqdm=False,
    )
    assert [o.prompt for o in outs] == [text, None, "x"]
    for out in outs:
        assert out.prompt_token_ids == ids
        assert out.outputs[0].token_ids == reference(llm, ids)
    (single,) = llm.generate({"prompt": text}, GREEDY, use_tqdm=False)
    assert single.prompt_token_ids == ids
    assert llm.generate([], GREEDY, use_tqdm=False) == []
    assert_idle(llm)


@pytest.mark.parametrize(
    ("prompts", "field", "words"),
    [
        (b"ROMEO", "prompts", "bytes"),
        ([b"ROMEO"], "prompt", "decode bytes"),
        ([True, 5], "prompt", "bool"),
        ([[5, 6], [7, 8.0]], "prompt", "float"),
        (None, "prompts", "NoneType"),
        ({"text": "x"}, "prompt.text", "unknown key"),
        ({"prompt": "x", "multi_modal_data": {}}, "prompt.multi_modal_data", "vision"),
        ({"prompt_token_ids": "12"}, "prompt.prompt_token_ids", "list"),
        ({}, "prompt", "needs"),
        (3, "prompts", "int"),
        ([object()], "prompt", "object"),
    ],
)
def test_other_prompt_objects_are_refused_naming_them(
    llm: LLM, prompts: Any, field: str, words: str
) -> None:
    with pytest.raises(InvalidRequestError, match=words) as err:
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert err.value.field == field
    assert_idle(llm)


# -- whole calls validated first --------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ("", "prompt"),  # tokenizes to nothing
        ([], "prompt"),
        ([5, 99999], "prompt"),
        (list(range(3, 4200)), "prompt"),  # longer than max_model_len
        (SamplingParams(logit_bias={99999: 1}), "logit_bias"),
        (SamplingParams(allowed_token_ids=[99999]), "allowed_token_ids"),
        (SamplingParams(stop_token_ids=[99999]), "stop_token_ids"),
    ],
)
def test_a_bad_request_queues_nothing_and_names_its_index(llm: LLM, bad: Any, field: str) -> None:
    prompts: list[Any] = ["ROMEO:", [5, 6, 7], "JULIET:"]
    params = [GREEDY] * 3
    if isinstance(bad, SamplingParams):
        params[2] = bad
    else:
        prompts[2] = bad
    with pytest.raises(InvalidRequestError) as err:
        llm.generate(prompts, params, use_tqdm=False)
    assert (err.value.field, err.value.index) == (field, 2)
    assert str(err.value).startswith(f"prompt 2: {field}: ")
    assert_idle(llm)
    # The earlier prompts did not run in the background: the next call sees only its own.
    (out,) = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert out.outputs[0].token_ids == reference(llm, [5, 6, 7])
    assert_idle(llm)


@pytest.mark.parametrize(
    ("constraint", "field"),
    [
        ({"regex": "[a-z"}, "structured_outputs.regex"),
        ({"json": {"type": "array", "uniqueItems": True}}, "structured_outputs.json"),
    ],
)
def test_a_constraint_that_does_not_compile_queues_nothing(
    llm: LLM, constraint: dict[str, Any], field: str
) -> None:
    pytest.importorskip("deepinfer_structured")
    params = [GREEDY, GREEDY, SamplingParams(structured_outputs=constraint)]
    with pytest.raises(InvalidRequestError, match="cannot be compiled") as err:
        llm.generate(["ROMEO:", "JULIET:", "HAMLET:"], params, use_tqdm=False)
    assert (err.value.field, err.value.index) == (field, 2)
    assert_idle(llm)


def test_params_mutated_after_construction_are_checked_again(llm: LLM) -> None:
    params = SamplingParams(max_tokens=4)
    params.temperature = "hot"  # type: ignore[assignment]
    with pytest.raises(InvalidRequestError, match="temperature"):
        llm.generate(["a", "b"], params, use_tqdm=False)
    assert_idle(llm)


# -- wrong types name the field ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"temperature": "0.5"}, "temperature"),
        ({"structured_outputs": -1}, "structured_outputs"),
        ({"skip_special_tokens": {}}, "skip_special_tokens"),
        ({"max_tokens": 2.0}, "max_tokens"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"²": 1}}, "logit_bias"),
        ({"bad_words": [3]}, "bad_words"),
        ({"seed": "1"}, "seed"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"structured_outputs": {"regex": 5}}, "structured_outputs.regex"),
        ({"structured_outputs": {1: "a"}}, "structured_outputs"),
    ],
)
def test_sampling_param_types(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert err.value.field == field


def test_generate_argument_types(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="from_dict") as err:
        llm.generate("a", {"max_tokens": 3}, use_tqdm=False)  # type: ignore[arg-type]
    assert err.value.field == "sampling_params"
    with pytest.raises(InvalidRequestError, match="sampling_params"):
        llm.generate(["a", "b"], [GREEDY, "x"], use_tqdm=False)  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError, match="priority"):
        llm.generate(["a"], GREEDY, priority=[True], use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="n: 300 samples exceed max_num_seqs"):
        llm.generate("a", SamplingParams(n=300), use_tqdm=False)
    assert_idle(llm)


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"max_model_len": "64"}, "max_model_len", "integer"),
        ({"max_model_len": 10**9}, "max_model_len", "max_position_embeddings"),
        ({"enable_prefix_caching": "no"}, "enable_prefix_caching", "boolean"),
        ({"state_memory_bytes": 1000}, "state_memory_bytes", "one request's state"),
        ({"max_num_seqs": 0}, "max_num_seqs", "positive"),
        ({"async_scheduling": "yes"}, "async_scheduling", "boolean"),
        ({"tensor_parallel_size": 2}, "tensor_parallel_size", "not implemented"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization", r"\(0, 1\]"),
        ({"max_num_seq": 8}, "max_num_seq", "did you mean max_num_seqs"),
        ({"trust_remote_code": "yes"}, "trust_remote_code", "boolean"),
    ],
)
def test_engine_options_are_checked(options: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words) as err:
        LLM("tiny", device="cpu", **options)
    assert err.value.field == field


def test_vllm_options_are_accepted() -> None:
    llm = LLM(
        "tiny",
        device="cpu",
        tensor_parallel_size=1,
        gpu_memory_utilization=0.9,  # sizes the state budget on a GPU; nothing on a CPU
        trust_remote_code=True,
        max_model_len=256,
    )
    assert llm.engine.max_model_len == 256
    text = "ROMEO: But soft!"
    from_file = Tokenizer.from_file(str(TINY_TOKENIZER)).encode(text).ids
    assert llm.get_tokenizer().encode(text).ids == from_file


# -- chat --------------------------------------------------------------------------------------


def test_chat_takes_one_sampling_params_per_conversation(llm: LLM) -> None:
    convs = [
        [{"role": "user", "content": "Who goes there?"}],
        [{"role": "user", "content": "Speak."}],
    ]
    params = [
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
    ]
    outs = llm.chat(convs, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 5]
    for out in outs:
        assert out.outputs[0].token_ids == reference(
            llm, out.prompt_token_ids, len(out.outputs[0].token_ids)
        )
    with pytest.raises(InvalidRequestError, match="got 1 for 2 prompts"):
        llm.chat(convs, params[:1], use_tqdm=False)
    with pytest.raises(InvalidRequestError) as err:
        llm.chat([convs[0], [{"role": "nobody", "content": "x"}]], use_tqdm=False)
    assert err.value.index == 1
    assert_idle(llm)
