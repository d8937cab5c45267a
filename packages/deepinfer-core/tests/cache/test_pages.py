"""Entry pages against a plain per-slot list of entries.

Random appends, reads, batched device-side writes and reads, releases and reuse of slots run
on a :class:`PageTable` with two compressors of different ratios, starting with too few pages
so the page tensors grow; after every operation each slot's entries must equal the reference
lists, pages a slot holds but has not written must read as zeros (handed out clean, even after
another slot used them), and the table must hold exactly the pages its slots' lengths need.
"""

from __future__ import annotations

import random

import pytest
import torch

from deepinfer.cache.pages import PageTable
from deepinfer.cache.slots import CompressorPool
from deepinfer.paging import PAGE_TOKENS, KeyPages, page_size

RATIOS = (4, 16)
DIMS = (3, 5)


def _table(max_pages: int, initial_pages: int) -> tuple[PageTable, list[CompressorPool]]:
    table = PageTable(
        rows=5,
        max_len=1000,
        max_pages=max_pages,
        initial_pages=initial_pages,
        device=torch.device("cpu"),
    )
    pools = [CompressorPool(ratio=r) for r in RATIOS]
    for pool, dim in zip(pools, DIMS, strict=True):
        table.add_pool(pool, torch.zeros(1, 0, dim))
    return table, pools


