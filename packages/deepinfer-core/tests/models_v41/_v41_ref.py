"""A plain float64 re-implementation of the DeepSeek-V4.1 text model, written from the model
reference (model-deepseek-v4.md §3 and §5), independent of ``deepinfer.models``.

Everything runs on one sequence at a time, token by token where that is the obvious reading of
the spec, with the weights read by their official checkpoint names from a state dict. It is slow
and only meant for tiny configs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

F64 = torch.float64


def rms(x: Tensor, w: Tensor | None, eps: float) -> Tensor:
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w.to(F64)


def inv_freq(rope_dim: int, theta: float, yarn: dict[str, Any] | None) -> Tensor:
    i = torch.arange(rope_dim // 2, dtype=F64)
    f = theta ** (-2 * i / rope_dim)
    if not yarn:
        return f
    orig, factor = yarn["original_max_position_embeddings"], yarn["factor"]

    def c(k: float) -> float:
        return rope_dim * math.log(orig / (k * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(c(yarn["beta_fast"])), 0)
    high = min(math.ceil(c(yarn["beta_slow"])), rope_dim - 1)
    if low == high:
        high += 0.001
    smooth = 1 - ((i - low) / (high - low)).clamp(0, 1)
    return f / factor * (1 - smooth) + f * smooth


def rope(x: Tensor, pos: int, freqs: Tensor, inverse: bool = False) -> Tensor:
    """Interleaved RoPE on the last 2*len(freqs) channels of a vector (or [..., D])."""
    out = x.clone()
    r = 2 * freqs.shape[0]
    for i in range(freqs.shape[0]):
        ang = pos * freqs[i] * (-1 if inverse else 1)
        a, b = x[..., -r + 2 * i], x[..., -r + 2 * i + 1]
        out[..., -r + 2 * i] = a * math.cos(ang) - b * math.sin(ang)
        out[..., -r + 2 * i + 1] = a * math.sin(ang) + b * math.cos(ang)
    return out


def mhc_weights(
    x: Tensor, fn: Tensor, base: Tensor, scale: Tensor, cfg: dict[str, Any]
) -> tuple[Tensor, Tensor, Tensor]:
    """x [n, d] streams of one token -> pre [n], post [n], comb [n, n] (spec §3.2)."""
    n, eps = x.shape[0], cfg["hc_eps"]
    xf = x.reshape(-1)
    mix = (fn.to(F64) @ xf) / math.sqrt(float((xf * xf).mean()) + cfg["rms_norm_eps"])
    base, scale = base.to(F64), scale.to(F64)
    pre = torch.sigmoid(mix[:n] * scale[0] + base[:n]) + eps
    post = 2 * torch.sigmoid(mix[n : 2 * n] * scale[1] + base[n : 2 * n])
    c = torch.softmax((mix[2 * n :] * scale[2] + base[2 * n :]).view(n, n), dim=-1) + eps
    c = c / (c.sum(0, keepdim=True) + eps)
    for _ in range(cfg["hc_sinkhorn_iters"] - 1):
        c = c / (c.sum(1, keepdim=True) + eps)
        c = c / (c.sum(0, keepdim=True) + eps)
    return pre, post, c


def hc_post(y: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    n = x.shape[0]
    return torch.stack([post[k] * y + sum(comb[j, k] * x[j] for j in range(n)) for k in range(n)])


def swiglu(x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor, *, limit: float, scale: float = 1.0):
    g = (w1.to(F64) @ x).clamp(max=limit)
    u = (w3.to(F64) @ x).clamp(-limit, limit)
    return w2.to(F64) @ (g * torch.sigmoid(g) * u * scale)


def top_ids(scores: list[tuple[float, int]], k: int) -> list[int]:
    """Highest scores first, equal scores by lower id (the tie rule we pin)."""
    return [i for _, i in sorted(scores, key=lambda p: (-p[0], p[1]))[:k]]


# ---------------------------------------------------------------------------------------------
# Engram hashing (spec §5.7, the published NgramHashMapping recipe)


def is_prime_slow(n: int) -> bool:
    return n >= 2 and all(n % p for p in range(2, math.isqrt(n) + 1))


def engram_primes(layers: list[int], vocab: int, n_sizes: int, heads: int) -> dict[int, list[int]]:
    seen: set[int] = set()
    out: dict[int, list[int]] = {}
    for layer in layers:
        out[layer] = []
        for _ in range(n_sizes):
            c = vocab - 1
            for _ in range(heads):
                c += 1
                while c in seen or not is_prime_slow(c):
                    c += 1
                seen.add(c)
                out[layer].append(c)
    return out


def engram_multipliers(layer: int, max_ngram: int, compressed_vocab: int) -> list[int]:
    half = max(1, (np.iinfo(np.int64).max // compressed_vocab) // 2)
    r = np.random.default_rng(10007 * layer).integers(0, half, size=(max_ngram,), dtype=np.int64)
    return [int(v) * 2 + 1 for v in r]


def engram_rows(
    ids: list[int], t: int, *, pad: int, mult: list[int], primes: list[int], heads: int
):
    """Row ids of token t of a compressed id list (pad before the start)."""
    rows, offset, mix = [], 0, None
    n_sizes = len(primes) // heads
    for size in range(2, n_sizes + 2):
        tokens = [ids[t - k] if t - k >= 0 else pad for k in range(size)]
        mix = tokens[0] * mult[0]
        for k in range(1, size):
            mix ^= tokens[k] * mult[k]
        for j in range(heads):
            p = primes[(size - 2) * heads + j]
            rows.append(mix % p + offset)
            offset += p
    return rows


def engram_apply(
    sd: dict[str, Tensor], prefix: str, x: Tensor, rows: list[int], cfg: dict[str, Any]
) -> Tensor:
    """x [n, d] streams of one token -> x + gate * value (spec §5.7)."""
    n, d = x.shape
    e = torch.cat([sd[prefix + "embed.weight"][r].to(F64) for r in rows])
    kv = sd[prefix + "wkv.weight"].to(F64) @ e
    keys, value = kv[: n * d].view(n, d), kv[n * d :]
    out = x.clone()
    for i in range(n):
        h = rms(x[i], sd[prefix + "q_weight"][i], cfg["rms_norm_eps"])
        k = rms(keys[i], sd[prefix + "k_weight"][i], cfg["rms_norm_eps"])
        dot = float((h * k).sum()) / math.sqrt(d)
        gate = 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(dot), 1e-6)), dot)))
        out[i] = x[i] + gate * value
    return out


# ---------------------------------------------------------------------------------------------
# The whole model, one sequence


def _latest(ids: list[int], layer: int) -> int:
    return max(i for i in ids if i <= layer)


class Reference:
    def __init__(self, sd: dict[str, Tensor], cfg: dict[str, Any]) -> None:
        self.sd = {k: v.to(F64) for k, v in sd.items()}
        self.cfg = cfg
        r = cfg["qk_rope_head_dim"]
        self.freqs = {
            "main": inv_freq(r, cfg["rope_theta"], None),
            "compress": inv_freq(r, cfg["compress_rope_theta"], cfg.get("rope_scaling")),
        }

    def w(self, name: str) -> Tensor:
        return self.sd[name]

    def lin(self, name: str, x: Tensor) -> Tensor:
        return self.sd[name + ".weight"] @ x

    # -- attention ---------------------------------------------------------------------------

    def _sources(self, layer: int, xa: Tensor, shared: dict[str, dict]) -> None:
        """KV source: pooled, normed latents -> rotated entries and index keys (spec §5.1-2)."""
        cfg, p = self.cfg, f"layers.{layer}.attn."
        ratio, eps = cfg["compress_ratios"][layer], cfg["rms_norm_eps"]
        f = self.freqs["compress"]
        entries, keys = [], []
        for w in range(xa.shape[0] // ratio):
            toks = range(w * ratio, w * ratio + ratio)
            kvs = [self.lin(p + "compressor.wkv", xa[j]) for j in toks]
            if ratio == 1:
                pooled = kvs[0]
            else:
                scores = torch.stack([self.lin(p + "compressor.wgate", xa[j]) for j in toks])
                weights = torch.softmax(scores, dim=0)
                pooled = sum(weights[i] * kvs[i] for i in range(ratio))
            latent = rms(pooled, self.w(p + "compressor.norm.weight"), eps)
            entries.append(rope(latent, w * ratio, f))
            k = rms(self.lin(p + "indexer.wk", latent), self.w(p + "indexer.k_norm.weight"), eps)
            keys.append(rope(k, w * ratio, f))
        shared["entries"][layer] = entries
        shared["keys"][layer] = keys

    def index_scores(self, layer: int, xa_t: Tensor, qr_t: Tensor, t: int, keys: list[Tensor]):
        cfg, p = self.cfg, f"layers.{layer}.attn.indexer."
        h, c = cfg["index_n_heads"], cfg["index_head_dim"]
        q = self.lin(p + "wq_b", qr_t).view(h, c)
        q = torch.stack([rope(q[i], t, self.freqs["compress"]) for i in range(h)])
        wts = self.lin(p + "weights_proj", xa_t) * c**-0.5 * h**-0.5
        return [float(sum(wts[i] * torch.relu(q[i] @ k) for i in range(h))) for k in keys]

    def _picks(self, layer: int, xa: Tensor, qr: list[Tensor], shared: dict[str, dict]) -> None:
        cfg = self.cfg
        ratio = cfg["compress_ratios"][layer]
        keys = shared["keys"][_latest(cfg["kv_source_layer_ids"], layer)]
        cand = cfg.get("candidate_source_layer_id")
        picks = []
        for t in range(xa.shape[0]):
            vis = (t + 1) // ratio
            scores = self.index_scores(layer, xa[t], qr[t], t, keys[:vis])
            allowed = set(range(vis))
            if layer == cand:
                bs = cfg["candidate_block_size"]
                blocks = [
                    (max(scores[w] for w in range(b * bs, min(vis, b * bs + bs))), b)
                    for b in range(-(-vis // bs))
                ]
                chosen = top_ids(blocks, cfg["candidate_topk_blocks"])
                shared["cands"][t] = {w for b in chosen for w in range(b * bs, b * bs + bs)}
            if cand is not None and layer > cand:
                allowed &= shared["cands"][t]
            picks.append(top_ids([(scores[w], w) for w in allowed], cfg["index_topk"]))
        shared["picks"][layer] = picks

    def attention(self, layer: int, xa: Tensor, shared: dict[str, dict]) -> Tensor:
        cfg, p = self.cfg, f"layers.{layer}.attn."
        eps, ratio = cfg["rms_norm_eps"], cfg["compress_ratios"][layer]
        h_n, dim, window = cfg["num_attention_heads"], cfg["head_dim"], cfg["sliding_window"]
        f = self.freqs["main" if ratio == 0 else "compress"]
        s = xa.shape[0]
        qr = [rms(self.lin(p + "wq_a", xa[t]), self.w(p + "q_norm.weight"), eps) for t in range(s)]
        q = [self.lin(p + "wq_b", qr[t]).view(h_n, dim) for t in range(s)]
        q = [torch.stack([rope(q[t][h], t, f) for h in range(h_n)]) for t in range(s)]
        kv = [rope(rms(self.lin(p + "wkv", xa[t]), self.w(p + "kv_norm.weight"), eps), t, f)
              for t in range(s)]  # fmt: skip
        if ratio:
            if layer in cfg["kv_source_layer_ids"]:
                self._sources(layer, xa, shared)
            if layer in cfg["index_source_layer_ids"]:
                self._picks(layer, xa, qr, shared)
            entries = shared["entries"][_latest(cfg["kv_source_layer_ids"], layer)]
            picks = shared["picks"][_latest(cfg["index_source_layer_ids"], layer)]
        g = cfg["o_groups"]
        wo_a = self.w(p + "wo_a.weight").view(g, cfg["o_lora_rank"], -1)
        out = []
        for t in range(s):
            keys = [kv[j] for j in range(max(0, t - window + 1), t + 1)]
            if ratio:
                keys += [entries[w] for w in picks[t]]
            k = torch.stack(keys)
            heads = []
            for h in range(h_n):
                logits = torch.cat(
                    (k @ q[t][h] / math.sqrt(dim), self.w(p + "attn_sink")[h : h + 1])
                )
                probs = torch.softmax(logits, dim=0)[:-1]
                heads.append(rope(probs @ k, t, f, inverse=True))
            o = torch.stack(heads).view(g, -1)
            z = torch.cat([wo_a[j] @ o[j] for j in range(g)])
            out.append(self.lin(p + "wo_b", z))
        return torch.stack(out)

    # -- MoE -----------------------------------------------------------------------------------

    def moe(self, layer: int, x: Tensor, image: bool) -> Tensor:
        cfg, p = self.cfg, f"layers.{layer}.ffn."
        s = torch.nn.functional.softplus(self.lin(p + "gate", x)).sqrt()
        bias = self.w(p + ("gate.bias_vl" if image else "gate.bias"))
        idx = top_ids([(float(s[e] + bias[e]), e) for e in range(s.shape[0])],
                      cfg["num_experts_per_tok"])  # fmt: skip
        weights = s[idx] / s[idx].sum() * cfg["routed_scaling_factor"]
        lim = cfg["swiglu_limit"]
        out = swiglu(x, *(self.w(f"{p}shared_experts.w{i}.weight") for i in (1, 2, 3)), limit=lim)
        for e, wt in zip(idx, weights, strict=True):
            ws = (self.w(f"{p}experts.{e}.w{i}.weight") for i in (1, 2, 3))
            out = out + swiglu(x, *ws, limit=lim, scale=float(wt))
        return out

    # -- model ---------------------------------------------------------------------------------

    def logits(
        self, ids: list[int], token_map: list[int], image_rows: dict[int, Tensor] | None = None
    ) -> Tensor:
        cfg = self.cfg
        n, eps = cfg["hc_mult"], cfg["rms_norm_eps"]
        image_rows = image_rows or {}
        image = [t in image_rows for t in range(len(ids))]
        emb = [image_rows[t].to(F64) if image[t] else self.w("embed.weight")[tok]
               for t, tok in enumerate(ids)]  # fmt: skip
        x = torch.stack([e.expand(n, -1).clone() for e in emb])  # [S, n, d]
        comp = [token_map[i] for i in ids]
        pad = token_map[cfg["engram_pad_token_id"]]
        heads = cfg["engram_n_heads"]
        n_sizes = cfg["engram_max_ngram_size"] - 1
        primes = engram_primes(cfg["engram_layer_ids"], cfg["engram_vocab_size"], n_sizes, heads)
        pre: list[Tensor | None] = [None] * len(ids)
        shared: dict[str, dict] = {"entries": {}, "keys": {}, "picks": {}, "cands": {}}
        for layer in range(cfg["num_hidden_layers"]):
            p = f"layers.{layer}."
            if layer in cfg["engram_layer_ids"]:
                mult = engram_multipliers(
                    layer, cfg["engram_max_ngram_size"], cfg["engram_compressed_vocab_size"]
                )
                for t in range(len(ids)):
                    if not image[t]:
                        rows = engram_rows(
                            comp, t, pad=pad, mult=mult, primes=primes[layer], heads=heads
                        )
                        x[t] = engram_apply(self.sd, p + "engram.", x[t], rows, cfg)
            for kind in ("attn", "ffn"):
                params = [self.w(f"{p}hc_{kind}_{k}") for k in ("fn", "base", "scale")]
                ws = [mhc_weights(x[t], *params, cfg) for t in range(len(ids))]
                u = torch.stack(
                    [
                        x[t][0] if pre[t] is None else sum(pre[t][i] * x[t][i] for i in range(n))
                        for t in range(len(ids))
                    ]
                )
                un = rms(u, self.w(f"{p}{kind}_norm.weight"), eps)
                if kind == "attn":
                    y = self.attention(layer, un, shared)
                else:
                    y = torch.stack([self.moe(layer, un[t], image[t]) for t in range(len(ids))])
                for t in range(len(ids)):
                    x[t] = hc_post(y[t], x[t], ws[t][1], ws[t][2])
                    pre[t] = ws[t][0]
        h = torch.stack([sum(pre[t][i] * x[t][i] for i in range(n)) for t in range(len(ids))])
        return rms(h, self.w("norm.weight"), eps) @ self.w("head.weight").T
