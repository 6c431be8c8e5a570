"""Why a key moved: the factors two sides (cache dirs, records or commits) differ in."""

from __future__ import annotations

import json
import re
from pathlib import Path

from b70bench.cachekey.artifacts import find_keys, keys_from_paths, primary
from b70bench.errors import UsageError


def load_side(spec: str, records_dir: Path | None = None) -> dict:
    """A described cache from a path (cache dir, key dir, JSON record) or a commit with a saved record."""
    p = Path(spec)
    if not p.exists() and records_dir is not None and re.fullmatch(r"[0-9a-fA-F]{4,40}", spec):
        hits = sorted(records_dir.glob(f"*/{spec.lower()}*/cachekey.json"))
        if len(hits) > 1:
            raise UsageError(
                f"commit {spec} matches {len(hits)} saved records ({', '.join(map(str, hits[:3]))}): "
                f"give more hex digits or a record path"
            )
        p = hits[0] if hits else p
    if p.is_dir():
        return {"keys": find_keys(p), "source": str(p)}
    if p.is_file():
        try:
            data = json.loads(p.read_text())
        except ValueError:
            raise UsageError(f"{p} is not JSON: pass a cache directory, a cache-key record or a commit") from None
        if isinstance(data, dict) and "records" in data:
            data = data["records"][0] if data["records"] else {}
        if "keys" in data:
            return {**data, "source": str(p)}
        return {"keys": keys_from_paths(data.get("cache_keys") or []), "source": str(p), **data}
    raise UsageError(
        f"{spec!r} is neither a cache directory, a record file nor a commit with a saved cache-key "
        f"record under {records_dir}: run the cache-key benchmark for it first"
    )


def _dict_diff(a: dict, b: dict) -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            out.append(f"{k}: {a.get(k)!r} -> {b.get(k)!r}")
    return out


def _sources_diff(a: dict, b: dict) -> list[str]:
    out = []
    for mod in sorted(set(a) | set(b)):
        if mod not in a:
            out.append(f"{mod}: newly traced")
        elif mod not in b:
            out.append(f"{mod}: no longer traced")
        elif a[mod]["sha256"] != b[mod]["sha256"]:
            fa, fb = a[mod]["functions"], b[mod]["functions"]
            changed = sorted(set(fa.items()) ^ set(fb.items()))
            moved = [lines for lines, _ in changed if lines in fb]
            if moved:
                out.append(
                    f"{mod}: file text differs ({len(moved)} traced function(s) changed or moved: "
                    f"{', '.join(f'lines {x}' for x in moved[:6])})"
                )
            else:
                out.append(
                    f"{mod}: file text differs outside every traced function (moves the 10-hex "
                    f"piecewise key, which hashes whole files; not the AOT key)"
                )
    return out


def explain(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """(factors that changed among env, config, code, compiler; report lines) between two described caches."""
    changed, _why, lines = factors(a, b)
    return changed, lines


def _module_file(module: str) -> str:
    """A traced module as people name it: vllm.model_executor.models.minimax_m2 -> minimax_m2.py."""
    return module.rsplit(".", 1)[-1] + ".py"


def factors(a: dict, b: dict) -> tuple[list[str], list[str], list[str]]:
    """(factors that changed, a short phrase for each thing that moved, report lines) between two described
    caches: the phrases are what a one-line key change names ("minimax_m2.py changed", "env VLLM_X"), the lines
    what `cache-key explain` prints."""
    lines, changed, why = [], [], []
    for kind in ("aot", "piecewise"):
        ka, kb = primary(a.get("keys", []), kind), primary(b.get("keys", []), kind)
        if ka or kb:
            lines.append(f"{kind} key: {ka or '-'} -> {kb or '-'}{'  (same)' if ka == kb else '  (CHANGED)'}")
    art_a = _first_artifact(a)
    art_b = _first_artifact(b)
    if art_a and art_b:
        fwd_a, fwd_b = art_a["forward"], art_b["forward"]
        if fwd_a != fwd_b:
            changed.append("code")
            why.append(f"{fwd_b['qualname']} moved from line {fwd_a['firstlineno']} to {fwd_b['firstlineno']}")
            lines.append(
                f"code: forward {fwd_a['qualname']} line {fwd_a['firstlineno']} -> {fwd_b['qualname']} "
                f"line {fwd_b['firstlineno']} (the AOT key hashes this qualname and line)"
            )
        src = _sources_diff(art_a["sources"], art_b["sources"])
        # A traced file that changed is what a person names first ("minimax_m2.py changed"), before the line.
        why[:0] = [f"{_module_file(s.split(':', 1)[0])} changed" for s in src]
        if src:
            if "code" not in changed:
                changed.append("code")
            lines.append(f"code: {len(src)} traced file(s) differ:")
            lines += [f"  {s}" for s in src]
        comp = _dict_diff(art_a["compiler"], art_b["compiler"])
        if comp:
            changed.append("compiler")
            why += [f"compiler {c.split(':', 1)[0]}" for c in comp]
            lines += [f"compiler: {c}" for c in comp]
    fa, fb = _first_factors(a), _first_factors(b)
    if fa and fb:
        env = _dict_diff(fa.get("env") or {}, fb.get("env") or {})
        if env:
            changed.append("env")
            why += [f"env {e.split(':', 1)[0]}" for e in env]
            lines += [f"env: {e}" for e in env]
        for name, factor in (("config_hash", "config"), ("code_hash", "code"), ("compiler_hash", "compiler")):
            if fa.get(name) != fb.get(name):
                if factor not in changed:
                    changed.append(factor)
                    why.append(f"{factor} hash")
                lines.append(f"{factor}: {name} {fa.get(name)} -> {fb.get(name)}")
    for name, factor in (("env_factors", "env"), ("config", "config")):
        if a.get(name) is not None and b.get(name) is not None and a[name] != b[name]:
            diff = (
                _dict_diff(a[name], b[name])
                if isinstance(a[name], dict) and isinstance(b[name], dict)
                else [f"{a[name]!r} -> {b[name]!r}"]
            )
            if factor not in changed:
                changed.append(factor)
            why += [f"{factor} {d.split(':', 1)[0]}" if isinstance(a[name], dict) else factor for d in diff]
            lines += [f"{factor}: {d}" for d in diff]
    if not changed:
        same = all(primary(a.get("keys", []), k) == primary(b.get("keys", []), k) for k in ("aot", "piecewise"))
        lines.append(
            "no factor differs"
            + (
                ""
                if same
                else " among those recorded (the keys differ: a factor b70bench cannot see, e.g. vLLM's config hash "
                "on the CPU, where vLLM writes no cache_key_factors.json)"
            )
        )
    return changed, list(dict.fromkeys(why)), lines


def _first_artifact(side: dict) -> dict | None:
    for k in side.get("keys", []):
        for art in (k.get("artifacts") or {}).values():
            return art
    return None


def _first_factors(side: dict) -> dict | None:
    for k in side.get("keys", []):
        for f in (k.get("factors") or {}).values():
            return f
    return None
