"""The independent reference: greedy decoding as a plain loop over full-sequence forwards."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from deepinfer.models.deepseek_v4 import DeepseekV4ForCausalLM

#: Engine options that schedule the same requests very differently: one at a time, small
#: chunks beside other requests, tiny chunks without the prefix cache, everything at once.
SCHEDULES: dict[str, dict[str, object]] = {
    "one-at-a-time": {"max_num_seqs": 1, "max_num_batched_tokens": 4096},
    "chunk-37": {"max_num_seqs": 3, "max_num_batched_tokens": 37},
    "chunk-7-no-cache": {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 7,
        "enable_prefix_caching": False,
    },
    "all-at-once": {"max_num_seqs": 8, "max_num_batched_tokens": 512},
}


def greedy_reference(
    model: DeepseekV4ForCausalLM,
    prompt: list[int],
    max_tokens: int,
    eos: int | None = None,
    adjust: Callable[[Tensor], Tensor] | None = None,
) -> list[int]:
    """``adjust``: what the request's parameters do to the last position's logits [V]."""
    ids = list(prompt)
    out: list[int] = []
    for _ in range(max_tokens):
        logits = model.forward_logits(torch.tensor([ids]))[0, -1]
        if adjust is not None:
            logits = adjust(logits)
        token = int(torch.argmax(logits))
        out.append(token)
        ids.append(token)
        if token == eos:
            break
    return out


def random_prompts(n: int, lo: int, hi: int, seed: int, vocab: int = 8192) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    # Avoid the EOS id (1) in prompts so outputs are about generation only.
    return [(torch.randint(3, vocab, (k,), generator=g)).tolist() for k in lengths]
