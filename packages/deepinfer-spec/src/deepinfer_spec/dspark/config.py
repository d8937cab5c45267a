"""DSpark drafter configuration: the block, the target layers it reads and its own sizes."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepinfer.config import ModelConfig


@dataclass(frozen=True)
class DSparkConfig:
    """Shapes of a DSpark drafter (``dspark.md`` §3) for one target.

    The block is the anchor followed by ``block_size - 1`` noise tokens; slot j predicts the
    token at the anchor's position + j + 1, so a round proposes ``block_size`` drafts. The
    context features are the raw outputs of ``target_layer_ids`` (never the final layer: its
    output is what the head reads, not a feature the drafter was meant to see); a V4 layer
    outputs ``hc_mult`` residual streams, all of which are concatenated.
    """

    vocab_size: int
    hidden_size: int
    hc_mult: int
    target_layer_ids: tuple[int, ...]
    noise_token_id: int
    block_size: int = 5
    num_layers: int = 2
    num_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 256
    markov_rank: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    #: context positions a block attends to: the last ``sliding_window`` before its anchor
    #: (``dspark.md`` §3.5; None: all of them). Bounded, each request's context fits a ring
    #: of fixed size, which is what lets a GPU replay drafting rounds from CUDA graphs.
    sliding_window: int | None = None
    #: what the drafter was trained against (checked when it is loaded)
    target: dict[str, Any] = field(default_factory=dict)

    @property
    def feature_size(self) -> int:
        return len(self.target_layer_ids) * self.hc_mult * self.hidden_size

    @classmethod
    def for_target(cls, cfg: ModelConfig, **sizes: Any) -> DSparkConfig:
        """A drafter for ``cfg``: its hidden size and streams, three evenly spaced non-final
        target layers, the padding token as the noise token (else the last id) unless given."""
        n = cfg.num_hidden_layers
        layers = sizes.pop("target_layer_ids", None)
        if layers is None:
            layers = sorted({max(0, round(i * (n - 1) / 4)) for i in (1, 2, 3)} - {n - 1})
        pad = cfg.pad_token_id
        noise = sizes.pop("noise_token_id", cfg.vocab_size - 1 if pad is None else pad)
        target = {"hidden_size": cfg.hidden_size, "num_hidden_layers": n,
                  "vocab_size": cfg.vocab_size}  # fmt: skip
        return cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            hc_mult=cfg.hc_mult,
            target_layer_ids=tuple(layers),
            noise_token_id=noise,
            target=target,
            **sizes,
        )

    def check_target(self, cfg: ModelConfig) -> None:
        """ValueError unless ``cfg`` is the target this drafter reads."""
        n = cfg.num_hidden_layers
        if (cfg.hidden_size, cfg.vocab_size, cfg.hc_mult) != (
            self.hidden_size,
            self.vocab_size,
            self.hc_mult,
        ) or any(not 0 <= i < n - 1 for i in self.target_layer_ids):
            raise ValueError(
                f"the DSpark drafter was built for {self.target}, not for a model with hidden "
                f"size {cfg.hidden_size}, vocabulary {cfg.vocab_size} and {n} layers"
            )

    def to_json(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: Path) -> DSparkConfig:
        raw = json.loads(path.read_text())
        raw["target_layer_ids"] = tuple(raw["target_layer_ids"])
        return cls(**raw)
