"""DeepSeek-V4: its layer stack on the shared model (:mod:`.causal_lm`).

Every layer is one :class:`~deepinfer.models.layers.block.Block`: mHC(attention) then mHC(MoE);
the final streams collapse through ``hc_head`` before the norm and the head.

Usage::

    model = DeepseekV4ForCausalLM(cfg, dtype=torch.bfloat16, device="cuda")
    logits = model.forward_logits(ids)              # whole sequence, no state kept
    state = model.new_state(batch_size=1)
    logits = model.step(ids[:, :37], state)         # any chunking gives the same logits
    logits = model.step(ids[:, 37:38], state)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from deepinfer.config import ModelConfig
from deepinfer.models.causal_lm import DeepseekCausalLM
from deepinfer.models.layers.block import Block, ForwardContext
from deepinfer.models.layers.mhc import HyperConnection
from deepinfer.models.trunk import LayerInputs, take_rows


class DeepseekV4ForCausalLM(DeepseekCausalLM):
    def build_layers(self, cfg: ModelConfig, dtype: torch.dtype) -> nn.ModuleList:
        return nn.ModuleList(Block(cfg, i, dtype) for i in range(cfg.num_hidden_layers))

    def run_layers(self, inputs: LayerInputs) -> tuple[Tensor, Tensor]:
        ids = inputs.input_ids
        e = self.embed(ids) if inputs.embeds is None else inputs.embeds
        ctx = ForwardContext(self.ops, inputs.positions, ids, self.rotary)
        x = e[:, :, None, :].expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        for layer, layer_state in zip(self.layers, inputs.layer_states, strict=True):
            x = layer(x, ctx, layer_state)
        last = take_rows(x, inputs.rows)
        return self.logits(HyperConnection(self, "hc_head", self.cfg).head(self.ops, last)), x
