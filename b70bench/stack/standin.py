"""A device-bound stand-in of the lab's model: MiniMax M2.7 INT4's layer shapes in a config-only directory.

Why: with the tiny model a decode step on an NVIDIA GPU is the host's work (vLLM's asynchronous scheduling hides
GPU work behind it), so a slower kernel does not show. M2.7's shapes at 30 layers (an H100 80GB) or all 62 (an
H200) make the step the device's. Its weights are never written: a config.json names the GPTQ int4 layout
AutoRound exports (group 128, symmetric), and vLLM builds the model from it with b70bench's own load format
(seeded_loader: seeded weights of a trained model's scale, drawn on the device), not vLLM's dummy one, whose
+-1e-3 weights make greedy output two alternating tokens that no change can move.

Field names are the ones vLLM's `minimax_m2.py` reads (as the embedded tiny model's config): `num_local_experts`,
`num_experts_per_tok`, `intermediate_size` (one expert's), `scoring_func`, `use_routing_bias`, `rotary_dim`,
`head_dim`, `qk_norm_type`.
"""

from __future__ import annotations

import json
from pathlib import Path

from b70bench.errors import UsageError

# The load format the stand-in's stack names; seeded_loader registers it in every vLLM process (vllm_plugin).
LOAD_FORMAT = "b70bench_seeded"
# Where the writer leaves the seed; the loader reads it from the model directory vLLM was given.
SEED_FILE = "b70bench-standin.json"
SEED = 20261207
# Bump when what the loader draws changes: it is in the seed file, so a directory says which draw it was made for.
GENERATOR_VERSION = 1
# Layers that fit one card with room for a 2048-token KV cache (FIELD-NOTES: 30 layers held 57.3 GiB of weights on
# an H100 80GB; all 62, ~120 GB, need an H200).
DEFAULT_LAYERS = 30
MAX_LAYERS = 62
# AutoRound's INT4 export as vLLM reads a GPTQ checkpoint; on CUDA vLLM 0.20.1 picks gptq_marlin for it.
QUANTIZATION = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}

# MiniMax M2.7's shapes (its public config.json): hidden 3072, 48 query / 8 KV heads of 128 with rotary on 64,
# 256 experts of intermediate 1536, top 8 by sigmoid scores with a routing bias, vocabulary 200064.
M27 = {
    "architectures": ["MiniMaxM2ForCausalLM"],
    "model_type": "minimax_m2",
    "vocab_size": 200064,
    "hidden_size": 3072,
    "intermediate_size": 1536,
    "num_hidden_layers": MAX_LAYERS,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rotary_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 196608,
    "rms_norm_eps": 1e-06,
    "rope_theta": 5000000,
    "num_local_experts": 256,
    "num_experts_per_tok": 8,
    "scoring_func": "sigmoid",
    "use_routing_bias": True,
    "qk_norm_type": "per_layer",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 200034,
    "eos_token_id": 200020,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}


def config(layers: int = DEFAULT_LAYERS, quantized: bool = True, **sizes) -> dict:
    """M2.7's config at `layers` layers; `sizes` override other fields (the CPU tests' small stand-in)."""
    if not 1 <= layers <= MAX_LAYERS:
        raise UsageError(f"--layers {layers}: M2.7 has 1 to {MAX_LAYERS} layers; e.g. --layers 30 for an H100 80GB")
    unknown = sorted(set(sizes) - set(M27))
    if unknown:
        raise ValueError(f"not a field of the stand-in's config: {unknown[0]}")
    cfg = {**M27, "num_hidden_layers": layers, **sizes}
    if quantized:
        cfg["quantization_config"] = dict(QUANTIZATION)
    return cfg


def write(directory: str | Path, cfg: dict, seed: int = SEED) -> Path:
    """A model directory holding only config.json and the seed file; refuses a directory with anything in it."""
    dest = Path(directory).expanduser()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not an empty directory: name a new directory")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (dest / SEED_FILE).write_text(json.dumps({"seed": seed, "generator": GENERATOR_VERSION}) + "\n")
    return dest


def read_seed(model_dir: str | Path) -> int | None:
    """The seed a stand-in directory was written with, or None where it holds no seed file (a hub id, a path
    elsewhere): the loader then uses SEED."""
    path = Path(model_dir) / SEED_FILE
    if not path.is_file():
        return None
    return int(json.loads(path.read_text())["seed"])


def approx_weight_gib(cfg: dict) -> float:
    """Weights at 4 bits with a 16-bit scale per group, attention, router, embeddings and head at 16 bits: what
    the writer prints so a layer count that cannot fit the card is seen before a start."""
    h, inter, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    layers, vocab = cfg["num_hidden_layers"], cfg["vocab_size"]
    bits = 4 + 16 / QUANTIZATION["group_size"] if "quantization_config" in cfg else 16
    experts = layers * e * 3 * h * inter * bits / 8
    attention = layers * (h * (q + 2 * kv) + q * h) * bits / 8
    rest = layers * e * h * 4 + 2 * vocab * h * 2  # the router in float32; embeddings and head in bf16
    return (experts + attention + rest) / 2**30


def stack_text(model: str, name: str, shape: str = "p512n256", memory_fraction: float = 0.92) -> str:
    """The stand-in's stack file (docs/standin.md): one card, the load format that seeds the weights."""
    return f"""# The MiniMax M2.7 INT4 stand-in (b70bench stack write-standin): config only, weights seeded at load.
name = "{name}"
backend = "cuda"
devices = [0]
model = "{model}"
max_model_len = 2048
memory_fraction = {memory_fraction:g}
shapes = ["{shape}"]
# A cold start with torch.compile and CUDA-graph capture took 201 s at 30 layers on an H100 (FIELD-NOTES).
start_timeout_s = 900

[engine_args]
attention_backend = "TRITON_ATTN"
load_format = "{LOAD_FORMAT}"
"""
