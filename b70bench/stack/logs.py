"""Facts vLLM only states in its log: KV-cache size, compile-cache identity, backend choices, why it failed.

Patterns follow vLLM 0.32's wording (and the CUDA/XPU variants the lab's logs show); each one
is optional, so a line vLLM stops printing leaves that figure None instead of breaking a run.
"""

from __future__ import annotations

import re

# vLLM prefixes lines with "(EngineCore pid=12) INFO 11-30 09:46:20 [file.py:12] "; strip it.
_PREFIX = re.compile(
    r"^(?:\([\w-]+ pid=\d+\)\s+)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d "
    r"\d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s+)?"
)
_KV = re.compile(
    r"\b(\w+) KV cache size: ([\d,]+) tokens(?:, Maximum concurrency for ([\d,]+) tokens per "
    r"request: ([\d.]+)x)?"
)
# vLLM 0.20.1 logs the KV-cache size ("GPU KV cache size: N tokens", GPU whatever the device) and the
# concurrency as two lines (v1/core/kv_cache_utils.py); 0.32 joins them and names the platform.
_CONCURRENCY = re.compile(r"^Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_AOT_SAVED = re.compile(r"saved AOT compiled function to (\S+)")
_AOT_LOADED = re.compile(r"Directly load AOT compilation from path (\S+)")
_AOT_AGAIN = re.compile(r"Compiling model again due to a load failure from (\S+), reason: (.*)$")
_AOT_UNSAVED = re.compile(r"unable to save AOT compiled function to (\S+): (.*)$")
_CACHE_DIR = re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile")
_COMPILE_TIME = re.compile(r"torch\.compile took ([\d.]+) s in total")
_AOT_KEY = re.compile(r"torch_aot_compile/([0-9a-f]{16,})(?:/|$)")
_DIR_KEY = re.compile(r"torch_compile_cache/([0-9a-f]{6,})(?:/|$)")
_BACKEND = re.compile(r"\bUsing (.+? (?:backend|Backend)\b.*)$")
_CUSTOM_OP = re.compile(r"\b(?:custom op|custom_op|torch\.ops\.[\w.]+)\b.*", re.IGNORECASE)
# Environment flags worth showing: vLLM's and the accelerator runtimes' (as the lab's env file sets).
_ENV = re.compile(
    r"\b((?:VLLM|B70BENCH|ZE|SYCL|CCL|ONEAPI|UR|IGC|NCCL|CUDA|TORCH|OMP|KMP|HF)_[A-Z0-9_]+)"
    r"=('[^']*'|\"[^\"]*\"|\S+)"
)
_ENV_HEADER = "b70bench env: "
_EXC = re.compile(r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Timeout)):?\s*(.*)$")
# Exceptions that only wrap the real cause, which vLLM logs above them.
_WRAPPERS = (
    "Engine core initialization failed",
    "EngineDeadError",
    "EngineGenerateError",
    "Worker failed with error",
    "WorkerProc initialization failed",
)
# A tensor-parallel worker that died (killed, out of memory): vLLM's executor says so in a log line, not an exception,
# and the caller then sees only what followed ("RuntimeError: cancelled"): the death is the cause.
_DIED = re.compile(r"((?:Worker proc|RayWorkerProc)\b.*? died unexpectedly(?: \(exit code: -?\d+\))?)")


def is_wrapper(error: str) -> bool:
    """Whether an exception line only wraps a cause vLLM logged above it (failure_reason finds that cause)."""
    return any(w in error for w in _WRAPPERS)


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line.rstrip("\n"), count=1)


def _key_of(path: str) -> str | None:
    m = _AOT_KEY.search(path) or _DIR_KEY.search(path)
    return m.group(1) if m else None


def _cache_root(path: str) -> str:
    """The torch_compile_cache directory a saved/loaded artifact lives in."""
    marker = "torch_compile_cache"
    i = path.find(marker)
    return path[: i + len(marker)] if i >= 0 else path


