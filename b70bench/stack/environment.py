"""The environment each vLLM start gets: the engine defaults, the CPU's preloaded libraries, env files."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from b70bench.errors import UsageError

# Engine settings CPU runs get unless the caller sets them; scripts/decode_vs_latency.py gives vLLM's
# latency benchmark the same (engine_env). The engine core in the calling process: on 2 cores the
# default three processes (caller, engine core, worker) share them and made decode ~37% slower
# and less steady run to run (docs/decode.md).
# It is part of vLLM's compile factors, so the AOT cache key differs from a multiprocess start.
CPU_ENGINE_ENV: dict[str, str] = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# What paired engines (compare, a walk) add on the CPU unless the caller set it. The KV cache (GiB) is fixed: two
# engines live at once, and a share of RAM would be drawn from what the other left free. KMP_BLOCKTIME is the 5 ms
# vLLM's CPU worker asks for: it sets it only around its own set-up, and in the in-process engine the OpenMP
# runtime has read its default (200 ms) by then, so after every call the engine spun for 0.2 s (its CPU time),
# sharing the cores with the other engine's next call.
PAIRED_CPU_ENGINE_ENV: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "1", "KMP_BLOCKTIME": "5"}
# vLLM's CPU install guide asks for tcmalloc and Intel OpenMP in LD_PRELOAD (its worker warns
# without them). With both, the best warm p512n512 runs here were 6-9% faster; separate starts
# did not agree better (docs/decode.md). libiomp5 comes with vllm-cpu (intel-openmp);
# tcmalloc from Debian's libtcmalloc-minimal4 (scripts/install-cpu-libs.sh, run by the Makefile).
CPU_PRELOAD_LIBS = ("libtcmalloc_minimal.so.4", "libiomp5.so")
CPU_PRELOAD_DIRS = (
    Path(sys.prefix) / "lib",
    Path("/usr/lib/x86_64-linux-gnu"),
    Path("/usr/lib64"),
    Path("/usr/lib/aarch64-linux-gnu"),
    Path("/usr/lib"),
)
# With fixed_layout every start also gets these and runs with ASLR off (process.no_aslr_prefix), so the
# same code gets the same memory layout each start. Off by default: measured, it did not make warm
# runs agree better here (docs/decode.md).
LAYOUT_ENV: dict[str, str] = {"PYTHONHASHSEED": "0"}
# Variables worth keeping in each record (`env`): they change what the engine does.
ENV_PREFIXES = ("VLLM_", "OMP_", "KMP_", "B70BENCH_", "LD_PRELOAD", "MALLOC_", "TORCH_", "PYTHONHASHSEED")


def read_env_file(path: str | os.PathLike) -> dict[str, str]:
    """KEY=VALUE lines; `export `, quotes, blank lines and # comments allowed (a shell env file)."""
    out = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise UsageError(f"cannot read env file {path}: {err.strerror}: pass an existing KEY=VALUE file") from None
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise UsageError(f"{path}:{n}: not a KEY=VALUE line: {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def engine_env(
    backend: str, base: dict[str, str], memory_fraction: float | None, fixed_layout: bool = False
) -> dict[str, str]:
    """base plus the default engine settings (CPU_ENGINE_ENV on the CPU, LAYOUT_ENV) where base has none.

    A KV-cache size the caller asked for (memory_fraction) wins over a default VLLM_CPU_KVCACHE_SPACE.
    """
    env = dict(base)
    if fixed_layout:
        for k, v in LAYOUT_ENV.items():
            env.setdefault(k, v)
    if backend == "cpu":
        for k, v in CPU_ENGINE_ENV.items():
            if k == "VLLM_CPU_KVCACHE_SPACE" and memory_fraction is not None:
                continue
            env.setdefault(k, v)
        preload = cpu_preload()
        if preload and "LD_PRELOAD" not in env:  # a caller's own LD_PRELOAD (even empty) is kept as given
            env["LD_PRELOAD"] = preload
    return env


def cpu_preload() -> str:
    """LD_PRELOAD for vLLM on the CPU: those of CPU_PRELOAD_LIBS found on this machine, ':'-joined
    (empty when none is; vLLM then runs without them and says so in its log)."""
    found = []
    for lib in CPU_PRELOAD_LIBS:
        path = next((d / lib for d in CPU_PRELOAD_DIRS if (d / lib).is_file()), None)
        if path:
            found.append(str(path))
    return ":".join(found)


def child_env(base: dict[str, str], cache_root: Path | None, embedded: bool, plugin_dir: Path | None) -> dict:
    """base for one start: unbuffered output, its vLLM cache root, offline for the embedded model, and this
    checkout (and a hooks plug-in folder) on PYTHONPATH."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    if cache_root is not None:
        env["VLLM_CACHE_ROOT"] = str(cache_root)
    if embedded:
        env.setdefault("HF_HUB_OFFLINE", "1")
    paths = [str(Path(__file__).resolve().parents[2])]
    if plugin_dir is not None:
        paths.insert(0, str(plugin_dir))
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env
