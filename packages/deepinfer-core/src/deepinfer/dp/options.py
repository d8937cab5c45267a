"""The data-parallel options of ``LLM(...)``, with vLLM's names, and what they rule out.

``data_parallel_size`` ranks each run attention for their own requests; with
``enable_expert_parallel`` the routed experts are split across them too (MoE EP). They are taken
out of the ``LLM`` options before :func:`~deepinfer.engine.config.engine_config` reads the rest,
so :class:`~deepinfer.engine.config.EngineConfig` stays the options of one rank's engine.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from deepinfer.checks import is_int, is_number
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.spec_config import SpeculativeConfig
from deepinfer.errors import InvalidRequestError

#: Bound on every collective, model load excepted: past it a rank counts as dead or hung.
DEFAULT_TIMEOUT_S = 300.0
#: How many more outstanding tokens than the least-loaded rank a rank may hold and still get
#: the requests whose prefix it caches (below it, a cache hit beats spreading the load).
DEFAULT_AFFINITY_MARGIN_TOKENS = 8192


@dataclass(frozen=True)
class DataParallelOptions:
    """``data_parallel_size``: ranks, one process each; ``enable_expert_parallel``: shard the
    routed experts over them (vLLM's names); ``dp_timeout_s``: the collective timeout that
    detects a dead or hung rank; ``dp_startup_timeout_s``: how long a rank may take to start
    (a process importing torch, then building its engine) before it counts as hung, where a
    deployment wants steps bounded more tightly than a model load (None: ``dp_timeout_s``);
    ``dp_affinity_margin_tokens``: the balancer's overload margin (:mod:`.balancer`)."""

    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    dp_timeout_s: float = DEFAULT_TIMEOUT_S
    dp_startup_timeout_s: float | None = None
    dp_affinity_margin_tokens: int = DEFAULT_AFFINITY_MARGIN_TOKENS

    def __post_init__(self) -> None:
        size = self.data_parallel_size
        if not is_int(size) or size < 1:
            raise InvalidRequestError(
                "data_parallel_size", f"must be a positive integer, got {size!r:.40}"
            )
        if not isinstance(self.enable_expert_parallel, bool):
            raise InvalidRequestError("enable_expert_parallel", "must be a boolean")
        if not is_number(self.dp_timeout_s) or not 0 < self.dp_timeout_s < math.inf:
            raise InvalidRequestError(
                "dp_timeout_s", f"must be a positive number, got {self.dp_timeout_s!r:.40}"
            )
        startup = self.dp_startup_timeout_s
        if startup is not None and (not is_number(startup) or not 0 < startup < math.inf):
            raise InvalidRequestError(
                "dp_startup_timeout_s", f"must be a positive number or None, got {startup!r:.40}"
            )
        margin = self.dp_affinity_margin_tokens
        if not is_int(margin) or margin < 0:
            raise InvalidRequestError(
                "dp_affinity_margin_tokens", f"must be an integer >= 0, got {margin!r:.40}"
            )

    @property
    def startup_timeout_s(self) -> float:
        """The bound on every wait of the start-up (:meth:`.group.RankGroup.wait_keys`)."""
        return self.dp_timeout_s if self.dp_startup_timeout_s is None else self.dp_startup_timeout_s

    @property
    def enabled(self) -> bool:
        """Whether several rank processes run (world size above 1)."""
        return self.data_parallel_size > 1

    def check(self, config: EngineConfig) -> None:
        """Refuse what cannot run in lockstep yet; nothing asked for is turned off.

        Every rank runs exactly one model forward per global step (each MoE layer is a
        collective), so step paths with several forwards are refused: batch-invariant mode (one
        forward per token). Speculation keeps one target forward a step: DSpark's drafter has
        layers of its own, with no collective; MTP's drafting passes through the MTP layer's MoE
        are matched across ranks by :mod:`~deepinfer.dp.lockstep`. Asynchronous scheduling
        keeps one forward a step (it reads the previous step's tokens while the next runs) and
        stays as asked (on by default on a GPU). Decode steps keep their CUDA graphs, each
        rank's captured at startup (:func:`~deepinfer.engine.graph_capture.
        capture_decode_graphs` and :mod:`~deepinfer.dp.lockstep` keep the ranks' exchanges
        at matching shapes)."""
        if not self.enabled:
            return
        SpeculativeConfig.parse(config.speculative_config)  # a malformed one is refused here
        if config.batch_invariant:
            raise InvalidRequestError(
                "batch_invariant",
                "cannot be combined with data_parallel_size > 1 yet (every rank must run "
                "exactly one model forward per step)",
            )


def pop_options(options: dict[str, object]) -> DataParallelOptions:
    """Take the data-parallel options out of ``LLM``'s keyword options (validated)."""
    names = [n for n in DataParallelOptions.__dataclass_fields__ if n in options]
    return DataParallelOptions(**{n: options.pop(n) for n in names})  # type: ignore[arg-type]


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    """The command line's data-parallel flags (vLLM's)."""
    p.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="ranks, one process each, every one running attention for its own requests",
    )
    p.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="split the routed experts over the data-parallel ranks (MoE expert parallelism)",
    )


def parallel_options(args: argparse.Namespace) -> dict[str, object]:
    """``LLM`` keyword arguments from the flags :func:`add_parallel_args` adds."""
    return {
        "data_parallel_size": args.data_parallel_size,
        "enable_expert_parallel": args.enable_expert_parallel,
    }
