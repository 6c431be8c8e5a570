"""A commit's compile-cache keys against its parent's: the 0/1 figure a walk plots, and the line that names why.

The pin (pins.py) answers "is this still the known-good graph?"; once the key has moved on purpose or by accident,
every later commit reads 1 against it and a second move is no step. Against the parent, each commit that moves a key
reads 1 and every other commit 0, so each move is named at its own commit, with the factor that moved it. A paired
measurement (compare, a walk's commit, a bisect step) already starts both sides' engines, so both keys are read
from the same measurement, never from another run.
"""

from __future__ import annotations

from b70bench.cachekey.artifacts import primary
from b70bench.cachekey.explain import factors

KINDS = (("aot", "AOT"), ("piecewise", "piecewise"))
SHORT = 12  # hex digits a line shows of a key (the AOT key has 64)


def against_parent(parent: dict, commit: dict) -> dict:
    """parent, commit: described sides ({"keys": [...]} as cachekey.described_keys gives them, optionally
    env_factors / config). Per kind, both keys and 0/1 "differs from the parent's" (None where either side has no
    such key: vLLM writes no piecewise key on the CPU); the factors that moved, their phrases, and one line."""
    out: dict = {}
    for kind, _name in KINDS:
        old, new = primary(parent.get("keys", []), kind), primary(commit.get("keys", []), kind)
        out[f"parent_{kind}_key"], out[f"{kind}_key"] = old, new
        out[f"{kind}_differs_from_parent"] = None if old is None or new is None else int(old != new)
    moved = any(out[f"{kind}_differs_from_parent"] for kind, _name in KINDS)
    changed, why, _lines = factors(parent, commit) if moved else ([], [], [])
    out["factors"], out["why"] = changed, why
    out["line"] = line(out)
    return out


def line(change: dict) -> str:
    """The one line compare, bisect, revisions and the page print: "AOT key a21fcdad9e92 -> 95e3b33c2cf1:
    minimax_m2.py changed (MiniMaxM2Model.forward moved from line 480 to 483)"; "AOT key a21fcdad9e92 unchanged"."""
    moved, same = [], []
    for kind, name in KINDS:
        old, new = change.get(f"parent_{kind}_key"), change.get(f"{kind}_key")
        if change.get(f"{kind}_differs_from_parent") == 1:
            moved.append(f"{name} key {old[:SHORT]} -> {new[:SHORT]}")
        elif change.get(f"{kind}_differs_from_parent") == 0:
            same.append(f"{name} key {new[:SHORT]}")
    if moved:
        why = change.get("why") or []
        if not why:
            why = ["no factor b70bench records differs (run `b70bench cache-key explain PARENT COMMIT`)"]
        first, rest = why[0], why[1:]
        return f"{'; '.join(moved)}: {first}" + (f" ({'; '.join(rest)})" if rest else "")
    if same:
        return f"{'; '.join(same)} unchanged"
    return "no compile-cache key recorded on one side"


def from_sides(sides: dict) -> dict:
    """The key change of a paired result: side B (the commit) against side A (its parent), each read from its own
    engines' logs and compile-cache directory (the facts decode.pair records per side)."""
    from b70bench.cachekey.measure import described_keys

    described = {
        s: {"keys": described_keys({"cache_dir": f.get("cache_dir"), "cache_keys": f.get("cache_keys_full") or []})}
        for s, f in sides.items()
    }
    return against_parent(described["A"], described["B"])
