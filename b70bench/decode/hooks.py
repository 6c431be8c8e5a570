"""Patches applied inside the vLLM processes of one run, never to installed files.

They prove the quality gate can fail: `scale_attention_output` changes numerics the way a
subtly wrong kernel would (every MiniMax-M2 attention output times B70BENCH_HOOK_ATTN_SCALE,
default 1.02), `default_off_branch` adds a branch that is off unless B70BENCH_HOOK_BRANCH=1,
like the seeds' Q/K apply+RoPE helper. A run asks for them with `hooks=[...]` (CLI: --hook);
they are registered as vLLM general plugins through a throwaway distribution on the child's
PYTHONPATH, which vLLM loads in every process it starts (engine core and workers too).
"""

from __future__ import annotations

import os
from pathlib import Path

ATTN_SCALE_ENV = "B70BENCH_HOOK_ATTN_SCALE"
BRANCH_ENV = "B70BENCH_HOOK_BRANCH"
KNOWN = {
    "scale-attention": "b70bench.decode.hooks:scale_attention_output",
    "default-off-branch": "b70bench.decode.hooks:default_off_branch",
}
_DIST = "b70bench_decode_hooks-0.0.0.dist-info"


def _attention_class():
    from vllm.model_executor.models import minimax_m2

    return minimax_m2.MiniMaxM2Attention


def scale_attention_output() -> None:
    cls = _attention_class()
    if getattr(cls, "_b70bench_scaled", False):  # vLLM may load plugins more than once per process
        return
    scale = float(os.environ.get(ATTN_SCALE_ENV, "1.02"))
    original = cls.forward

    def forward(self, positions, hidden_states):
        return original(self, positions, hidden_states) * scale

    cls.forward = forward
    cls._b70bench_scaled = True


def default_off_branch() -> None:
    cls = _attention_class()
    if getattr(cls, "_b70bench_branch", False):
        return
    # Read once here, as a module-level flag would be: Dynamo sees a constant, not an env lookup.
    enabled = os.environ.get(BRANCH_ENV) == "1"
    original = cls.forward

    def forward(self, positions, hidden_states):
        if enabled:
            qkv, _ = self.qkv_proj(hidden_states)
            return self.o_proj(self.attn(*qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)))[0]
        return original(self, positions, hidden_states)

    cls.forward = forward
    cls._b70bench_branch = True


def resolve(name: str) -> str:
    """A short name from KNOWN, or any 'module:function' entry point."""
    if name in KNOWN:
        return KNOWN[name]
    if ":" not in name:
        from b70bench.errors import UsageError

        raise UsageError(f"unknown hook {name!r}: use one of {', '.join(KNOWN)} or a 'module:function' entry point")
    return name


def write_plugin_dir(directory: Path, hooks: list[str]) -> Path:
    """A directory that, on PYTHONPATH, makes vLLM load each hook as a general plugin."""
    dist = Path(directory) / _DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: b70bench-decode-hooks\nVersion: 0.0.0\n")
    lines = ["[vllm.general_plugins]"] + [f"b70bench_hook_{i} = {resolve(h)}" for i, h in enumerate(hooks)]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return Path(directory)
