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
tokens per second. Two figures read it: against the parent's key (change.py: each move named at its own commit,
with the factor that moved it) and against the known-good key pinned for this machine and config (pins.py: "is this
still the graph we trust?").
"""

from __future__ import annotations

from b70bench.cachekey.artifacts import FACTORS_NAME, find_keys, keys_from_paths, primary, read_aot_artifact  # noqa: F401
from b70bench.cachekey.change import against_parent, from_sides  # noqa: F401
from b70bench.cachekey.change import line as change_line  # noqa: F401
from b70bench.cachekey.cli import register, run  # noqa: F401
from b70bench.cachekey.explain import explain, load_side  # noqa: F401
from b70bench.cachekey.measure import (  # noqa: F401
    DEFAULT_SHAPE,
    config_id,
    default_records_dir,
    described_keys,
    from_decode_record,
    measure,
    save,
    saved_changes,
    unavailable_reason,
)
from b70bench.cachekey.pins import PINS_ENV, default_pins_path, differs, pin_id, read_pins, write_pin  # noqa: F401
