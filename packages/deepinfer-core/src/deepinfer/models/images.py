"""Image embeddings in place of the image placeholder tokens (V4.1).

The vision tower runs outside the model: a caller that ran it passes the aligned image
embeddings, one row per image token of the ids (row-major over batch then position), and they
replace the token embeddings there. Image positions also skip Engram and route experts with the
image bias, so the mask of where they are goes along.
"""

from __future__ import annotations

from torch import Tensor

from deepinfer.models.layers.norm import Embedding


def embed_tokens(
    embed: Embedding, image_token_id: int | None, input_ids: Tensor, image_embeds: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """Token embeddings of ``input_ids`` [B, S] with ``image_embeds`` [n, d] in place of the
    image tokens, and where those are (None: text only)."""
    e = embed(input_ids)
    if image_token_id is None:
        if image_embeds is not None:
            raise ValueError("this model takes no images (its config has no image_token_id)")
        return e, None
    is_image = input_ids == image_token_id
    n_images = int(is_image.sum())
    if image_embeds is None:
        if n_images:
            raise ValueError(
                f"input_ids hold {n_images} image tokens ({image_token_id}) but no image_embeds "
                "were given (the vision tower runs outside this model)"
            )
        return e, None
    if tuple(image_embeds.shape) != (n_images, e.shape[-1]):
        raise ValueError(
            f"image_embeds must be [{n_images}, {e.shape[-1]}] (one row per image token), "
            f"got {tuple(image_embeds.shape)}"
        )
    e = e.clone()
    e[is_image] = image_embeds.to(device=e.device, dtype=e.dtype)
    return e, is_image if n_images else None
