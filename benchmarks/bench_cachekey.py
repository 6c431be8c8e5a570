"""Compile-cache identity per commit: did vLLM choose a different compiled graph than the pinned one?

One vLLM start on an empty compile cache per commit and environment (setup_cache, shared by
both classes: asv keys it by this module-level function). 0 = the pinned key, 1 = another
key, so a change is an upward step on the regressions page. The probe's seconds per output
token ride along: same start, no extra cost. B70BENCH_CACHEKEY_SHAPE sets the probe shape.
"""

import math
import os

from b70bench import cachekey
from b70bench.errors import Unavailable

from .common import select_device, skip_if


def _probe(*_instance):  # bound or not, depending on how asv looks it up
    dev = select_device()
    skip_if(cachekey.unavailable_reason(dev))
    try:
        (rec,) = cachekey.measure(dev, shape=os.environ.get("B70BENCH_CACHEKEY_SHAPE") or cachekey.DEFAULT_SHAPE)
    except Unavailable as err:
        raise NotImplementedError(str(err)) from None
    return rec


_probe.timeout = 1800


def _value(rec, key):
    return math.nan if rec.get(key) is None else rec[key]


class CacheKey:
    """The AOT key (every backend with VLLM_USE_AOT_COMPILE) and the probe's decode speed."""

    timeout = 1800
    version = 1
    setup_cache = _probe

    def track_aot_key_differs_from_pin(self, rec):
        return _value(rec, "aot_differs")

    track_aot_key_differs_from_pin.unit = "changed"

    def track_s_per_output_token(self, rec):
        samples = rec.get("samples_s_per_output_token")
        return {"samples": samples, "number": 1} if samples else math.nan

    track_s_per_output_token.unit = "seconds"


class CacheKeyPiecewise:
    """The 10-hex piecewise key; vLLM writes it where its piecewise backend caches (CUDA, XPU)."""

    timeout = 1800
    version = 1
    setup_cache = _probe

    def setup(self, rec):
        if rec.get("piecewise_key") is None:
            raise NotImplementedError("vLLM chose no piecewise cache directory here (on the CPU it uses only "
                                      "the AOT cache)")

    def track_piecewise_key_differs_from_pin(self, rec):
        return _value(rec, "piecewise_differs")

    track_piecewise_key_differs_from_pin.unit = "changed"
