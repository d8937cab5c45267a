"""Which rank a new request goes to: least outstanding tokens, plus prefix-cache affinity.

A rank whose prefix cache holds the request's longest cached prefix gets it (the prefix is
restored instead of computed), unless that rank holds more than ``margin`` outstanding tokens
beyond the least-loaded rank; otherwise the least-loaded rank gets it, which spreads unrelated
requests. The front end cannot look into the ranks' caches without a collective, so it keeps a
shadow of them (:class:`PrefixIndex`): the prompt blocks it sent to each rank, keyed as the
caches key them. The shadow may hold blocks a rank has evicted; a wrong guess costs a
recompute, never a wrong output.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from deepinfer.cache.prefix import BLOCK_SIZE, block_key

#: Blocks remembered per rank (oldest forgotten first): a bound on the front end's memory.
MAX_BLOCKS_PER_RANK = 1 << 16


def choose_rank(loads: Sequence[int], matches: Sequence[int], margin: int) -> int:
    """The rank for a request: the one with the longest cached prefix (``matches``, tokens;
    ties to the less loaded, then the lower rank) unless its load exceeds the least load by
    more than ``margin`` tokens; else the least-loaded rank (ties to the lower rank)."""
    least = min(range(len(loads)), key=lambda r: (loads[r], r))
    best = min(range(len(loads)), key=lambda r: (-matches[r], loads[r], r))
    if matches[best] > 0 and loads[best] - loads[least] <= margin:
        return best
    return least


@dataclass
class PrefixIndex:
    """Per rank, the keys of the prompt blocks sent there (least recently used first)."""

    world_size: int
    max_blocks: int = MAX_BLOCKS_PER_RANK
    ranks: list[OrderedDict[bytes, None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ranks = [OrderedDict() for _ in range(self.world_size)]

    @staticmethod
    def keys(token_ids: Sequence[int]) -> list[bytes]:
        """The chained keys of the prompt's full blocks, as the prefix cache keys them."""
        out: list[bytes] = []
        parent: bytes | None = None
        for end in range(BLOCK_SIZE, len(token_ids) + 1, BLOCK_SIZE):
            parent = block_key(parent, list(token_ids[end - BLOCK_SIZE : end]))
            out.append(parent)
        return out

    def matches(self, keys: Sequence[bytes]) -> list[int]:
        """Per rank, the tokens of the longest run of leading blocks it holds."""
        out = []
        for held in self.ranks:
            n = 0
            while n < len(keys) and keys[n] in held:
                n += 1
            out.append(n * BLOCK_SIZE)
        return out

    def clear(self) -> None:
        for held in self.ranks:
            held.clear()

    def add(self, rank: int, keys: Sequence[bytes]) -> None:
        held = self.ranks[rank]
        for key in keys:
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.max_blocks:
            held.popitem(last=False)


@dataclass
class Balancer:
    """Routes requests (:func:`choose_rank`) and keeps each rank's outstanding tokens: what
    its requests may still compute (prompt beyond the cached prefix, plus every token they may
    generate), added when routed and taken back when they finish."""

    world_size: int
    margin: int
    loads: list[int] = field(default_factory=list)
    index: PrefixIndex = field(init=False)
    #: request id -> (rank, tokens counted in its load)
    placed: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.loads = [0] * self.world_size
        self.index = PrefixIndex(self.world_size)

    def route(self, request_id: str, prompt: Sequence[int], max_total_tokens: list[int]) -> int:
        """Place a request whose samples may reach ``max_total_tokens`` tokens each."""
        keys = PrefixIndex.keys(prompt)
        matches = self.index.matches(keys)
        rank = choose_rank(self.loads, matches, self.margin)
        cost = sum(total - matches[rank] for total in max_total_tokens)
        self.index.add(rank, keys)
        self.loads[rank] += cost
        self.placed[request_id] = (rank, cost)
        return rank

    def rank_of(self, request_id: str) -> int | None:
        placed = self.placed.get(request_id)
        return placed[0] if placed is not None else None

    def finish(self, request_id: str) -> None:
        """The request ended (or was aborted): its tokens leave its rank's load."""
        placed = self.placed.pop(request_id, None)
        if placed is not None:
            self.loads[placed[0]] -= placed[1]
