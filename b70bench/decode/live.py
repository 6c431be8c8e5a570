"""One vLLM engine kept alive and timed on demand: `python -m b70bench.decode.live SPEC.json FD`.

Started by b70bench.pair in its own process group. It starts like child.py (engine, gate, warm-up)
and then answers commands read from stdin, one JSON line each, written to file descriptor FD (vLLM's
own output goes to the log on stdout/stderr, so the two never mix):

    call  -> the host probe, then one timed LLM.generate of the shape: {"probe_s", "latency_s", "tokens",
             "cpu"} (the core the engine's thread last ran on)
    stop  -> exits

The first line on FD is the start's result (gate hash, start time) with "ready": true, or
"ok": false and the error. Two of these, each importing its own patched vLLM (patches.overlay),
alternate calls so both sides are timed in the same seconds of the host.

B70BENCH_ENGINE_CPUS (e.g. "1" or "2,3") pins the engine's main thread, which runs the model, to those
cores once it has started, so both sides of a pair are timed on the same cores (pair.engine_cpus) while
their starts still run side by side on every core.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from b70bench.decode.child import start
from b70bench.stack.host import host_probe, peak_memory


def serve(spec: dict, reply) -> None:
    llm, result, tprompts, sp = start(spec)
    pin_from_env()
    result["ready"] = True
    result["pid"] = os.getpid()
    reply(result)
    # Stdin closes when the parent dies, however it died: the loop ends and the engine exits with it.
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "call":
            probe = host_probe(reps=1)
            t0 = time.perf_counter()
            outs = llm.generate(tprompts, sp, use_tqdm=False)
            latency = time.perf_counter() - t0
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            reply({"probe_s": probe, "latency_s": latency, "tokens": tokens, "cpu": last_cpu()})
        elif cmd == "stop":
            mem, scope = peak_memory()
            reply({"stopped": True, "peak_memory_bytes": mem, "peak_memory_scope": scope})
            return
        else:
            reply({"ok": False, "error": f"unknown command {cmd!r}"})


def last_cpu() -> int | None:
    """The core this process's main thread last ran on (/proc/self/stat field 39); None off Linux."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


def pin_from_env() -> None:
    """Pin the calling thread to B70BENCH_ENGINE_CPUS (threads it starts later inherit the mask)."""
    cpus = os.environ.get("B70BENCH_ENGINE_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    out = os.fdopen(int(argv[2]), "w", buffering=1)

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        serve(spec, reply)
    except BaseException as err:  # the parent waits for one line: it must come out whatever vLLM raised
        traceback.print_exc()
        reply({"ok": False, "error": f"{type(err).__name__}: {err}".splitlines()[0][:400]})
        return 1
    # Leave without the interpreter's teardown: an engine that has answered its last call has nothing left to
    # save (its compile cache was written at start), and vLLM's and torch's exit handlers took seconds a side,
    # paid by every block. The parent reaps the process group either way.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
