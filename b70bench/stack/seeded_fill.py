"""Seeded weights of a trained model's scale, drawn in place into a model vLLM has built (torch only, no vLLM).

Why not vLLM's dummy fill: every weight in about +-1e-3 and norms included, so the residual stream carries next to
nothing, greedy decoding emits two alternating ids whatever the context, and a token gate on it cannot fail. Here a
projection's output has the scale of its input, as in a trained model, so greedy output depends on the context and
a small numeric change flips tokens:
- float projections (attention, router, unquantised experts, head): normal, std 1/sqrt(fan_in) (vLLM keeps the
  input dimension last);
- embeddings: std 1; norm weights: 1; biases 0; MiniMax's routing bias: normal, std ROUTING_BIAS_STD;
- GPTQ int4 (qweight): nibbles round(N(0, NIBBLE_SIGMA)) clipped to the symmetric range, stored +8 and packed eight
  to an int32 along the input (K) dimension, nibble j of a word at bits 4j..4j+3 of row 8*w + j (GPTQ's layout, as
  vLLM's gptq and gptq_marlin methods take it before they repack); a normal draw rather than uniform nibbles, as a
  trained layer's quantised values centre on zero; scales: one value a layer, 1/(nibble_std() * sqrt(K)), so the
  dequantised weight has std 1/sqrt(K); qzeros: 7 in every nibble (GPTQ's stored zero minus one, ignored by the
  symmetric kernels); g_idx: row k in group k // group_size (no act-order).

Each tensor is drawn by a generator on its own device, seeded from (seed, the parameter's name): the draw is fast on
a GPU (no host copy of tens of GB) and depends on neither the order nor which other parameters exist. The same seed
gives the same bytes on the same kind of device; a CPU and a GPU draw differ (their generators do), and the gate is
pinned per card anyway.
"""

from __future__ import annotations

import hashlib
import math

# Nibbles as a trained layer's quantised values: a quantiser maps a group's largest magnitude (~2.6 sigma over 128
# normal values) near the end of the range, so sigma ~3 nibbles; 2.5 clips only beyond 3 sigma.
NIBBLE_SIGMA = 2.5
NIBBLE_OFFSET = 8  # symmetric GPTQ stores value + 8 (vLLM's uint4b8)
PACK = 8  # nibbles a 32-bit word
QZEROS_WORD = 0x77777777  # below 2**31: the same value as a signed int32
ROUTING_BIAS_STD = 0.01  # small beside the spread of sigmoid scores (logits ~N(0, 1)): it nudges, not decides
EMBED_STD = 1.0
# Elements drawn at once: the draw is split along the first dimension into pieces of at most this many, so the
# transient float and integer copies stay a few hundred MB whatever the tensor. Part of what is drawn (the stream
# restarts at each piece's own seed), so it is fixed.
CHUNK = 1 << 24


def param_seed(seed: int, name: str) -> int:
    """A 63-bit seed for one tensor (or one piece of it): depends on the run's seed and the name alone."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") >> 1


def nibble_std(sigma: float = NIBBLE_SIGMA) -> float:
    """The exact std of clamp(round(N(0, sigma)), -8, 7), from the normal's CDF (float64)."""

    def cdf(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / (sigma * math.sqrt(2.0))))

    probs = {}
    for v in range(-NIBBLE_OFFSET, NIBBLE_OFFSET):
        lo = -math.inf if v == -NIBBLE_OFFSET else v - 0.5
        hi = math.inf if v == NIBBLE_OFFSET - 1 else v + 0.5
        probs[v] = (1.0 if hi == math.inf else cdf(hi)) - (0.0 if lo == -math.inf else cdf(lo))
    mean = sum(v * p for v, p in probs.items())
    return math.sqrt(sum((v - mean) ** 2 * p for v, p in probs.items()))


def int4_scale(k: int) -> float:
    """The scale that gives dequantised weights std 1/sqrt(K)."""
    return 1.0 / (nibble_std() * math.sqrt(k))


def _generator(device, seed: int, name: str):
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(param_seed(seed, name))
    return g


