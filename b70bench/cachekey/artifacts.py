"""Reading vLLM's compile cache without running it: the AOT artifact (an inert unpickler) and the keys."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
from pathlib import Path

from b70bench.errors import UsageError

AOT_DIR_RE = re.compile(r"torch_aot_compile/([0-9a-f]{64})(?:/|$)")
PIECEWISE_DIR_RE = re.compile(r"torch_compile_cache/([0-9a-f]{10})(?:/|$)")
FACTORS_NAME = "cache_key_factors.json"


class _Stub:
    """Stands in for every class a pickle names: records arguments and state, runs nothing."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs, self.state = args, kwargs, None

    def __setstate__(self, state):
        self.state = state

    def __call__(self, *args, **kwargs):
        return _Stub(*args, **kwargs)


class _StubUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        return type(f"{module}.{name}", (_Stub,), {})

    def persistent_load(self, pid):
        return None


def _fields(obj) -> dict:
    if isinstance(obj, _Stub) and isinstance(obj.state, dict):
        return obj.state
    return obj if isinstance(obj, dict) else {}


def read_aot_artifact(path: str | os.PathLike) -> dict:
    """Forward, compiler versions and traced sources recorded in an AOT `model` file."""
    data = Path(path).read_bytes()
    try:
        top = _StubUnpickler(io.BytesIO(data)).load()
    except Exception as err:  # any malformed pickle: say which file, do not guess
        raise UsageError(
            f"{path} is not a readable vLLM AOT artifact ({type(err).__name__}: {err}); "
            f"delete its directory and let vLLM compile again"
        ) from None
    top = _fields(top)
    code = _fields(top.get("original_code"))
    system = _fields(top.get("system_info"))
    sources: dict[str, dict] = {}
    for src in _fields(top.get("source_info")).get("inlined_sources") or ():
        f = _fields(src)
        module, content = f.get("module"), f.get("content")
        if not isinstance(module, str) or not isinstance(content, str):
            continue
        entry = sources.setdefault(module, {"sha256": hashlib.sha256(content.encode()).hexdigest(), "functions": {}})
        entry["functions"][f"{f.get('firstlineno')}-{f.get('lastlineno')}"] = f.get("checksum")
    triton = system.get("triton_version")
    return {
        "forward": {
            "qualname": code.get("co_qualname"),
            "filename": code.get("co_filename"),
            "firstlineno": code.get("co_firstlineno"),
        },
        "compiler": {
            "python": system.get("python_version"),
            "triton": ".".join(map(str, triton)) if isinstance(triton, (tuple, list)) else triton,
            "backend": top.get("backend_name"),
            "device_type": top.get("device_type"),
        },
        "sources": dict(sorted(sources.items())),
    }


def find_keys(root: str | os.PathLike) -> list[dict]:
    """Every cache key under root (a VLLM_CACHE_ROOT, its torch_compile_cache, or one key's directory)."""
    root = Path(root)
    if not root.exists():
        raise UsageError(
            f"{root} does not exist: pass a VLLM_CACHE_ROOT, a torch_compile_cache directory or one key's directory"
        )
    keys = []
    candidates = [root] + [p for p in root.rglob("*") if p.is_dir() and "inductor_cache" not in p.parts]
    for d in candidates:
        path = d.as_posix()
        if (m := AOT_DIR_RE.search(path + "/")) and path.endswith(m.group(1)):
            entry = {"kind": "aot", "key": m.group(1), "path": str(d), "artifacts": {}}
            for model in sorted(d.glob("rank_*/model")):
                entry["artifacts"][model.parent.name] = read_aot_artifact(model)
            keys.append(entry)
        elif (m := PIECEWISE_DIR_RE.search(path + "/")) and path.endswith(m.group(1)):
            entry = {"kind": "piecewise", "key": m.group(1), "path": str(d), "factors": {}}
            for f in sorted(d.rglob(FACTORS_NAME)):
                try:
                    entry["factors"][str(f.parent.relative_to(d))] = json.loads(f.read_text())
                except ValueError:
                    entry["factors"][str(f.parent.relative_to(d))] = {"unreadable": str(f)}
            keys.append(entry)
    return keys


def keys_from_paths(paths) -> list[dict]:
    """Keys named by log lines or record paths, when the directories themselves are gone."""
    out = []
    for p in paths:
        # Decode records hold the bare keys their log named; log lines and saved records hold paths.
        if re.fullmatch(r"[0-9a-f]{64}|[0-9a-f]{10}", str(p)):
            p = f"torch_aot_compile/{p}" if len(str(p)) == 64 else f"torch_compile_cache/{p}"
        for kind, rx in (("aot", AOT_DIR_RE), ("piecewise", PIECEWISE_DIR_RE)):
            if (m := rx.search(str(p) + "/")) and not any(k["key"] == m.group(1) for k in out):
                out.append({"kind": kind, "key": m.group(1), "path": str(p)})
    return out


def primary(keys: list[dict], kind: str) -> str | None:
    """The key of this kind (the one a figure tracks); several of one kind are joined, sorted."""
    found = sorted({k["key"] for k in keys if k["kind"] == kind})
    return "+".join(found) if found else None
