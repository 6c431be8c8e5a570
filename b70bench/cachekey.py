"""Compile-cache identity: which key vLLM chose, whether it moved, and why.

vLLM names its compiled-graph cache by a hash. Two kinds exist:
- the piecewise key: `torch_compile_cache/<10 hex>/rank_R_D/<prefix>/`, the first 10 hex of
  sha256 over [env, config, code, compiler] hashes, with `cache_key_factors.json` beside it
  (raw env factors and the three other hashes). Written where the piecewise backend runs
  with its cache enabled (CUDA, XPU).
- the AOT key: `torch_compile_cache/torch_aot_compile/<64 hex>/rank_R_D/model`, sha256 over
  [env hash, config hash, sha256(vLLM version, forward's qualname, forward's first line)].
  Not the traced files: so inserting a default-off branch above `forward` moves it. The
  artifact itself (a pickle) records every traced source with its text, the forward's code
  object and the compiler versions; b70bench reads those without importing torch or
  running any of the pickle's code, so `explain` can name the traced files that differ.

A change of key is the seeds' quiet failure: same tokens, different compiled graph, fewer
tokens per second. `differs` (0/1 against a pinned key for this machine and config) makes it
an upward step on asv's regressions page.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import platform
import re
import shutil
import tempfile
from pathlib import Path

from b70bench import state
from b70bench.errors import Unavailable, UsageError

AOT_DIR_RE = re.compile(r"torch_aot_compile/([0-9a-f]{64})(?:/|$)")
PIECEWISE_DIR_RE = re.compile(r"torch_compile_cache/([0-9a-f]{10})(?:/|$)")
FACTORS_NAME = "cache_key_factors.json"
PINS_ENV = "B70BENCH_CACHE_KEY_PINS"


def unavailable_reason(device) -> str | None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: the cache key is vLLM's (pip install '.[cpu]' or '.[cuda]')"
    from b70bench import decode

    return decode.unavailable_reason(device)


# ---------------------------------------------------------------- reading the cache


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
        raise UsageError(f"{path} is not a readable vLLM AOT artifact ({type(err).__name__}: {err}); "
                         f"delete its directory and let vLLM compile again") from None
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
        "forward": {"qualname": code.get("co_qualname"), "filename": code.get("co_filename"),
                    "firstlineno": code.get("co_firstlineno")},
        "compiler": {"python": system.get("python_version"),
                     "triton": ".".join(map(str, triton)) if isinstance(triton, (tuple, list)) else triton,
                     "backend": top.get("backend_name"), "device_type": top.get("device_type")},
        "sources": dict(sorted(sources.items())),
    }


def find_keys(root: str | os.PathLike) -> list[dict]:
    """Every cache key under root (a VLLM_CACHE_ROOT, its torch_compile_cache, or one key's directory)."""
    root = Path(root)
    if not root.exists():
        raise UsageError(f"{root} does not exist: pass a VLLM_CACHE_ROOT, a torch_compile_cache directory or "
                         f"one key's directory")
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


# ---------------------------------------------------------------- explaining a change


def _load_side(spec: str, records_dir: Path | None = None) -> dict:
    """A described cache from a path (cache dir, key dir, JSON record) or a commit with a saved record."""
    p = Path(spec)
    if not p.exists() and records_dir is not None and re.fullmatch(r"[0-9a-fA-F]{4,40}", spec):
        hits = sorted(records_dir.glob(f"*/{spec.lower()}*/cachekey.json"))
        if len(hits) > 1:
            raise UsageError(f"commit {spec} matches {len(hits)} saved records ({', '.join(map(str, hits[:3]))}): "
                             f"give more hex digits or a record path")
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
    raise UsageError(f"{spec!r} is neither a cache directory, a record file nor a commit with a saved cache-key "
                     f"record under {records_dir}: run the cache-key benchmark for it first")


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
                out.append(f"{mod}: file text differs ({len(moved)} traced function(s) changed or moved: "
                           f"{', '.join(f'lines {x}' for x in moved[:6])})")
            else:
                out.append(f"{mod}: file text differs outside every traced function (moves the 10-hex "
                           f"piecewise key, which hashes whole files; not the AOT key)")
    return out


def explain(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """(factors that changed among env, config, code, compiler; report lines) between two described caches."""
    lines, changed = [], []
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
            lines.append(f"code: forward {fwd_a['qualname']} line {fwd_a['firstlineno']} -> {fwd_b['qualname']} "
                         f"line {fwd_b['firstlineno']} (the AOT key hashes this qualname and line)")
        src = _sources_diff(art_a["sources"], art_b["sources"])
        if src:
            if "code" not in changed:
                changed.append("code")
            lines.append(f"code: {len(src)} traced file(s) differ:")
            lines += [f"  {s}" for s in src]
        comp = _dict_diff(art_a["compiler"], art_b["compiler"])
        if comp:
            changed.append("compiler")
            lines += [f"compiler: {c}" for c in comp]
    fa, fb = _first_factors(a), _first_factors(b)
    if fa and fb:
        env = _dict_diff(fa.get("env") or {}, fb.get("env") or {})
        if env:
            changed.append("env")
            lines += [f"env: {e}" for e in env]
        for name, factor in (("config_hash", "config"), ("code_hash", "code"), ("compiler_hash", "compiler")):
            if fa.get(name) != fb.get(name):
                if factor not in changed:
                    changed.append(factor)
                lines.append(f"{factor}: {name} {fa.get(name)} -> {fb.get(name)}")
    for name, factor in (("env_factors", "env"), ("config", "config")):
        if a.get(name) is not None and b.get(name) is not None and a[name] != b[name]:
            diff = _dict_diff(a[name], b[name]) if isinstance(a[name], dict) and isinstance(b[name], dict) \
                else [f"{a[name]!r} -> {b[name]!r}"]
            if factor not in changed:
                changed.append(factor)
            lines += [f"{factor}: {d}" for d in diff]
    if not changed:
        same = all(primary(a.get("keys", []), k) == primary(b.get("keys", []), k) for k in ("aot", "piecewise"))
        lines.append("no factor differs" + ("" if same else
                     " among those recorded (the keys differ: a factor b70bench cannot see, e.g. vLLM's config hash "
                     "on the CPU, where vLLM writes no cache_key_factors.json)"))
    return changed, lines


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


# ---------------------------------------------------------------- pins


def default_pins_path() -> Path:
    if os.environ.get(PINS_ENV):
        return Path(os.environ[PINS_ENV])
    return state.pins_path()


def pin_id(machine: str | None, config: str) -> str:
    return f"{machine or platform.node()}|{config}"


def read_pins(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError:
        raise UsageError(f"pins file {path} is not JSON: fix or delete it (b70bench writes it atomically, so "
                         f"it was edited by hand)") from None
    return data.get("pins", {})


def write_pin(path: Path, ident: str, keys: dict, **extra) -> None:
    from b70bench.records import atomic_write_text

    pins = read_pins(path)
    pins[ident] = {**keys, **extra}
    atomic_write_text(path, json.dumps({"pins": pins}, indent=2, sort_keys=True) + "\n")


def differs(keys: dict, pinned: dict | None) -> dict[str, int | None]:
    """kind -> 1 if the key differs from the pinned one, 0 if equal, None if either is missing."""
    out = {}
    for kind in ("aot", "piecewise"):
        have, want = keys.get(kind), (pinned or {}).get(kind)
        out[kind] = None if have is None or want is None else int(have != want)
    return out


# ---------------------------------------------------------------- the measuring function

DEFAULT_SHAPE = "p128n64"


def default_records_dir() -> Path:
    return state.records_dir()


def config_id(rec: dict) -> str:
    """What, besides the machine, a pinned key is valid for."""
    fp = rec.get("fingerprint") or {}
    return (f"{rec.get('model')}|{rec.get('dtype')}|tp{rec.get('tp')}|mml{rec.get('max_model_len')}"
            f"|vllm {fp.get('vllm')}|torch {fp.get('torch')}")


def _env_factors() -> dict | None:
    """vLLM's raw env factors as this process sees them (the child inherits this environment)."""
    try:
        from vllm import envs

        return {k: str(v) for k, v in envs.compile_factors().items()}
    except Exception:
        return None


def measure(dev=None, *, shape: str = DEFAULT_SHAPE, pins_path: str | os.PathLike | None = None,
            machine: str | None = None, auto_pin: bool = True, records_dir: str | os.PathLike | None = None,
            runs: int = 0, decode_kwargs: dict | None = None) -> list[dict]:
    """One vLLM start on an empty compile cache: the key(s) it chose, described, compared with the pin.

    The first key seen for a machine and config is pinned when auto_pin (asv walks a range
    oldest first when given a hash file in that order; `b70bench cache-key pin` re-pins).
    The record is also saved under records_dir/<machine>/<commit>/cachekey.json for `explain`.
    """
    from b70bench import decode
    from b70bench import device as devmod

    dev = dev or devmod.select()
    reason = unavailable_reason(dev)
    if reason:
        raise Unavailable(reason)
    root = Path(tempfile.mkdtemp(prefix="b70bench-cachekey-"))
    try:
        recs = decode.measure(shapes=[shape], runs=runs, cold=True, env={"VLLM_CACHE_ROOT": str(root)},
                              device=dev, **(decode_kwargs or {}))
        keys = find_keys(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    run = recs[-1]
    rec = from_decode_record(run, keys, pins_path=pins_path, machine=machine, auto_pin=auto_pin)
    save(rec, run, records_dir=records_dir, machine=machine)
    return [rec]


def save(rec: dict, run: dict, *, records_dir=None, machine: str | None = None) -> None:
    """Keep the record under records_dir/<machine>/<commit>/cachekey.json, for `explain COMMIT COMMIT`."""
    from b70bench import records

    commit = (run.get("fingerprint") or {}).get("commit")
    if commit:
        out = Path(records_dir) if records_dir else default_records_dir()
        records.write_json(out / (machine or platform.node()) / commit / "cachekey.json", [rec])


def from_decode_record(run: dict, keys: list[dict] | None = None, *, pins_path=None, machine: str | None = None,
                       auto_pin: bool = True) -> dict:
    """The cache-key record for a decode run that already happened (no extra vLLM start).

    keys: the described keys if the run's cache directory was read; else the keys vLLM logged,
    described from the run's cache directory where it still holds them.
    """
    from b70bench import records

    if not keys:
        # What this run chose is what vLLM logged: a persistent cache directory also holds the keys
        # of earlier commits. The directory only adds descriptions (traced files) of those keys.
        keys = keys_from_paths(run.get("cache_keys") or [])
        chosen = {k["key"] for k in keys}
        if chosen and run.get("cache_dir") and Path(run["cache_dir"]).is_dir():
            described = [k for k in find_keys(run["cache_dir"]) if k["key"] in chosen]
            if {k["key"] for k in described} == chosen:
                keys = described
        elif not chosen and run.get("cache_dir") and Path(run["cache_dir"]).is_dir():
            keys = find_keys(run["cache_dir"])  # nothing logged: the directory is all there is
    found = {"aot": primary(keys, "aot"), "piecewise": primary(keys, "piecewise")}
    pins_path = Path(pins_path) if pins_path else default_pins_path()
    ident = pin_id(machine, config_id(run))
    pinned = read_pins(pins_path).get(ident)
    pinned_now = False
    fp = run.get("fingerprint") or {}
    if pinned is None and auto_pin and any(found.values()):
        write_pin(pins_path, ident, found, commit=fp.get("commit"), patch_set_hash=fp.get("patch_set_hash"))
        pinned, pinned_now = found, True
    d = differs(found, pinned)
    return records.record(
        "cache-key", shape=run.get("shape"), config=config_id(run), machine=machine or platform.node(),
        aot_key=found["aot"], piecewise_key=found["piecewise"],
        pinned_aot_key=(pinned or {}).get("aot"), pinned_piecewise_key=(pinned or {}).get("piecewise"),
        aot_differs=d["aot"], piecewise_differs=d["piecewise"], pinned_now=pinned_now, pins_file=str(pins_path),
        cache_state=run.get("cache_state"), ok=run.get("ok"), error=run.get("error"),
        s_per_output_token=run.get("s_per_output_token"),
        samples_s_per_output_token=run.get("samples_s_per_output_token") or [],
        output_tok_per_s=run.get("output_tok_per_s"), token_sha256=run.get("token_sha256"),
        log_path=run.get("log_path"), keys=keys, env_factors=_env_factors(),
        config_fields={k: run.get(k) for k in ("model", "dtype", "tp", "max_model_len", "memory_fraction")},
        fingerprint=fp)


# ---------------------------------------------------------------- CLI

COLUMNS = ["suite", "shape", "aot_key", "piecewise_key", "aot_differs", "piecewise_differs", "cache_state",
           "s_per_output_token"]


def _short(rec: dict) -> dict:
    out = dict(rec)
    for k in ("aot_key", "piecewise_key"):
        if out.get(k):
            out[k] = out[k][:16]
    return out


def run(args) -> int:
    from b70bench import records

    action = args.action or "measure"
    records_dir = Path(args.records) if args.records else default_records_dir()
    if action == "show":
        side = _load_side(args.path, records_dir)
        for k in side.get("keys", []):
            print(f"{k['kind']:9s}  {k['key']}  {k.get('path', '')}")
            for rank, art in (k.get("artifacts") or {}).items():
                fwd = art["forward"]
                print(f"  {rank}: forward {fwd['qualname']} line {fwd['firstlineno']} in {fwd['filename']}; "
                      f"{len(art['sources'])} traced modules; compiler {art['compiler']}")
            for where, f in (k.get("factors") or {}).items():
                print(f"  {where}: config {f.get('config_hash')} code {f.get('code_hash')} "
                      f"compiler {f.get('compiler_hash')} env {len(f.get('env') or {})} factors")
        if not side.get("keys"):
            print(f"no compile-cache key found in {args.path}")
        return 0
    if action == "explain":
        a = _load_side(args.a, records_dir)
        b = _load_side(args.b, records_dir)
        changed, lines = explain(a, b)
        print(f"A: {a['source']}\nB: {b['source']}")
        print("\n".join(lines))
        print(f"changed factors: {', '.join(changed) if changed else 'none'}")
        return 0
    if action == "pin":
        side = _load_side(args.path, records_dir)
        found = {"aot": primary(side.get("keys", []), "aot"), "piecewise": primary(side.get("keys", []), "piecewise")}
        if not any(found.values()):
            raise UsageError(f"{args.path} holds no cache key to pin: pass a cache-key record or a cache directory")
        config = args.config or side.get("config")
        if not config:
            raise UsageError("this source does not say which config its key belongs to: pass --config")
        pins = Path(args.pins) if args.pins else default_pins_path()
        ident = pin_id(args.machine or side.get("machine"), config)
        write_pin(pins, ident, found, source=side["source"])
        print(f"pinned {found} for {ident} in {pins}")
        return 0
    from b70bench import device as devmod

    dev = devmod.select(args.backend, args.device_index)
    rows = measure(dev, shape=args.shape, pins_path=args.pins, machine=args.machine, auto_pin=not args.no_auto_pin,
                   records_dir=records_dir)
    print(records.format_table([_short(r) for r in rows], COLUMNS))
    if args.json:
        records.write_json(args.json, rows)
    return 0


def register(sub) -> None:
    from b70bench import cli

    p = sub.add_parser("cache-key", help="which compile-cache key vLLM chose, and why it changed",
                       description="Measure (one vLLM start on an empty cache), show, explain or pin vLLM's "
                                   "compile-cache keys.")
    p.add_argument("action", nargs="?", choices=["measure", "show", "explain", "pin"], default="measure")
    p.add_argument("a", nargs="?", help="show/pin: a cache dir, record or commit; explain: the first of two")
    p.add_argument("b", nargs="?", help="explain: the second cache dir, record or commit")
    p.add_argument("--shape", default=DEFAULT_SHAPE, help=f"decode shape of the probe run (default {DEFAULT_SHAPE})")
    p.add_argument("--pins", default=None, help=f"pins file (default: env {PINS_ENV}, else "
                                                f"cache-key-pins.json in the state directory, {state.HOME_ENV})")
    p.add_argument("--machine", default=None, help="machine name in pins (default: host name)")
    p.add_argument("--config", default=None, help="pin: the config id the key belongs to")
    p.add_argument("--no-auto-pin", action="store_true", help="do not pin the first key seen")
    p.add_argument("--records", default=None,
                   help=f"where per-commit cache-key records are saved and looked up (default: records/ in the "
                        f"state directory, {state.HOME_ENV}, else the asv project's results/)")
    cli.add_device_args(p)
    cli.add_json_arg(p)
    p.set_defaults(func=_dispatch)


def _dispatch(args) -> int:
    if args.action in ("show", "pin") and not args.a:
        raise UsageError(f"cache-key {args.action} needs a cache directory, record file or commit")
    if args.action == "explain" and not (args.a and args.b):
        raise UsageError("cache-key explain needs two: A B (cache dirs, record files or commits)")
    args.path = args.a
    return run(args)
