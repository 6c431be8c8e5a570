"""Run by test_moe_triton.py in a child process: TRITON_INTERPRET must be set before triton loads."""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from b70bench import device  # noqa: E402
from b70bench.moe import shapes, suite, variants  # noqa: E402
from b70bench.moe.configs import Config as C  # noqa: E402

shape = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2)
dev = device.Device("cpu")
# (dtype, tokens, tiling): the elementwise (decode) kernel with 1 and 2 pairs per block, K-blocks
# within and across scale groups, tl.dot per nibble plane (16) and over the K-block (32+), split-K,
# both reductions. tl.dot cases use fp16:
# Triton 3.9's interpreter mis-evaluates bf16 dots (the GPU path is checked on the device).
cases = [
    ("bf16", 1, C(block_m=1, block_n=64, block_k=128)),
    ("bf16", 3, C(block_m=2, block_n=32, block_k=64, split_k=2, fused_reduce=True)),
    ("bf16", 3, C(block_m=2, block_n=32, block_k=256, num_warps=8)),
    ("fp16", 9, C(block_m=16, block_n=32, block_k=128, split_k=2)),
    ("fp16", 9, C(block_m=32, block_n=64, block_k=128, fused_reduce=True)),  # 32+: one interleaved dot
    ("fp16", 160, C(block_m=32, block_n=32, block_k=128, split_k=2)),  # several blocks per expert, split K
    ("fp16", 2, None),  # the triton variant's own choice
    ("bf16", 2, "htile"),
    # packed 16x2 dequant (_word_dot; the interpreter runs its fp32 twin, which pins the nibble/x pairing),
    # with the K loop pipelined
    ("bf16", 1, C(block_m=1, block_n=64, block_k=128, num_stages=3, packed=True)),
    ("fp16", 3, C(block_m=2, block_n=32, block_k=64, split_k=2, num_stages=2, fused_reduce=True, packed=True)),
    # a K-block deeper than the split: one masked iteration issues all of the split's loads at once
    ("bf16", 1, C(block_m=1, block_n=32, block_k=512, split_k=2, fused_reduce=True, packed=True)),
    # weights and scales repacked N-tile-major
    ("bf16", 3, C(block_m=2, block_n=32, block_k=64, split_k=2, packed=True, tiled=True)),
    ("fp16", 1, C(block_m=1, block_n=16, block_k=512, fused_reduce=True, tiled=True)),
    # nibbles reordered so each x pair is one 32-bit load
    ("bf16", 3, C(block_m=2, block_n=32, block_k=512, packed=True, paired=True, tiled=True)),
    ("fp16", 1, C(block_m=1, block_n=32, block_k=64, split_k=2, packed=True, paired=True)),
    # the next K-block's words held in registers (four K-blocks per split); pdl and early are launch
    # options the interpreter skips, here only to show the rest of the path is unchanged
    ("bf16", 3, C(block_m=2, block_n=32, block_k=64, packed=True, paired=True, prefetch=True, pdl=True, early=True)),
    ("fp16", 1, C(block_m=1, block_n=64, block_k=64, prefetch=True)),
    # the in-kernel sum with pdl (the main kernel lets the next kernel launch under it)
    (
        "bf16",
        3,
        C(
            block_m=1,
            block_n=32,
            block_k=64,
            fused_reduce=True,
            packed=True,
            paired=True,
            prefetch=True,
            pdl=True,
            early=True,
        ),
    ),
    # mixed: 2-pair blocks of one expert's pairs of pairs, then the single pairs in a second launch
    (
        "bf16",
        9,
        C(
            block_m=2,
            block_n=32,
            block_k=512,
            packed=True,
            paired=True,
            pdl=True,
            early=True,
            odd_pairs=C(
                block_m=1, block_n=64, block_k=128, packed=True, paired=True, prefetch=True, pdl=True, early=True
            ),
        ),
    ),
    # -dq: the first K-block dequantized before the wait, later ones as usual (with and without prefetch)
    (
        "bf16",
        3,
        C(
            block_m=2,
            block_n=32,
            block_k=64,
            packed=True,
            paired=True,
            prefetch=True,
            pdl=True,
            early=True,
            dequant_early=True,
        ),
    ),
    ("fp16", 1, C(block_m=1, block_n=32, block_k=512, packed=True, paired=True, early=True, dequant_early=True)),
    (
        "fp16",
        3,
        C(block_m=1, block_n=16, block_k=64, split_k=2, packed=True, paired=True, early=True, dequant_early=True),
    ),
    # -2r: two word rows of one scale group per 16-bit sum; a block deeper than K, 2-pair blocks with prefetch,
    # and a split (64) shorter than the group, whose partner rows past the split must add nothing
    ("bf16", 1, C(block_m=1, block_n=16, block_k=512, packed=True, paired=True, pdl=True, early=True, two_rows=True)),
    (
        "fp16",
        3,
        C(block_m=2, block_n=32, block_k=128, split_k=2, packed=True, paired=True, prefetch=True, two_rows=True),
    ),
    ("bf16", 3, C(block_m=1, block_n=32, block_k=128, split_k=4, packed=True, paired=True, two_rows=True)),
    # scale groups of 64 (GROUP64 below): -2r partners 4 word rows apart; htile with 16+ pairs per expert, which
    # cannot take dot blocks there, on 2-pair blocks
    ("fp16", 1, C(block_m=1, block_n=32, block_k=128, packed=True, paired=True, prefetch=True, two_rows=True)),
    ("bf16", 40, "htile"),
    # -2r on N-tile-major weights (the one-token policy's layout), group 128
    ("bf16", 1, C(block_m=1, block_n=32, block_k=512, packed=True, paired=True, tiled=True, two_rows=True)),
]
GROUP64 = {len(cases) - 3, len(cases) - 2}
shape64 = shapes.MoeShape(hidden=64, intermediate=256, experts=8, topk=2, group=64)
out = []
for i, (dt, tokens, cfg) in enumerate(cases):
    dtype = shapes.DTYPES[dt]
    sh = shape64 if i in GROUP64 else shape
    w = shapes.random_weights(sh, 256, dtype, torch.device("cpu"), i)
    if cfg == "htile":
        v = variants.TritonVariant("triton-htile", htile=True)
    else:
        v = variants.TritonVariant("t", config=cfg)
    out.append(dict(case=i, **suite.check(v, variants.Reference(), sh, w, 256, tokens, dtype, dev, 100 + i)))
json.dump(out, sys.stdout)
