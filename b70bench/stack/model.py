"""The embedded default model: a tiny MiniMax-M2-shaped checkpoint with seeded weights of realistic scale.

Why not vLLM's dummy loader: it draws every weight in about +-1e-3 (norms included), the model
then emits two alternating tokens and a 2% change to every attention output leaves greedy
output unchanged, so a token-hash gate could never fail. Here every projection is drawn with
std 1/sqrt(fan_in), embeddings with std 1 and norms are 1, as a trained model's activations
are O(1); greedy output then depends on the context and small numeric changes flip tokens.

The checkpoint (config.json + model.safetensors, HF MiniMax-M2 tensor names) is written once
per (config, seed, generator) into a cache directory and loaded with vLLM's real safetensors
loader, so `minimax_m2.py` and its weight mapping are exercised as for the real model.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import resources
from pathlib import Path

import numpy as np

from b70bench import records

CONFIG_NAME = "tiny_minimax_m2.json"
SEED = 20260510
# Bump when the way weights are drawn changes: it is part of the cache key and of the
# model id that gate hashes are pinned to.
GENERATOR_VERSION = 1
ENV_CACHE = "B70BENCH_CACHE"


def embedded_config() -> dict:
    return json.loads(resources.files("b70bench.stack").joinpath(CONFIG_NAME).read_text())


def cache_root() -> Path:
    root = os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "b70bench")
    return Path(root)


def model_id(config: dict | None = None, seed: int = SEED) -> str:
    """Content identity of the embedded model: the config, the seed and the generator version."""
    config = embedded_config() if config is None else config
    blob = json.dumps({"config": config, "seed": seed, "generator": GENERATOR_VERSION}, sort_keys=True)
    return "tiny-minimax-m2-" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def tensor_specs(cfg: dict) -> dict[str, tuple[tuple[int, ...], float | None]]:
    """Checkpoint name -> (shape, std); std None means a norm weight of ones."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    vocab, experts = cfg["vocab_size"], cfg["num_local_experts"]
    specs: dict[str, tuple[tuple[int, ...], float | None]] = {
        "model.embed_tokens.weight": ((vocab, h), 1.0),
        "model.norm.weight": ((h,), None),
        "lm_head.weight": ((vocab, h), h**-0.5),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        specs[f"{p}.input_layernorm.weight"] = ((h,), None)
        specs[f"{p}.post_attention_layernorm.weight"] = ((h,), None)
        specs[f"{p}.self_attn.q_proj.weight"] = ((q, h), h**-0.5)
        specs[f"{p}.self_attn.k_proj.weight"] = ((kv, h), h**-0.5)
        specs[f"{p}.self_attn.v_proj.weight"] = ((kv, h), h**-0.5)
        specs[f"{p}.self_attn.o_proj.weight"] = ((h, q), q**-0.5)
        specs[f"{p}.self_attn.q_norm.weight"] = ((q,), None)
        specs[f"{p}.self_attn.k_norm.weight"] = ((kv,), None)
        specs[f"{p}.block_sparse_moe.gate.weight"] = ((experts, h), h**-0.5)
        if cfg.get("use_routing_bias"):
            specs[f"{p}.block_sparse_moe.e_score_correction_bias"] = ((experts,), 0.0)
        for e in range(experts):
            specs[f"{p}.block_sparse_moe.experts.{e}.w1.weight"] = ((inter, h), h**-0.5)
            specs[f"{p}.block_sparse_moe.experts.{e}.w3.weight"] = ((inter, h), h**-0.5)
            specs[f"{p}.block_sparse_moe.experts.{e}.w2.weight"] = ((h, inter), inter**-0.5)
    return specs


def make_weights(cfg: dict, seed: int = SEED) -> dict:
    """Seeded tensors in bf16. numpy's PCG64 stream is stable across releases; torch.randn's is not promised."""
    import torch

    rng = np.random.Generator(np.random.PCG64(seed))
    out = {}
    for name, (shape, std) in tensor_specs(cfg).items():  # dict order is fixed, so the stream is too
        if std is None:
            arr = np.ones(shape, dtype=np.float32)
        else:
            arr = (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)
        out[name] = torch.from_numpy(arr).to(torch.bfloat16)
    return out


def write_checkpoint(path: Path, cfg: dict, seed: int = SEED) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(make_weights(cfg, seed), str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "b70bench-model.json").write_text(json.dumps({"model_id": model_id(cfg, seed), "seed": seed}) + "\n")


def ensure_embedded(root: Path | None = None, config: dict | None = None, seed: int = SEED) -> Path:
    """Directory of the embedded checkpoint, written on first use.

    Written into a temporary sibling and renamed into place, so a crash or a concurrent writer
    never leaves a half-written checkpoint where vLLM would load it.
    """
    cfg = embedded_config() if config is None else config
    final = (root or cache_root()) / "models" / model_id(cfg, seed)
    return records.atomic_directory(final, "b70bench-model.json", lambda tmp: write_checkpoint(tmp, cfg, seed))
