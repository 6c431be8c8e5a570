"""The stack under test, described once: model, tensor parallel size, numerics, memory, environment, engine and
server arguments, shapes, devices, start timeout. A TOML file (docs/stacks.md), read by every path that starts
vLLM: `decode`, `serve`, `compare`, `revisions` and the asv adapters (B70BENCH_STACK names the file). Without a
file the stack is the embedded default: the tiny MiniMax-M2 with seeded weights, one process, the CPU's settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from b70bench.errors import UsageError
from b70bench.stack import environment, gate, shapes

ENV_VAR = "B70BENCH_STACK"
BACKENDS = ("cpu", "cuda", "xpu")
# Each backend's variable that limits the devices a process sees (vLLM numbers what is left from 0).
VISIBLE_DEVICES = {"cuda": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK"}
# A minutes-long load plus a warm compile on a rig; the embedded default starts in tens of seconds.
DEFAULT_START_TIMEOUT_S = 600.0
# What one process of the stack holds besides its weights and KV cache on the CPU (python, torch, vLLM, the
# compiled graph): the CPU default's engine peaked at about 1.3 GiB of RSS with a 1 GiB KV cache.
CPU_PROCESS_OVERHEAD_GIB = 1.5
# The KV cache a CPU engine gets when the stack sets none (VLLM_CPU_KVCACHE_SPACE, GiB): two engines may live at
# once, and a share of RAM would be drawn from what the other left free.
CPU_DEFAULT_KV_GIB = 1.0
# A stack file's gate pins live beside it under this name unless the file names another (`gate_file`).
GATE_FILE_NAME = "gates.json"

_TYPES = {
    "name": str,
    "backend": str,
    "devices": list,
    "model": str,
    "tokenizer": str,
    "tp": int,
    "dtype": str,
    "quantization": str,
    "max_model_len": int,
    "memory_fraction": float,
    "kv_cache_gib": float,
    "env": dict,
    "env_unset": list,
    "env_file": str,
    "engine_args": dict,
    "server_args": list,
    "shapes": list,
    "start_timeout_s": float,
    "gate_file": str,
    "start_s": float,
    "call_s": float,
    "min_effect": float,
}


@dataclass(frozen=True)
class Stack:
    name: str = "embedded"
    backend: str | None = None  # None: this machine's (B70BENCH_BACKEND, else xpu, then cuda, then cpu)
    devices: tuple[int, ...] | None = None  # None: every device the process sees
    model: str | None = None  # None: the embedded tiny MiniMax-M2
    tokenizer: str | None = None
    tp: int = 1
    dtype: str | None = None
    quantization: str | None = None
    max_model_len: int | None = None  # None: shapes.DEFAULT_MAX_MODEL_LEN, raised to a longer shape's length
    memory_fraction: float | None = None  # vLLM's gpu_memory_utilization
    kv_cache_gib: float | None = None  # the CPU's VLLM_CPU_KVCACHE_SPACE
    env: dict = field(default_factory=dict)
    env_unset: tuple[str, ...] = ()
    env_file: str | None = None
    engine_args: dict = field(default_factory=dict)
    server_args: tuple[str, ...] = ()
    shapes: tuple[str, ...] | None = None
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    # Where the gate's pins are read and written: beside the stack file unless it names one (the user's work, not the
    # installed package); None for the embedded default, whose pins ship with the package.
    gate_file: str | None = None
    # What a warm start and one timed call of the first shape cost here, as measured (decode's start_s and a call's
    # seconds): the plan checks a budget against them and sizes the default one. None: not stated.
    start_s: float | None = None
    call_s: float | None = None
    # The smallest change this stack's measurements must decide (a fraction: 0.02 is 2%): an interval that still holds
    # it is undecided, never "no change". None: compare's --min-effect, or what the calibrated budget decides.
    min_effect: float | None = None
    source: str | None = None  # the file it was read from

    @property
    def embedded(self) -> bool:
        return self.model is None

    def model_path(self) -> str:
        """What vLLM loads: the embedded checkpoint's directory (written on first use) or the stack's model."""
        if self.embedded:
            from b70bench.stack import model as modelmod

            return str(modelmod.ensure_embedded())
        return self.model

    def model_label(self) -> str:
        """The model's name in gate keys and on verdicts: the embedded model's content id, else its path."""
        if self.embedded:
            from b70bench.stack import model as modelmod

            return modelmod.model_id()
        return self.model

    def vllm_dtype(self) -> str | None:
        return self.dtype or ("bfloat16" if self.embedded else None)

    def resolved_backend(self) -> str:
        if self.backend:
            return self.backend
        from b70bench import device

        return device.select(None, None).backend

    def engine_args_full(self) -> dict:
        """LLM(...) / `vllm serve` keyword arguments beyond model, dtype, length, TP and memory share."""
        args = dict(self.engine_args)
        if self.quantization:
            args.setdefault("quantization", self.quantization)
        return args

    def max_len_for(self, prompt_len: int, output_len: int) -> int:
        return max(self.max_model_len or shapes.DEFAULT_MAX_MODEL_LEN, prompt_len + output_len)

    def engine_spec(self, shape: str) -> dict:
        """The live decode engines' spec for one shape (decode.live, decode.child read it)."""
        prompt_len, output_len, batch = shapes.parse_shape(shape)
        return {
            "model": self.model_path(),
            "dtype": self.vllm_dtype(),
            "max_model_len": self.max_len_for(prompt_len, output_len),
            "tp": self.tp,
            "memory_fraction": self.memory_fraction,
            "engine_args": self.engine_args_full(),
            "prompt_len": prompt_len,
            "output_len": output_len,
            "batch": batch,
            "warmup": 1,
            "gate": True,
        }

    def process_env(self, base: dict, backend: str) -> dict:
        """base plus what the stack sets for every process of it: its env file, then its env table, less what it
        unsets; the devices it names made the only ones visible; the CPU's KV cache size."""
        env = dict(base)
        if self.env_file:
            env.update(environment.read_env_file(self.env_file))
        env.update({k: str(v) for k, v in self.env.items()})
        for k in self.env_unset:
            env.pop(k, None)
        if self.devices is not None and backend in VISIBLE_DEVICES:
            env[VISIBLE_DEVICES[backend]] = ",".join(str(d) for d in self.devices)
        if backend == "cpu" and self.kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.kv_cache_gib:g}"
        return env

    def gate_key(self, backend_label: str, vllm_version: str | None) -> dict:
        return gate.key(self.model_label(), backend_label, vllm_version, self.vllm_dtype(), self.tp, self.quantization)

    def check_devices(self, backend: str, visible: int | None) -> None:
        """One line and exit 2 where the stack asks for more than the machine has."""
        if self.backend and self.backend != backend:
            raise UsageError(
                f"stack {self.name} ({self.source or 'default'}) names backend {self.backend}, this run is on "
                f"{backend}: run where {self.backend} is present, or pass --backend {self.backend}"
            )
        if backend == "cpu":
            return
        n = len(self.devices) if self.devices is not None else visible
        if visible is not None and self.devices is not None and max(self.devices, default=-1) >= visible:
            raise UsageError(
                f"stack {self.name}: devices {list(self.devices)} but this environment sees {visible} {backend} "
                f"device(s) (0-{visible - 1}): fix `devices` in {self.source}"
            )
        if n is not None and self.tp > n:
            raise UsageError(
                f"stack {self.name}: tp {self.tp} is larger than the {n} {backend} device(s) it may use: set tp to "
                f"{n} or list more `devices` in {self.source or 'the stack file'}"
            )

    def two_fit(self, backend: str, mem_available_gib: float | None = None) -> tuple[bool, str]:
        """(whether two processes of the stack fit at once, why): `auto` placement asks this."""
        if backend == "cpu":
            avail = available_gib() if mem_available_gib is None else mem_available_gib
            need = self.cpu_process_gib()
            if avail is None:
                return False, "the memory available is unknown here"
            ok = 2 * need <= avail
            return ok, (
                f"two processes of ~{need:.1f} GiB each {'fit in' if ok else 'exceed'} the {avail:.1f} GiB available"
            )
        share = self.memory_fraction
        if share is None:
            return False, f"the stack sets no memory_fraction, so each {backend} process takes vLLM's default 0.9"
        ok = 2 * share <= 1.0
        return ok, f"memory shares {share:g} + {share:g} of the same devices {'fit under' if ok else 'exceed'} one"

    def cpu_process_gib(self) -> float:
        """One CPU engine of the stack: its weights, its KV cache, the processes around them (one a TP rank)."""
        kv = self.kv_cache_gib if self.kv_cache_gib is not None else CPU_DEFAULT_KV_GIB
        weights = 0.0
        if not self.embedded and Path(self.model).is_dir():
            weights = sum(p.stat().st_size for p in Path(self.model).glob("*.safetensors")) / 2**30
            weights = weights or sum(p.stat().st_size for p in Path(self.model).glob("*.bin")) / 2**30
        return weights + kv + CPU_PROCESS_OVERHEAD_GIB * self.tp

    def summary(self) -> dict:
        """What a verdict stores about the stack that produced it."""
        return {
            "name": self.name,
            "model": self.model_label(),
            "tp": self.tp,
            "dtype": self.vllm_dtype() or "auto",
            "quantization": self.quantization,
            "backend": self.backend,
            "devices": list(self.devices) if self.devices is not None else None,
            "source": self.source,
            "hash": self.hash(),
        }

    def hash(self) -> str:
        """Content of the description (without where it was read from): two files saying the same are one stack."""
        d = asdict(self)
        d.pop("source")
        # Where pins are kept, what it costs, what it must decide: not what is measured.
        for key in ("gate_file", "start_s", "call_s", "min_effect"):
            d.pop(key)
        if self.env_file:
            d["env_file"] = environment.read_env_file(self.env_file)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=list).encode()).hexdigest()[:12]

    def describe(self) -> str:
        bits = [f"tp{self.tp}", self.vllm_dtype() or "dtype auto"]
        if self.quantization:
            bits.append(self.quantization)
        where = self.backend or "this machine's backend"
        if self.devices is not None:
            where += " devices " + ",".join(map(str, self.devices))
        return f"stack {self.name} ({self.source or 'built in'}): {self.model_label()} ({', '.join(bits)}) on {where}"


