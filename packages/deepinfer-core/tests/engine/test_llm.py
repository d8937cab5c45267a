"""The offline API and the CLI on the embedded tiny model."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from reference import greedy_reference

from deepinfer.cache.pools import state_bytes, state_nbytes
from deepinfer.errors import InvalidRequestError
from deepinfer.llm import LLM
from deepinfer.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", device="cpu")


def test_generate_strings_and_token_lists_in_order(llm: LLM) -> None:
    prompts = ["ROMEO:", [5, 6, 7, 8], "To be, or not to be"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert [o.prompt for o in outs] == ["ROMEO:", None, "To be, or not to be"]
    for prompt, out in zip(prompts, outs, strict=True):
        ids = llm.tokenizer.encode(prompt).ids if isinstance(prompt, str) else prompt
        assert out.prompt_token_ids == ids
        assert out.outputs[0].token_ids == greedy_reference(llm.engine.model, ids, 4, eos=1)
        assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids)


def test_generate_validates_before_running(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="sampling_params"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="prompt"):
        llm.generate([[1, 2], 3.5], use_tqdm=False)  # type: ignore[list-item]
    assert not llm.engine.has_unfinished_requests()


def test_stream_grows_and_close_aborts(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=6)
    outs = list(llm.stream("ROMEO:", params))
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    # a step emits one token, or several when the default speculation keeps drafts
    assert lengths[-1] == 6 and all(a < b for a, b in itertools.pairwise(lengths))
    (whole,) = llm.generate(["ROMEO:"], params, use_tqdm=False)
    assert outs[-1].outputs[0].token_ids == whole.outputs[0].token_ids
    gen = llm.stream("JULIET:", SamplingParams(max_tokens=100, ignore_eos=True))
    next(gen)
    gen.close()
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.pool.used_bytes == 0


def test_pool_accounting_bounds_real_state(model) -> None:  # type: ignore[no-untyped-def]
    for n in (1, 5, 127, 128, 300):
        state = model.new_state(1)
        model.step(torch.randint(3, 8000, (1, n)), state)
        assert state_nbytes(state) <= state_bytes(model.cfg, model.dtype, n)


def test_cli_generate_and_bench(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "deepinfer",
        "generate",
        "ROMEO:",
        "--max-tokens",
        "5",
        "--device",
        "cpu",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert res.stdout.startswith("ROMEO:")
    assert "5 tokens" in res.stderr
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "-m",
        "deepinfer",
        "bench",
        "--num-seqs",
        "3",
        "--max-input-len",
        "20",
        "--max-output-len",
        "20",
        "--device",
        "cpu",
        "--json",
        str(out),
    ]
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    result = json.loads(out.read_text())
    assert result["num_seqs"] == 3 and result["output_tokens"] >= 3 * 16
    assert result["async_scheduling"] is False  # nothing to overlap on the CPU
