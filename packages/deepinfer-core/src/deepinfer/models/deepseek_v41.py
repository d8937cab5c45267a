"""DeepSeek-V4.1 placeholder, registered so that asking for it gives a precise error.

V4.1-Flash (``model_type: deepseek_v41``) differs from V4 in ways this package does not implement
yet: the nested ``text_config``/``vision_config``, ratio-1/2 compressors shared across layer
groups (``kv_source_layer_ids``), shared indexer top-k and the two-level candidate blocks, lagged
mHC pre-mix without ``hc_head``, Engram n-gram memory, three MTP layers, and the vision tower.
"""

from __future__ import annotations

from typing import Any, NoReturn

MISSING = (
    "nested text_config parsing",
    "shared ratio-1/2 compressors (kv_source_layer_ids)",
    "shared indexer and candidate blocks (index_source_layer_ids, candidate_*)",
    "lagged mHC pre-mix (hc_pre_from_prev_sublayer)",
    "Engram (engram_layer_ids)",
    "vision tower",
)


class DeepseekV41ForCausalLM:
    def __init__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            "DeepSeek-V4.1 (deepseek_v41) is not implemented yet; missing: " + "; ".join(MISSING)
        )
