"""``LLM("tiny")`` speculates by default with the shipped DSpark drafter where its steps are
synchronous (a CPU), losslessly, and its start-up profile is kept on disk for the next engine
(:mod:`deepinfer.engine.profile_cache`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.engine import verify_schedule
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.spec_config import TINY_SPECULATION, default_speculation
from deepinfer.engine.verify_profile import profile_step_cost
from deepinfer.models import causal_lm

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed any further, hear me speak."]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DEEPINFER_CACHE", str(tmp_path))
    return tmp_path / "profiles"


def _texts(llm: LLM, params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def test_tiny_speculates_by_default_and_none_turns_it_off(cache: Path) -> None:
    """The default engine drafts with DSpark on the confidence schedule and emits the greedy
    and seeded tokens of the engine without speculation."""
    default = LLM("tiny", device="cpu", max_num_seqs=4)
    spec = default.engine.spec
    assert spec is not None and spec.verifier is not None
    assert spec.k == TINY_SPECULATION["num_speculative_tokens"]
    plain = LLM("tiny", device="cpu", max_num_seqs=4, speculative_config=None)
    assert plain.engine.spec is None
    assert _texts(default) == _texts(plain)
    seeded = SamplingParams(temperature=1.0, top_k=50, seed=11, max_tokens=24, ignore_eos=True)
    assert _texts(default, seeded) == _texts(plain, seeded)
    logprobs = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=1)
    (got,), (want,) = (
        llm.generate(PROMPTS[:1], logprobs, use_tqdm=False) for llm in (default, plain)
    )
    assert got.prompt_logprobs is not None and want.prompt_logprobs is not None
    for a, b in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:], strict=True):
        assert a is not None and b is not None and a.keys() == b.keys()
        assert all(a[t] == pytest.approx(b[t], abs=1e-5) for t in a)


@pytest.mark.parametrize("option", [{"async_scheduling": True}, {"batch_invariant": True}])
def test_options_speculation_cannot_join_turn_the_default_off(
    cache: Path, option: dict[str, bool]
) -> None:
    llm = LLM("tiny", device="cpu", max_num_seqs=2, **option)
    assert llm.engine.spec is None
    assert len(_texts(llm)[0]) == GREEDY.max_tokens


def test_the_startup_profile_is_read_back_for_the_same_key(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second engine with the same key reads the first's tables instead of profiling; one
    with another key (rows), an unreadable file, or an unwritable folder profiles anew."""
    first = LLM("tiny", device="cpu", max_num_seqs=2).engine.spec
    assert first is not None and first.verifier is not None
    (saved,) = cache.glob("*.json")
    calls: list[int] = []
    profile = verify_schedule.profile_step_cost

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return profile(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_schedule, "profile_step_cost", counting)
    again = LLM("tiny", device="cpu", max_num_seqs=2).engine.spec
    assert again is not None and again.verifier is not None and calls == []
    assert again.verifier.cost == first.verifier.cost
    assert again.verifier.draft_cost == first.verifier.draft_cost
    LLM("tiny", device="cpu", max_num_seqs=4)
    assert calls == [1] and len(list(cache.glob("*.json"))) == 2
    saved.write_text("{not json")
    LLM("tiny", device="cpu", max_num_seqs=2)
    assert calls == [1, 1] and saved.read_text().startswith("{")
    monkeypatch.setenv("DEEPINFER_CACHE", str(saved))  # a file: no folder can be made there
    assert LLM("tiny", device="cpu", max_num_seqs=2).engine.spec is not None
    assert calls == [1, 1, 1]


def test_the_default_applies_to_the_embedded_model_with_synchronous_steps() -> None:
    """On a GPU asynchronous scheduling is on unless turned off, and wins; a checkpoint path,
    data parallelism, batch invariance and asynchronous scheduling each keep speculation off."""
    sync = EngineConfig(async_scheduling=False)
    assert default_speculation("tiny", EngineConfig(), False, "cpu") == TINY_SPECULATION
    assert default_speculation("tiny", sync, False, "cuda:0") == TINY_SPECULATION
    assert default_speculation("tiny", EngineConfig(), False, "cuda:0") is None
    assert default_speculation("/ckpt/DeepSeek-V4-Flash", EngineConfig(), False, "cpu") is None
    assert default_speculation("tiny", EngineConfig(), True, "cpu") is None
    assert default_speculation("tiny", EngineConfig(batch_invariant=True), False, "cpu") is None
    assert default_speculation("tiny", EngineConfig(async_scheduling=True), False, "cpu") is None


class WidthRecorder:
    """Each verification pass's row width (what a graph pads its rows to; None: unpadded)
    and longest row, by phase."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.phase = "engine"
        self.widths: dict[str, set[int | None]] = {}
        self.longest: dict[str, int] = {}
        real = causal_lm.run_verify

        def recording(  # noqa: PLR0917
            model: object,
            chunks: list[torch.Tensor],
            states: object,
            graphs: object,
            width: int | None = None,
            capture: tuple[int, ...] = (),
            drafts: torch.Tensor | None = None,
        ) -> object:
            self.widths.setdefault(self.phase, set()).add(width)
            longest = max(int(c.numel()) for c in chunks)
            self.longest[self.phase] = max(self.longest.get(self.phase, 0), longest)
            return real(model, chunks, states, graphs, width, capture, drafts)  # type: ignore[arg-type]

        monkeypatch.setattr(causal_lm, "run_verify", recording)


def test_the_profile_pads_verification_rows_to_the_engines_longest(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CUDA graphs every verification row is padded to one width, which the graph bakes
    in, and a library GEMM may pick a kernel several times slower for one row more: so the
    start-up profile's passes are padded to the engine's width, k + 1, the longest row the
    engine verifies (its last token and k drafts), although the profile's states keep one
    token more of slack. A CPU runs graphs eagerly: the profile is asked for them here."""
    recorder = WidthRecorder(monkeypatch)
    fixed = {**TINY_SPECULATION, "scheduling": "fixed"}
    llm = LLM("tiny", device="cpu", max_num_seqs=2, speculative_config=fixed)
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    spec = llm.engine.spec
    assert spec is not None
    recorder.phase = "profile"
    layers = tuple(getattr(spec.drafter, "feature_layers", ()))
    profile_step_cost(llm.engine.model, spec.k, 2, layers, repeats=1, cuda_graphs=True)
    assert recorder.longest["engine"] == spec.k + 1
    assert recorder.widths["profile"] == {spec.k + 1}
