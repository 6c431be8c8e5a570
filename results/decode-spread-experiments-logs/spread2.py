"""Interleaved experiment: rounds x configs, one warm run each; wait for a quiet machine before each run."""
import json, os, subprocess, sys, time
sys.path.insert(0, "/tmp/exp")
from b70bench.decode import suite

def busy_share(dt=3.0):
    def j():
        v = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
        return sum(v), v[3] + v[4]
    t0, i0 = j(); time.sleep(dt); t1, i1 = j()
    return 1 - (i1 - i0) / max(1, t1 - t0)

def wait_quiet(limit_s=300):
    t0 = time.time()
    while True:
        b = busy_share()
        if b < 0.05 or time.time() - t0 > limit_s:
            top = subprocess.run(["ps", "-eo", "pid,etime,pcpu,comm", "--sort=-pcpu"], capture_output=True, text=True).stdout.splitlines()[1:4]
            print(f"[{time.strftime('%H:%M:%S')}] busy={b:.3f} waited={time.time()-t0:.0f}s load={os.getloadavg()[0]:.2f} top={[' '.join(l.split()) for l in top]}", flush=True)
            return b

configs = json.loads(sys.argv[1])
rounds = int(sys.argv[2])
tag = sys.argv[3]
out = []
for rnd in range(rounds):
    for name, env, extra in configs:
        busy = wait_quiet()
        (rec,) = suite.measure(["p512n512"], runs=1, cold=False, iterations=20, env=env, out_dir=f"/tmp/exp/{tag}-{name}-{rnd}", **extra)
        print(f"  {name} r{rnd}: s/tok min={rec['s_per_output_token']} med={rec['s_per_output_token_median']} foreign={rec.get('foreign_cpu_share')} wall={rec['wall_s']:.0f} kv={rec['kv_cache_tokens']} err={rec['error']}", flush=True)
        out.append({"name": name, "round": rnd, "busy_before": busy, **{k: rec.get(k) for k in ("s_per_output_token", "s_per_output_token_median", "foreign_cpu_share", "wall_s", "kv_cache_tokens", "samples_s_per_output_token", "start_s")}})
        json.dump(out, open(f"/tmp/exp/{tag}.json", "w"))
for name, *_ in configs:
    v = [o["s_per_output_token"] for o in out if o["name"] == name and o["s_per_output_token"]]
    m = [o["s_per_output_token_median"] for o in out if o["name"] == name and o["s_per_output_token_median"]]
    if v:
        print(f"== {name}: min {[round(x*1e3,4) for x in v]} spread {100*(max(v)/min(v)-1):.1f}% | median {[round(x*1e3,4) for x in m]} spread {100*(max(m)/min(m)-1):.1f}%", flush=True)