def _pieces(rows: int, per_row: int):
    """(start, stop) along the first dimension, each piece at most CHUNK elements (one row at the least)."""
    step = max(1, CHUNK // max(1, per_row))
    return [(i, min(rows, i + step)) for i in range(0, rows, step)]


def draw_normal(t, std: float, seed: int, name: str) -> None:
    """t (any float dtype) := N(0, std), drawn in float32 on t's device, piece by piece."""
    import torch

    if t.dim() == 0:
        t.fill_(0.0)
        return
    per_row = t[0].numel() if t.dim() > 1 else 1
    flat = t if t.dim() > 1 else t.view(-1, 1)
    for i, (a, b) in enumerate(_pieces(flat.shape[0], per_row)):
        g = _generator(t.device, seed, f"{name}#{i}")
        piece = torch.randn(flat[a:b].shape, generator=g, device=t.device, dtype=torch.float32)
        flat[a:b].copy_(piece.mul_(std))


def draw_nibbles(shape, seed: int, name: str, device="cpu"):
    """Values in [0, 15] (int64), shape [..., K, N]: round(N(0, NIBBLE_SIGMA)) clipped, plus the offset."""
    import torch

    g = _generator(device, seed, name)
    z = torch.randn(tuple(shape), generator=g, device=device, dtype=torch.float32)
    return z.mul_(NIBBLE_SIGMA).round_().clamp_(-NIBBLE_OFFSET, NIBBLE_OFFSET - 1).to(torch.int64) + NIBBLE_OFFSET


def pack_nibbles(nib):
    """[..., K, N] values 0..15 -> [..., K/8, N] int32, eight along K a word (row 8w + j at bits 4j)."""
    import torch

    *lead, k, n = nib.shape
    if k % PACK:
        raise ValueError(f"K = {k} is not a multiple of {PACK}")
    shifts = torch.arange(0, 4 * PACK, 4, device=nib.device, dtype=torch.int64).view(PACK, 1)
    words = (nib.view(*lead, k // PACK, PACK, n) << shifts).sum(dim=-2)  # disjoint bits: the sum is the OR
    words = torch.where(words >= 2**31, words - 2**32, words)  # as a signed 32-bit word, exactly
    return words.to(torch.int32)


def unpack_nibbles(words):
    """The inverse of pack_nibbles: [..., K/8, N] int32 -> [..., K, N] values 0..15 (int64)."""
    import torch

    *lead, kw, n = words.shape
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 4 * PACK, 4, device=words.device, dtype=torch.int64).view(PACK, 1)
    return ((w.unsqueeze(-2) >> shifts) & 0xF).reshape(*lead, kw * PACK, n)


def draw_qweight(t, seed: int, name: str) -> None:
    """t: int32 [..., K/8, N] := packed seeded nibbles, piece by piece along the first dimension."""
    flat = t if t.dim() > 2 else t.unsqueeze(0)
    if flat.dim() == 3 and flat.shape[0] == 1:
        # One 2-D matrix: its pieces are whole words of rows along K.
        mat = flat[0]
        per_row = PACK * mat.shape[1]
        for i, (a, b) in enumerate(_pieces(mat.shape[0], per_row)):
            nib = draw_nibbles(((b - a) * PACK, mat.shape[1]), seed, f"{name}#{i}", t.device)
            mat[a:b].copy_(pack_nibbles(nib))
        return
    per_row = flat[0].numel() * PACK
    for i, (a, b) in enumerate(_pieces(flat.shape[0], per_row)):
        shape = (b - a, *flat.shape[1:-2], flat.shape[-2] * PACK, flat.shape[-1])
        flat[a:b].copy_(pack_nibbles(draw_nibbles(shape, seed, f"{name}#{i}", t.device)))


def rule(name: str, t) -> str:
    """What a parameter gets, by its name and type (vLLM's names: `...qkv_proj.qweight`, `...experts.w13_scales`,
    `...q_norm.weight`, `model.embed_tokens.weight`); "keep" where none applies (left as loaded)."""
    leaf = name.rsplit(".", 1)[-1]
    floating = t.is_floating_point()
    if leaf == "e_score_correction_bias":
        return "routing-bias"
    if leaf.endswith("qweight") and not floating:
        return "int4"
    if leaf.endswith("qzeros") and not floating:
        return "qzeros"
    if leaf.endswith("g_idx") and not floating:
        return "g_idx"
    if leaf.endswith("sort_indices") and not floating:
        return "arange"
    if not floating:
        return "keep"
    if leaf.endswith("scales"):
        return "int4-scale"
    if leaf.endswith("bias"):
        return "zero"
    if "norm" in name and t.dim() == 1:
        return "one"
    if "embed_tokens" in name:
        return "embedding"
    if t.dim() >= 2:
        return "projection"
    return "keep"


def fill(named, seed: int, group_size: int) -> dict:
    """Fill every (name, tensor) in place by rule(); returns {rule: count} and the names kept (`kept`)."""
    import torch

    counts: dict = {}
    kept = []
    with torch.no_grad():
        for name, t in named:
            r = rule(name, t)
            counts[r] = counts.get(r, 0) + 1
            if r == "routing-bias":
                draw_normal(t, ROUTING_BIAS_STD, seed, name)
            elif r == "int4":
                draw_qweight(t, seed, name)
            elif r == "qzeros":
                t.fill_(QZEROS_WORD)
            elif r == "g_idx":
                k = t.shape[-1]
                t.copy_((torch.arange(k, device=t.device) // group_size).to(t.dtype).expand_as(t))
            elif r == "arange":
                t.copy_(torch.arange(t.shape[-1], device=t.device).to(t.dtype).expand_as(t))
            elif r == "int4-scale":
                # [..., K / group, N]: one group a row along K.
                t.fill_(int4_scale(t.shape[-2] * group_size))
            elif r == "zero":
                t.zero_()
            elif r == "one":
                t.fill_(1.0)
            elif r == "embedding":
                draw_normal(t, EMBED_STD, seed, name)
            elif r == "projection":
                draw_normal(t, t.shape[-1] ** -0.5, seed, name)
            else:
                kept.append(name)
    counts["kept"] = kept
    return counts
