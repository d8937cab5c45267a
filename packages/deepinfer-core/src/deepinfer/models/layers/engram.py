"""Engram: a hashed n-gram memory added to the residual streams at the start of a layer.

For every token the last 2..``engram_max_ngram_size`` tokens are hashed (see ``engram_hash``)
into ``n_sizes * engram_n_heads`` rows of one stacked table of ``engram_head_dim``-wide vectors.
The rows are flattened and ``wkv`` maps them to one key per residual stream and one shared value.
Each stream gates the value by how well it matches its key:

    s_i    = <q_weight_i * h_i / rms(h_i), k_weight_i * key_i / rms(key_i)> / sqrt(d)
    gate_i = sigmoid(sign(s_i) * sqrt(max(|s_i|, 1e-6)))
    X_i   += gate_i * value

Image-token positions get no Engram contribution.

Inferred (not pinned by a published reference we could read): ``wkv``'s output rows hold the
``hc_mult`` keys first, then the value; the RMS statistics use ``rms_norm_eps``; there is no short
convolution (the V4.1 key list has no weights for one). ``embed.scale`` (one ue8m0 scale per 32
values of a row) is consumed by the checkpoint reader, which hands us the dequantised table.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.backends.base import Backend
from deepinfer.config import ConfigError, ModelConfig
from deepinfer.models.layers.engram_hash import hash_multipliers, hash_rows, table_primes
from deepinfer.models.layers.norm import Embedding, Linear, fp32_param


def engram_vocab_sizes(cfg: ModelConfig) -> list[int]:
    """One table-size base per n-gram size (the config holds one int or a list)."""
    n_sizes = cfg.engram_max_ngram_size - 1
    sizes = cfg.engram_vocab_size
    if isinstance(sizes, int):
        return [sizes] * n_sizes
    if len(sizes) != n_sizes:
        raise ConfigError(f"engram_vocab_size has {len(sizes)} entries, expected {n_sizes}")
    return [int(v) for v in sizes]


class Engram(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        n, d = cfg.hc_mult, cfg.hidden_size
        primes = table_primes(cfg.engram_layer_ids, engram_vocab_sizes(cfg), cfg.engram_n_heads)
        flat = [p for size in primes[layer_id] for p in size]
        rows = sum(flat)
        index = cfg.engram_layer_ids.index(layer_id)
        if cfg.engram_num_embeddings and cfg.engram_num_embeddings[index] != rows:
            raise ConfigError(
                f"engram_num_embeddings[{index}]={cfg.engram_num_embeddings[index]} but the "
                f"hash primes of layer {layer_id} give {rows} rows"
            )
        n_tables = len(flat)
        self.embed = Embedding(rows, cfg.engram_head_dim, dtype)
        self.wkv = Linear(n_tables * cfg.engram_head_dim, (n + 1) * d, dtype, fp8_capable=True)
        self.q_weight = fp32_param(n, d)
        self.k_weight = fp32_param(n, d)
        self.rebuild_derived_buffers()

    def rebuild_derived_buffers(self) -> None:
        """(Re)compute the hash constants on the module's device: derived from the config, not
        checkpoint tensors, so a model planned on the meta device and then allocated gets them
        back here."""
        cfg, layer_id = self.cfg, self.layer_id
        primes = table_primes(cfg.engram_layer_ids, engram_vocab_sizes(cfg), cfg.engram_n_heads)
        flat = [p for size in primes[layer_id] for p in size]
        offsets = [sum(flat[:i]) for i in range(len(flat))]
        shape = (len(primes[layer_id]), cfg.engram_n_heads)
        device = self.q_weight.device
        multipliers = hash_multipliers(
            layer_id, cfg.engram_max_ngram_size, cfg.engram_compressed_vocab_size, cfg.engram_seed
        )
        self.register_buffer(
            "primes", torch.tensor(flat, device=device).view(shape), persistent=False
        )
        self.register_buffer(
            "offsets", torch.tensor(offsets, device=device).view(shape), persistent=False
        )
        self.register_buffer("multipliers", multipliers.to(device), persistent=False)

    def rows(self, compressed_ids: Tensor, history: int) -> Tensor:
        """Table rows [B, S, n_tables] for compressed ids [B, history + S] (``history``
        look-back columns in front), or for look-back windows [B, S, history + 1] (each
        token's own, the token last: a ragged pass's packed spans)."""
        return hash_rows(compressed_ids, history, self.multipliers, self.primes, self.offsets)

    def forward(
        self,
        ops: Backend,
        x: Tensor,
        compressed_ids: Tensor,
        history: int,
        skip: Tensor | None,
    ) -> Tensor:
        """Add the gated memory to streams ``x`` [B, S, n, d]; ``skip`` [B, S] marks image
        tokens (no contribution)."""
        b, s, n, d = x.shape
        memory = self.embed(self.rows(compressed_ids, history)).flatten(2)  # [B, S, tables*dim]
        kv = self.wkv(ops, memory)
        key = kv[..., : n * d].view(b, s, n, d)
        value = kv[..., n * d :].float()
        gate = ops.engram_gate(x, key, self.q_weight, self.k_weight, self.cfg.rms_norm_eps)
        if skip is not None:
            gate = gate.masked_fill(skip[..., None], 0.0)
        return (x.float() + gate[..., None] * value[:, :, None, :]).to(x.dtype)