def test_pages_equal_per_slot_lists() -> None:
    rnd = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    table, pools = _table(max_pages=4 * 8, initial_pages=2)
    tokens = dict.fromkeys(range(1, 5), 0)  # slot -> tokens its sequence has seen
    ref: dict[int, list[list[torch.Tensor]]] = {s: [[], []] for s in tokens}  # per compressor

    def catch_up(slot: int) -> None:
        """Append each compressor's entries finished by the slot's tokens (a chunk's write)."""
        table.ensure(slot, tokens[slot])
        for pool, entries, r, d in zip(pools, ref[slot], RATIOS, DIMS, strict=True):
            new = torch.randn(tokens[slot] // r - len(entries), d, generator=gen)
            assert pool.pages is not None
            table.write(pool.pages, slot, len(entries), new[None])
            entries.extend(new.unbind())

    def check(slot: int) -> None:
        held = len(table.pages_of(slot))
        assert held == -(-tokens[slot] // PAGE_TOKENS)
        for pool, entries, r in zip(pools, ref[slot], RATIOS, strict=True):
            assert pool.pages is not None
            want = torch.stack(entries) if entries else pool.pages[0, :0]
            start = rnd.randrange(len(entries) + 1)
            got = table.read(pool.pages, slot, start, len(entries))[0]
            torch.testing.assert_close(got, want[start:], rtol=0, atol=0)
            unused = table.read(pool.pages, slot, len(entries), held * page_size(r))
            assert not unused.any(), "a page handed out must read as zeros"

    for _ in range(300):
        op = rnd.random()
        if op < 0.1:  # a sequence ends; its slot and pages go to the next one
            slot = rnd.randrange(1, 5)
            table.release(slot)
            tokens[slot], ref[slot] = 0, [[], []]
            assert not table.table[slot].any()
        elif op < 0.7:  # a prefill chunk of one sequence
            slot = rnd.randrange(1, 5)
            n = rnd.choice((1, 3, 17, 64, 130))
            if tokens[slot] + n <= 1000:
                tokens[slot] += n
                catch_up(slot)
        else:  # a decode step of several sequences on the indexed (device-side) path
            slots = [
                s for s in sorted(rnd.sample(range(1, 5), rnd.randint(1, 4))) if tokens[s] < 990
            ]
            if not slots:
                continue
            for s in slots:  # each closes its next ratio-4 window: one entry at index tokens // 4
                tokens[s] = (tokens[s] // 4 + 1) * 4
                table.ensure(s, tokens[s])
            rows, pool = torch.tensor(slots), pools[0]
            assert pool.pages is not None
            new = torch.randn(len(slots), DIMS[0], generator=gen)
            index = torch.tensor([len(ref[s][0]) for s in slots])
            table.scatter_rows(pool.pages, rows, index, new)
            for s, row in zip(slots, new, strict=True):
                ref[s][0].append(row)
            limit = max(len(ref[s][0]) for s in slots)
            view = table.rows_view(pool.pages, rows, limit)
            got = view.dense()
            # a top-k layer's read: a few entries of each row, straight from the pages
            picks = torch.stack(
                [torch.randint(0, len(ref[s][0]), (3,), generator=gen) for s in slots]
            )
            # as decode attention reads them in place: each pick's row of the flattened pages
            keys = KeyPages(view.pages, view.index, picks[:, None])
            in_place = pool.pages.flatten(0, 1)[keys.rows()]
            for i, s in enumerate(slots):
                n = len(ref[s][0])
                torch.testing.assert_close(got[i, :n], torch.stack(ref[s][0]), rtol=0, atol=0)
                want = torch.stack([ref[s][0][j] for j in picks[i].tolist()])
                torch.testing.assert_close(in_place[i], want, rtol=0, atol=0)
                catch_up(s)  # the ratio-16 compressor
        for s in tokens:
            check(s)
    assert table.num_pages > 2, "the page tensors never grew"


def test_pages_run_out_with_a_clear_error() -> None:
    table, _ = _table(max_pages=3, initial_pages=1)
    table.ensure(1, 2 * PAGE_TOKENS)
    with pytest.raises(RuntimeError, match="max_model_len"):
        table.ensure(2, 8 * PAGE_TOKENS + 1)  # max_len 1000: 8 pages
    with pytest.raises(RuntimeError, match="out of entry pages"):
        table.ensure(2, 2 * PAGE_TOKENS)
    table.ensure(2, PAGE_TOKENS)  # the last page
    table.release(1)
    table.ensure(2, 3 * PAGE_TOKENS)  # the released ones serve again
    assert sorted(table.pages_of(2)) == [1, 2, 3]


def test_ratios_must_divide_the_page() -> None:
    with pytest.raises(NotImplementedError, match="divide 128"):
        page_size(3)


def test_shared_pages_are_freed_by_their_last_reference() -> None:
    """A page mapped by two slots and held once more (a cached block) is free only after all
    three let go; a slot that maps shared pages writes only its own later ones; when the list
    runs dry, ``reclaim`` is asked to give up references until enough are free."""
    table, pools = _table(max_pages=3, initial_pages=3)
    pool = pools[0]
    assert pool.pages is not None
    table.ensure(1, 2 * PAGE_TOKENS)
    first, second = table.pages_of(1)
    table.write(pool.pages, 1, 0, torch.ones(1, 2 * page_size(RATIOS[0]), DIMS[0]))
    cached = table.hold(1, 0)
    assert cached == first
    table.share(2, [first])
    with pytest.raises(ValueError, match="already holds"):
        table.share(2, [second])
    table.ensure(2, PAGE_TOKENS + 1)  # its second block gets a page of its own
    assert table.pages_of(2)[0] == first and table.pages_of(2)[1] not in (first, second)
    assert not table.read(pool.pages, 2, page_size(RATIOS[0]), 2 * page_size(RATIOS[0])).any()
    assert table.read(pool.pages, 2, 0, page_size(RATIOS[0])).eq(1).all()
    assert table.num_free == 0
    table.release(1)  # `second` is free; `first` is still mapped by slot 2 and held
    assert table.num_free == 1
    table.release(2)
    assert table.num_free == 2  # `first` is still held
    asked: list[int] = []

    def reclaim() -> bool:
        asked.append(cached)
        if len(asked) > 1:
            return False
        table.drop(cached)
        return True

    table.reclaim = reclaim
    table.ensure(3, 3 * PAGE_TOKENS)  # needs all three: the held one must be given up
    assert asked == [cached] and table.num_free == 0
    with pytest.raises(RuntimeError, match="out of entry pages"):
        table.ensure(4, 1)
    assert len(asked) == 2  # asked once more, had nothing left
