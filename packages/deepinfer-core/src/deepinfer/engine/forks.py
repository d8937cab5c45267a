"""The samples of one request (``n`` > 1) share its prompt: the first runs it, the others fork.

Once the first sample's prompt has run, each waiting sibling that fits gets a copy of its
state (:meth:`StateSlots.clone <deepinfer.cache.slots.StateSlots.clone>`) and continues from
there; one that does not fit runs the prompt itself later. A fork also takes the first
sample's place in the prefix cache's chain, so the blocks it completes extend that chain.

Without speculation the samples draw their first tokens from the first sample's last logits.
With it, a fork is rolled back one token and runs the prompt's last token itself: its first
draw and its drafter's positions are then its own, as any request's after a prefill
(a state holds speculative slack, so the rollback is exact).
"""

from __future__ import annotations

import time

from deepinfer.cache.prefix import Block
from deepinfer.cache.slots import StateSlots
from deepinfer.engine.request import Request, RequestStatus
from deepinfer.engine.runner import Due
from deepinfer.engine.scheduler import Scheduler
from deepinfer.models.causal_lm import DeepseekCausalLM


def fork_children(parent: Request, scheduler: Scheduler, slots: StateSlots) -> list[Request]:
    """Give each waiting sibling of ``parent`` (whose prompt has just run) a copy of its
    state, where one fits; returns those forked. The parent forks once."""
    forked = []
    for child in parent.fork_children:
        if child.finished or child.status is not RequestStatus.WAITING:
            continue
        if scheduler.try_fork(parent, child):
            assert parent.state is not None
            child.state = slots.clone(parent.state)
            child.cache_block = parent.cache_block
            child.metrics.first_scheduled_time = time.monotonic()
            forked.append(child)
    parent.fork_children = []
    return forked


def fork_due(due: Due, scheduler: Scheduler, slots: StateSlots) -> Due:
    """The forks of the requests in ``due`` whose prompts have just run, each due a token
    from the same logits as the request it forked from."""
    extra: Due = []
    for batch, rows in due:
        for i, req in enumerate(batch):
            if not req.output_token_ids and req.fork_children:
                forked = fork_children(req, scheduler, slots)
                extra += [([child], rows[i : i + 1]) for child in forked]
    return extra


def fork_for_speculation(
    parent: Request, scheduler: Scheduler, slots: StateSlots, model: DeepseekCausalLM
) -> None:
    """:func:`fork_children`, each fork rolled back to before the prompt's last token (see
    the module), before ``parent`` takes in its first token."""
    for child in fork_children(parent, scheduler, slots):
        assert child.state is not None
        end = child.num_computed_tokens - 1
        model.rollback(child.state, end, child.prompt_token_ids)
        scheduler.update_from_output({child: end})
        child.cache_block = _block_within(child.cache_block, end)


def _block_within(block: Block | None, end: int) -> Block | None:
    """The last block of ``block``'s chain that ends at or before ``end``."""
    while block is not None and block.end > end:
        block = block.parent
    return block
