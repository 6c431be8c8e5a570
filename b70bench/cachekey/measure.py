"""The cache-key suite's measuring function and the record a decode run yields."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from pathlib import Path

from b70bench import records, state
from b70bench.cachekey.artifacts import find_keys, keys_from_paths, primary
from b70bench.cachekey.pins import default_pins_path, differs, pin_id, read_pins, write_pin
from b70bench.errors import Unavailable


def unavailable_reason(device) -> str | None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: the cache key is vLLM's (pip install '.[cpu]' or '.[cuda]')"
    from b70bench.stack import launch

    return launch.unavailable_reason(device)


DEFAULT_SHAPE = "p128n64"


def default_records_dir() -> Path:
    return state.records_dir()


def config_id(rec: dict) -> str:
    """What, besides the machine, a pinned key is valid for."""
    fp = rec.get("fingerprint") or {}
    return (
        f"{rec.get('model')}|{rec.get('dtype')}|tp{rec.get('tp')}|mml{rec.get('max_model_len')}"
        f"|vllm {fp.get('vllm')}|torch {fp.get('torch')}"
    )


def _env_factors() -> dict | None:
    """vLLM's raw env factors as this process sees them (the child inherits this environment)."""
    try:
        from vllm import envs

        return {k: str(v) for k, v in envs.compile_factors().items()}
    except Exception:
        return None


def measure(
    dev=None,
    *,
    shape: str = DEFAULT_SHAPE,
    pins_path: str | os.PathLike | None = None,
    machine: str | None = None,
    auto_pin: bool = True,
    records_dir: str | os.PathLike | None = None,
    runs: int = 0,
    decode_kwargs: dict | None = None,
) -> list[dict]:
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
        recs = decode.measure(
            shapes=[shape],
            runs=runs,
            cold=True,
            env={"VLLM_CACHE_ROOT": str(root)},
            device=dev,
            **(decode_kwargs or {}),
        )
        keys = find_keys(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    run = recs[-1]
    rec = from_decode_record(run, keys, pins_path=pins_path, machine=machine, auto_pin=auto_pin)
    if run.get("error"):  # the start failed: no key was chosen, and nothing is saved as if one had been
        rec.update(error=run["error"], log_path=run.get("log_path"))
        return [rec]
    save(rec, run, records_dir=records_dir, machine=machine)
    return [rec]


def save(rec: dict, run: dict, *, records_dir=None, machine: str | None = None) -> None:
    """Keep the record under records_dir/<machine>/<commit>/cachekey.json, for `explain COMMIT COMMIT`."""

    commit = (run.get("fingerprint") or {}).get("commit")
    if commit:
        out = Path(records_dir) if records_dir else default_records_dir()
        path = out / (machine or platform.node()) / commit / "cachekey.json"
        # One record a shape: a walk of several shapes keeps each (the page reads the key change of each).
        kept = [r for r in saved(path) if r.get("shape") != rec.get("shape")]
        records.write_json(path, [rec, *kept])


def saved(path: Path) -> list[dict]:
    """The records a cachekey.json holds ([] where none is, or it is not b70bench's)."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    got = data.get("records") if isinstance(data, dict) else data
    return [r for r in got if isinstance(r, dict)] if isinstance(got, list) else []


def saved_changes(commit: str, records_dir: Path | None = None) -> dict[str, dict]:
    """shape -> the key change saved for `commit` by a paired walk on any machine under records_dir (the page's key
    column: the walking machine's state directory holds what asv's figures cannot, the keys and the factor)."""
    out = Path(records_dir) if records_dir else default_records_dir()
    found: dict[str, dict] = {}
    for path in sorted(out.glob(f"*/{commit}/cachekey.json")):
        for rec in saved(path):
            if rec.get("key_change") and rec.get("shape"):
                found.setdefault(rec["shape"], rec["key_change"])
    return found


def described_keys(run: dict) -> list[dict]:
    """The keys a run chose (its `cache_keys`, as vLLM logged them), described from its `cache_dir` where that still
    holds them: a persistent cache directory also holds the keys of earlier commits, so the directory only adds
    descriptions (traced files, factors) of the logged keys; with nothing logged the directory is all there is."""
    keys = keys_from_paths(run.get("cache_keys") or [])
    chosen = {k["key"] for k in keys}
    if chosen and run.get("cache_dir") and Path(run["cache_dir"]).is_dir():
        described = [k for k in find_keys(run["cache_dir"]) if k["key"] in chosen]
        if {k["key"] for k in described} == chosen:
            keys = described
    elif not chosen and run.get("cache_dir") and Path(run["cache_dir"]).is_dir():
        keys = find_keys(run["cache_dir"])
    return keys


def from_decode_record(
    run: dict, keys: list[dict] | None = None, *, pins_path=None, machine: str | None = None, auto_pin: bool = True
) -> dict:
    """The cache-key record for a decode run that already happened (no extra vLLM start).

    keys: the described keys if the run's cache directory was read; else the keys vLLM logged,
    described from the run's cache directory where it still holds them.
    """

    keys = keys or described_keys(run)
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
        "cache-key",
        shape=run.get("shape"),
        config=config_id(run),
        machine=machine or platform.node(),
        aot_key=found["aot"],
        piecewise_key=found["piecewise"],
        pinned_aot_key=(pinned or {}).get("aot"),
        pinned_piecewise_key=(pinned or {}).get("piecewise"),
        aot_differs=d["aot"],
        piecewise_differs=d["piecewise"],
        pinned_now=pinned_now,
        pins_file=str(pins_path),
        cache_state=run.get("cache_state"),
        ok=run.get("ok"),
        error=run.get("error"),
        s_per_output_token=run.get("s_per_output_token"),
        samples_s_per_output_token=run.get("samples_s_per_output_token") or [],
        output_tok_per_s=run.get("output_tok_per_s"),
        token_sha256=run.get("token_sha256"),
        log_path=run.get("log_path"),
        keys=keys,
        env_factors=_env_factors(),
        config_fields={k: run.get(k) for k in ("model", "dtype", "tp", "max_model_len", "memory_fraction")},
        fingerprint=fp,
    )
