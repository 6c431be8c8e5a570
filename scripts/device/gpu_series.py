"""Series directories against the vLLM installed here (any version, e.g. vLLM 0.20.1 on a GPU), for `compare`:

    python3 scripts/device/gpu_series.py DEST [--reps N] [--size S]

DEST/base: the empty series (vLLM as installed). DEST/graph: `reps` size x size products per decoder layer and step
inside the compiled graph of MiniMax-M2 (patches.synthetic.with_graph_work: tokens unchanged). DEST/branch: a
default-off, env-gated branch in the attention (patches.synthetic.with_branch: same speed, another compile key).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from b70bench.patches import synthetic  # noqa: E402


def write(dest: str, reps: int, size: int) -> None:
    target = synthetic.installed_target()
    text = synthetic.installed_text(synthetic.MODEL_FILE)
    series = {
        "base": {},
        "graph": {
            "graph-work.patch": synthetic.diff(
                text,
                synthetic.with_graph_work(text, reps, size),
                f"In-graph work: {reps} {size}x{size} products per layer and step.",
                target=target,
            )
        },
        "branch": {
            "branch.patch": synthetic.diff(
                text, synthetic.with_branch(text), "A default-off branch in the attention.", target=target
            )
        },
    }
    for name, patches in series.items():
        d = os.path.join(dest, name)
        os.makedirs(d, exist_ok=True)
        for fname, body in patches.items():
            with open(os.path.join(d, fname), "w") as f:
                f.write(body)
        with open(os.path.join(d, "series"), "w") as f:
            f.write("".join(f"{n}\n" for n in patches))
    print(f"{dest}: base, graph ({reps} x {size}x{size}), branch against {target}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dest")
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--size", type=int, default=64)
    a = p.parse_args()
    write(a.dest, a.reps, a.size)
