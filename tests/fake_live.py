"""Stands in for b70bench.decode.live in tests: the same protocol on the reply descriptor, no vLLM.

It imports fakevllm's model file as its PYTHONPATH resolves it (an overlay, in the tests), runs 10%
"slower" when that file holds the patched text, and can fail to start (always, or once out of memory), die at a
call (SIGKILL, as kill -9 would) or leave a grandchild behind, as a crashed engine's workers would.
"""

import json
import os
import signal
import subprocess
import sys

from b70bench.decode.live import last_cpu, pin_from_env


def main(argv):
    with open(argv[1]) as f:
        spec = json.load(f)
    out = os.fdopen(int(argv[2]), "w", buffering=1)

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    if spec.get("fail_start"):
        print("RuntimeError: fake engine refused to start: " + spec["fail_start"], flush=True)
        reply({"ok": False, "error": "RuntimeError: " + spec["fail_start"]})
        return 1
    if spec.get("fail_wrapped"):  # vLLM's engine core: the cause in the log, a wrapper in the exception
        print("(EngineCore pid=1) ValueError: " + spec["fail_wrapped"], flush=True)
        reply({"ok": False, "error": "RuntimeError: Engine core initialization failed. See root cause above."})
        return 1
    if spec.get("oom_once") and not os.path.exists(spec["oom_once"]):  # the first start only, as a full device
        open(spec["oom_once"], "w").close()
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        reply({"ok": False, "error": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"})
        return 1
    if spec.get("grandchild"):
        subprocess.Popen(["sleep", "300"])
    import fakevllm.models.minimax_m2 as model

    with open(model.__file__) as f:
        slow = "k + q" in f.read()
    pin_from_env()  # after the start, as the real engine does, so the tests see where compare put it
    reply({"ready": True, "token_sha256": "ab" * 32, "module_file": model.__file__, "pid": os.getpid()})
    n = 0
    for line in sys.stdin:
        if line.strip() == "call":
            n += 1
            if spec.get("die_at_call") == n:
                os.kill(os.getpid(), signal.SIGKILL)
            latency = 0.1 * (1.1 if slow else 1.0) * (1 + 0.01 * (n % 3))
            reply({"probe_s": 0.01, "latency_s": latency, "tokens": 128, "cpu": last_cpu()})
        elif line.strip() == "stop":
            reply({"stopped": True})
            return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