def available_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def default() -> Stack:
    return Stack()


def _bad(path, what: str) -> UsageError:
    return UsageError(f"stack {path}: {what} (docs/stacks.md)")


def load(path: str | os.PathLike) -> Stack:
    """Read a stack file; anything it cannot use is one line naming the key and the fix."""
    path = Path(path).expanduser()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"stack file {path} does not exist: pass the path of a TOML stack (docs/stacks.md)") from None
    except OSError as err:
        raise UsageError(f"cannot read stack file {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise _bad(path, f"not valid TOML: {err}") from None
    unknown = sorted(set(data) - set(_TYPES))
    if unknown:
        raise _bad(path, f"unknown key {unknown[0]!r}; the keys are {', '.join(_TYPES)}")
    for key, value in data.items():
        want = _TYPES[key]
        ok = isinstance(value, want) or (want is float and isinstance(value, int) and not isinstance(value, bool))
        if want is int and isinstance(value, bool):
            ok = False
        if not ok:
            raise _bad(path, f"{key} = {value!r} should be a {want.__name__}")
    here = path.resolve().parent

    def local(p: str) -> str:
        return str((here / Path(p).expanduser()).resolve())

    kw = dict(data)
    kw.setdefault("name", path.stem)
    if kw.get("backend") is not None and kw["backend"] not in BACKENDS:
        raise _bad(path, f"backend {kw['backend']!r}: one of {', '.join(BACKENDS)}")
    if "devices" in kw:
        if (
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in kw["devices"])
            or not kw["devices"]
        ):
            raise _bad(path, f"devices = {kw['devices']!r}: a list of device numbers such as [0, 1, 2, 3]")
        kw["devices"] = tuple(kw["devices"])
    if "model" in kw:
        if kw["model"] == "embedded":
            del kw["model"]
        elif kw["model"].startswith((".", "/", "~")):
            kw["model"] = local(kw["model"])
            if not Path(kw["model"]).is_dir():
                raise _bad(path, f"model directory {kw['model']} does not exist: point `model` at the checkpoint")
    if "tokenizer" in kw and kw["tokenizer"].startswith((".", "/", "~")):
        kw["tokenizer"] = local(kw["tokenizer"])
    if kw.get("tp", 1) < 1:
        raise _bad(path, f"tp = {kw['tp']}: 1 or more")
    if "memory_fraction" in kw and not 0 < kw["memory_fraction"] <= 1:
        raise _bad(path, f"memory_fraction = {kw['memory_fraction']}: a share in (0, 1], e.g. 0.9")
    for key in ("kv_cache_gib", "start_timeout_s", "max_model_len"):
        if key in kw and kw[key] <= 0:
            raise _bad(path, f"{key} = {kw[key]}: more than 0")
    for key in ("start_s", "call_s"):
        if key in kw and kw[key] <= 0:
            raise _bad(path, f"{key} = {kw[key]}: seconds, more than 0 (measure one warm start and one call)")
    if "min_effect" in kw and not 0 < kw["min_effect"] < 1:
        raise _bad(path, f"min_effect = {kw['min_effect']}: a fraction in (0, 1), e.g. 0.02 for 2%")
    for key in ("memory_fraction", "kv_cache_gib", "start_timeout_s", "start_s", "call_s", "min_effect"):
        if key in kw:
            kw[key] = float(kw[key])
    kw["gate_file"] = local(kw.get("gate_file", GATE_FILE_NAME))
    if "env_file" in kw:
        kw["env_file"] = local(kw["env_file"])
        environment.read_env_file(kw["env_file"])  # a missing or malformed file is refused now, not at a start
    for key in ("env_unset", "server_args", "shapes"):
        if key in kw:
            if not all(isinstance(x, str) for x in kw[key]):
                raise _bad(path, f"{key} should be a list of strings")
            kw[key] = tuple(kw[key])
    for s in kw.get("shapes", ()):
        shapes.parse_shape(s)
    bad_env = [k for k, v in kw.get("env", {}).items() if not isinstance(v, str | int | float | bool)]
    if bad_env:
        raise _bad(path, f"env.{bad_env[0]} should be a string")
    return Stack(**kw, source=str(path.resolve()))


def from_env(environ: dict | None = None) -> Stack:
    """The stack B70BENCH_STACK names, else the embedded default (the asv adapters read it this way)."""
    text = (os.environ if environ is None else environ).get(ENV_VAR)
    return load(text) if text else default()
