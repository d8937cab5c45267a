"""The data-parallel balancer's policy, its prefix shadow and the DP options, without ranks."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from deepinfer import LLM
from deepinfer.cache.prefix import BLOCK_SIZE
from deepinfer.dp.balancer import Balancer, PrefixIndex, choose_rank
from deepinfer.dp.options import DataParallelOptions, pop_options
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.engine import LLMEngine
from deepinfer.errors import InvalidRequestError


def test_choose_rank_least_loaded_without_affinity() -> None:
    assert choose_rank([5, 3, 3], [0, 0, 0], margin=100) == 1  # ties: the lower rank


def test_choose_rank_prefers_longest_cached_prefix() -> None:
    assert choose_rank([50, 0], [128, 0], margin=100) == 0
    assert choose_rank([50, 0, 40], [128, 0, 256], margin=100) == 2


def test_choose_rank_leaves_an_overloaded_rank() -> None:
    assert choose_rank([101, 0], [128, 0], margin=100) == 1
    assert choose_rank([100, 0], [128, 0], margin=100) == 0


def test_prefix_index_matches_leading_blocks_only() -> None:
    index = PrefixIndex(2, max_blocks=4)
    prompt = list(range(3 * BLOCK_SIZE + 5))
    index.add(1, PrefixIndex.keys(prompt[: 2 * BLOCK_SIZE]))
    assert index.matches(PrefixIndex.keys(prompt)) == [0, 2 * BLOCK_SIZE]
    other = [7, *prompt[1:]]  # a different first block: no later block can match
    assert index.matches(PrefixIndex.keys(other)) == [0, 0]
    index.add(1, PrefixIndex.keys([9] * (4 * BLOCK_SIZE)))  # over the bound: oldest go first
    assert index.matches(PrefixIndex.keys(prompt)) == [0, 0]


def test_balancer_groups_shared_prefixes_and_spreads_the_rest() -> None:
    balancer = Balancer(2, margin=10_000)
    shared = list(range(2 * BLOCK_SIZE))
    ranks = [balancer.route(f"s{i}", [*shared, i], [len(shared) + 20]) for i in range(4)]
    assert len(set(ranks)) == 1
    spread = [balancer.route(f"u{i}", [1000 + i] * 10, [30]) for i in range(4)]
    assert set(spread) == {1 - ranks[0]} or set(spread) == {0, 1}
    assert balancer.loads[ranks[0]] > 0
    for i in range(4):
        balancer.finish(f"s{i}")
        balancer.finish(f"u{i}")
    assert balancer.loads == [0, 0]


def test_balancer_spreads_unrelated_requests_evenly() -> None:
    balancer = Balancer(4, margin=0)
    ranks = [balancer.route(f"r{i}", [i] * 50, [60]) for i in range(8)]
    assert sorted(ranks) == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"data_parallel_size": 0}, "data_parallel_size"),
        ({"data_parallel_size": 2.0}, "data_parallel_size"),
        ({"enable_expert_parallel": 1}, "enable_expert_parallel"),
        ({"dp_timeout_s": 0}, "dp_timeout_s"),
        ({"dp_timeout_s": float("nan")}, "dp_timeout_s"),
        ({"dp_startup_timeout_s": 0}, "dp_startup_timeout_s"),
        ({"dp_affinity_margin_tokens": -1}, "dp_affinity_margin_tokens"),
    ],
)
def test_bad_options_are_refused(options: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        pop_options(dict(options))
    assert info.value.field == field


def test_batch_invariant_mode_is_refused() -> None:
    """It runs one forward per token: ranks would not pair their MoE collectives."""
    with pytest.raises(InvalidRequestError, match="data_parallel_size > 1") as info:
        DataParallelOptions(data_parallel_size=2).check(EngineConfig(batch_invariant=True))
    assert info.value.field == "batch_invariant"


@pytest.mark.parametrize("method", ["dspark", "mtp"])
def test_speculation_runs_in_lockstep(method: str) -> None:
    spec = {"method": method, "num_speculative_tokens": 2}
    config = EngineConfig(speculative_config=spec)
    DataParallelOptions(data_parallel_size=2).check(config)
    assert config.speculative_config == spec
    bad = EngineConfig(speculative_config={"method": method, "num_speculative_tokens": 0})
    with pytest.raises(InvalidRequestError) as info:
        DataParallelOptions(data_parallel_size=2).check(bad)
    assert info.value.field == "speculative_config"


@pytest.mark.parametrize("asked", [None, True, False])
def test_lockstep_keeps_graphs_and_the_asked_scheduling(asked: bool | None) -> None:
    """One forward a step either way: asynchronous scheduling stays as asked, and so does
    DSpark speculation (its drafter's layers hold no collective)."""
    dspark = {"method": "dspark", "num_speculative_tokens": 3}
    config = EngineConfig(async_scheduling=asked, speculative_config=dspark)
    DataParallelOptions(data_parallel_size=2).check(config)
    assert not config.enforce_eager and config.async_scheduling is asked
    assert config.speculative_config == dspark
    DataParallelOptions().check(untouched := EngineConfig())
    assert not untouched.enforce_eager and untouched.async_scheduling is None


def test_one_rank_is_the_plain_engine() -> None:
    llm = LLM("tiny", data_parallel_size=1, enable_expert_parallel=True)
    assert type(llm.engine) is LLMEngine
    assert not dist.is_initialized()
    out = llm.generate([[5, 6, 7]], use_tqdm=False)
    assert out[0].finished


def test_tensor_parallelism_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="tensor parallelism") as info:
        LLM("tiny", tensor_parallel_size=2, data_parallel_size=2)
    assert info.value.field == "tensor_parallel_size"


def test_cli_flags_reach_the_llm_options() -> None:
    from deepinfer.cli import build_parser, model_options

    args = build_parser().parse_args(
        ["generate", "hi", "--data-parallel-size", "2", "--enable-expert-parallel"]
    )
    options = model_options(args)
    assert options["data_parallel_size"] == 2 and options["enable_expert_parallel"] is True
    plain = model_options(build_parser().parse_args(["generate", "hi"]))
    assert plain["data_parallel_size"] == 1 and plain["enable_expert_parallel"] is False
