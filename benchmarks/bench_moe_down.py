"""u4 MoE down projection (MiniMax M2.x, TP4): each variant's time, measured once per environment.

B70BENCH_MOE_VARIANTS=a,b measures only those variants (the others are skipped rows saying so),
for walks that follow one variant over many commits.
"""

import os

from b70bench import moe
from b70bench.errors import UsageError
from b70bench.moe import variants

from .common import select_device, skip_if

# Every registered variant, built-ins and installed plug-ins alike; one that cannot run here is skipped with its reason.
VARIANTS = list(variants.registry())


class MoeDown:
    """One suite run in setup_cache (every variant checked against float64 first); time and
    bandwidth are views of it. Decode shapes only: the CPU reference takes seconds beyond."""

    param_names = ["variant", "tokens"]
    params = [VARIANTS, [1, 4]]
    timeout = 900
    version = 1

    def setup_cache(self):
        dev = select_device()
        chosen = [v for v in os.environ.get("B70BENCH_MOE_VARIANTS", "").split(",") if v] or VARIANTS
        try:
            rows = moe.measure(
                dev, chosen, tokens=tuple(self.params[1]), tps=(4,), repeat=5 if dev.backend == "cpu" else 20
            )
        except UsageError as err:
            raise NotImplementedError(str(err)) from None
        return {(r["variant"], r["tokens"]): r for r in rows}

    def setup(self, cache, variant, tokens):
        row = cache.get((variant, tokens))
        skip_if(None if row else f"{variant} is not in B70BENCH_MOE_VARIANTS for this run")
        skip_if(row["skipped"] or (None if row["ok"] else f"{variant} failed its float64 check"))

    def track_time(self, cache, variant, tokens):
        return {"samples": cache[(variant, tokens)]["samples_s"], "number": 1}

    track_time.unit = "seconds"

    def track_bandwidth(self, cache, variant, tokens):
        return cache[(variant, tokens)]["gbps"]

    track_bandwidth.unit = "GB/s"
