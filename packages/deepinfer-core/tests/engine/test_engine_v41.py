"""The engine on a V4.1 model (the embedded tiny one): shared compressors, Engram history."""

from __future__ import annotations

import pytest
import torch
from reference import greedy_reference, random_prompts

from deepinfer.assets import TINY_DIR, tiny_model, tiny_tokenizer
from deepinfer.cache.pools import state_bytes, state_nbytes
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.errors import InvalidRequestError
from deepinfer.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(
    not (TINY_DIR / "model.safetensors").is_file(), reason="the trained tiny model is not embedded"
)


@pytest.fixture(scope="module")
def v41():  # type: ignore[no-untyped-def]
    return tiny_model(torch.float32)


def test_greedy_with_prefix_hits_and_chunking_matches_reference(v41) -> None:  # type: ignore[no-untyped-def]
    shared = random_prompts(1, 260, 260, seed=30)[0]
    prompts = [[*shared, 40 + i] for i in range(3)]
    expected = [greedy_reference(v41, p, 5, eos=1) for p in prompts]
    engine = LLMEngine(v41, tiny_tokenizer(), EngineConfig(max_num_batched_tokens=45))
    params = SamplingParams(temperature=0.0, max_tokens=5)
    first = engine.add_request(prompts[0], params)
    out0 = engine.run([first])[first]
    rest = [engine.add_request(p, params) for p in prompts[1:]]
    final = engine.run(rest)
    got = [out0.outputs[0].token_ids] + [final[r].outputs[0].token_ids for r in rest]
    assert got == expected
    assert all(final[r].metrics.num_cached_tokens == 256 for r in rest)


def test_pool_accounting_bounds_v41_state(v41) -> None:  # type: ignore[no-untyped-def]
    for n in (1, 7, 128, 300):
        state = v41.new_state(1)
        v41.step(torch.randint(3, 8000, (1, n)), state)
        assert state_nbytes(state) <= state_bytes(v41.cfg, v41.dtype, n)


def test_image_placeholder_prompt_fails_alone(v41) -> None:  # type: ignore[no-untyped-def]
    engine = LLMEngine(v41, tiny_tokenizer(), EngineConfig())
    params = SamplingParams(temperature=0.0, max_tokens=3)
    with pytest.raises(InvalidRequestError, match="image placeholder"):
        engine.add_request([5, v41.cfg.image_token_id, 7], params)
    ok = engine.add_request([5, 6, 7], params)
    out = engine.run([ok])[ok]
    assert out.outputs[0].token_ids == greedy_reference(v41, [5, 6, 7], 3, eos=1)
