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

from b70bench.cachekey.artifacts import FACTORS_NAME, find_keys, keys_from_paths, primary, read_aot_artifact  # noqa: F401
from b70bench.cachekey.cli import register, run  # noqa: F401
from b70bench.cachekey.explain import explain, load_side  # noqa: F401
from b70bench.cachekey.measure import (  # noqa: F401
    DEFAULT_SHAPE,
    config_id,
    default_records_dir,
    from_decode_record,
    measure,
    save,
    unavailable_reason,
)
from b70bench.cachekey.pins import PINS_ENV, default_pins_path, differs, pin_id, read_pins, write_pin  # noqa: F401
