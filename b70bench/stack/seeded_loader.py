"""vLLM load format `b70bench_seeded`: vLLM's dummy load, then every parameter drawn again by seeded_fill.

Why a load format: vLLM calls a loader's load_weights after it has built the model and before
process_weights_after_loading, where gptq_marlin repacks the GPTQ tensors into its own layout. Filling there means
the seeded values go in GPTQ's checkpoint layout and vLLM's own repacking turns them into whatever its kernel
needs, as for a real checkpoint (vLLM 0.32.0's base_loader.load_model reads so; 0.20.1's is the same order).

The dummy load runs first so that whatever this loader has no rule for (a buffer, a tensor a newer vLLM adds) is
still initialised as vLLM's own dummy load would; the loader logs the names it left so.

The seed: `model_loader_extra_config = {seed = N}` in the stack's engine_args, else the one the stand-in's directory
was written with (standin.SEED_FILE), else standin.SEED.

vLLM must know the format in every process it starts (the engine core, each worker): `register` is a vLLM general
plugin, and plugin_directory() (a throwaway distribution naming it, as decode's hooks are) goes first on the
PYTHONPATH of every start whose stack names the format (launch.run_env).
"""

from __future__ import annotations

import time
from pathlib import Path

from b70bench.stack import seeded_fill, standin

_registered = False
_DIST = "b70bench_seeded_loader-0.0.0.dist-info"
ENTRY_POINT = "b70bench.stack.seeded_loader:register"


def wanted(engine_args: dict | None) -> bool:
    return (engine_args or {}).get("load_format") == standin.LOAD_FORMAT


def plugin_directory(root: Path | None = None) -> Path:
    """A directory that, on PYTHONPATH, makes every vLLM process call register() (a general plugin). Written on
    first use under b70bench's cache; the files never change, so concurrent writers write the same bytes."""
    from b70bench.stack import model as modelmod

    base = (root or modelmod.cache_root()) / "vllm-plugins" / "seeded-loader"
    dist = base / _DIST
    files = {
        "METADATA": "Metadata-Version: 2.1\nName: b70bench-seeded-loader\nVersion: 0.0.0\n",
        "entry_points.txt": f"[vllm.general_plugins]\nb70bench_seeded = {ENTRY_POINT}\n",
    }
    dist.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = dist / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    return base


def register() -> None:
    """Register the load format with vLLM (a general plugin: vLLM may call it more than once a process)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader(standin.LOAD_FORMAT)
    class SeededModelLoader(DummyModelLoader):
        def __init__(self, load_config):
            # The dummy loader refuses any extra config; this one reads its seed there.
            BaseModelLoader.__init__(self, load_config)

        def load_weights(self, model, model_config) -> None:
            import torch

            super().load_weights(model, model_config)
            extra = self.load_config.model_loader_extra_config or {}
            seed = extra.get("seed")
            if seed is None:
                seed = standin.read_seed(model_config.model)
            seed = standin.SEED if seed is None else int(seed)
            quant = getattr(model_config.hf_config, "quantization_config", None) or {}
            if not isinstance(quant, dict):
                quant = quant.to_dict() if hasattr(quant, "to_dict") else vars(quant)
            group = int(quant.get("group_size") or 128)
            t0 = time.perf_counter()
            counts = seeded_fill.fill(model.named_parameters(), seed, group)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            kept = counts.pop("kept")
            nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
            print(
                f"b70bench_seeded: seed {seed}, {nbytes / 2**30:.2f} GiB of parameters drawn in "
                f"{time.perf_counter() - t0:.1f} s ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}); "
                f"left as the dummy load drew them: {', '.join(kept) or 'none'}",
                flush=True,
            )

    _registered = True
