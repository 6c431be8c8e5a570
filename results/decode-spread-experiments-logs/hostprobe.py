"""Host-speed probe: a fixed CPU-bound job timed every ~2 s on an otherwise idle VM (no vLLM running)."""
import json, os, sys, time
import numpy as np
a = np.random.default_rng(0).standard_normal((384, 384), dtype=np.float32)
def job():
    t0 = time.perf_counter(); s = 0
    for i in range(300000): s += i * i
    t1 = time.perf_counter()
    for _ in range(20): a @ a
    return t1 - t0, time.perf_counter() - t1
out = []
end = time.time() + float(sys.argv[1])
while time.time() < end:
    py = min(job()[0] for _ in range(3)); mm = min(job()[1] for _ in range(3))
    out.append({"t": time.time(), "python_s": py, "matmul_s": mm, "load": os.getloadavg()[0]})
    time.sleep(1.5)
json.dump(out, open(sys.argv[2], "w"))
p = [o["python_s"] for o in out]; m = [o["matmul_s"] for o in out]
print(f"n={len(out)} python min {min(p)*1e3:.2f} max {max(p)*1e3:.2f} ms spread {100*(max(p)/min(p)-1):.1f}%; matmul min {min(m)*1e3:.2f} max {max(m)*1e3:.2f} spread {100*(max(m)/min(m)-1):.1f}%")