def parse(text: str) -> dict:
    """Everything this module knows how to read from one vLLM log."""
    out: dict = {
        "kv_cache_tokens": None,
        "kv_cache_device": None,
        "max_concurrency": None,
        "cache_dir": None,
        "cache_keys": [],
        "cache_events": [],
        "cache_state": None,
        "compile_s": None,
        "backends": [],
        "custom_op_markers": [],
        "env": {},
    }
    compile_s = 0.0
    for raw in text.splitlines():
        line = strip_prefix(raw)
        if line.startswith(_ENV_HEADER):
            k, _, v = line[len(_ENV_HEADER) :].partition("=")
            out["env"][k.strip()] = v.strip()
            continue
        if m := _KV.search(line):
            out["kv_cache_device"] = m.group(1)
            out["kv_cache_tokens"] = int(m.group(2).replace(",", ""))
            if m.group(4):
                out["max_concurrency"] = float(m.group(4))
        elif m := _CONCURRENCY.match(line):
            out["max_concurrency"] = float(m.group(2))
        for pattern, event in ((_AOT_SAVED, "saved"), (_AOT_LOADED, "loaded"), (_CACHE_DIR, "cache-dir")):
            if m := pattern.search(line):
                _add_event(out, event, m.group(1))
        if m := _AOT_AGAIN.search(line):
            _add_event(out, "compiled-again", m.group(1), m.group(2).strip())
        if m := _AOT_UNSAVED.search(line):
            _add_event(out, "save-failed", m.group(1), m.group(2).strip())
        if m := _COMPILE_TIME.search(line):
            compile_s += float(m.group(1))
            out["compile_s"] = compile_s
        if m := _BACKEND.search(line):
            _add_unique(out["backends"], m.group(1).strip())
        if m := _CUSTOM_OP.search(line):
            _add_unique(out["custom_op_markers"], m.group(0).strip())
        for m in _ENV.finditer(line):
            out["env"].setdefault(m.group(1), m.group(2).strip("'\""))
    out["cache_state"] = cache_state(out["cache_events"])
    return out


def _add_unique(items: list, value) -> None:
    if value not in items:
        items.append(value)


def _add_event(out: dict, event: str, path: str, reason: str | None = None) -> None:
    path = path.rstrip(",.")
    entry = {"event": event, "path": path}
    if reason:
        entry["reason"] = reason
    out["cache_events"].append(entry)
    if key := _key_of(path):
        _add_unique(out["cache_keys"], key)
    if out["cache_dir"] is None and event != "save-failed":
        out["cache_dir"] = _cache_root(path)


def cache_state(events: list[dict]) -> str | None:
    """loaded / compiled / compiled-again: <reason>, from the AOT events of one start."""
    kinds = [e["event"] for e in events]
    if "compiled-again" in kinds:
        reason = next(e.get("reason", "") for e in events if e["event"] == "compiled-again")
        return f"compiled-again: {reason}" if reason else "compiled-again"
    if "loaded" in kinds:
        return "loaded"
    if "saved" in kinds or "save-failed" in kinds:
        return "compiled"
    return None


def failure_reason_in(path) -> str | None:
    """failure_reason of the log file at path; None when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return failure_reason(f.read())
    except OSError:
        return None


def failure_reason(text: str, limit: int = 400) -> str | None:
    """vLLM's reason for a failed run, in one line.

    The last exception line that is not a wrapper: the engine core logs the root cause before
    the caller's "Engine core initialization failed. See root cause above". Validation errors
    (pydantic) put the message on the next line; it is appended.
    """
    lines = [strip_prefix(raw).strip() for raw in text.splitlines()]
    deaths = [m.group(1) for line in lines if (m := _DIED.search(line))]
    if deaths:
        return deaths[0][:limit]
    found: list[str] = []
    for i, line in enumerate(lines):
        m = _EXC.match(line)
        if not m:
            continue
        msg = m.group(2)
        if re.match(r"\d+ validation errors? for ", msg) and i + 1 < len(lines):
            msg = f"{msg}: {lines[i + 1].split(' [type=')[0].strip()}"
        found.append(f"{m.group(1)}: {msg}" if msg else m.group(1))
    if not found:
        return None
    roots = [f for f in found if not is_wrapper(f)]
    reason = (roots or found)[-1]
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."
