import os, sys, time, json, subprocess, shutil
d = sys.argv[1]; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
model = sys.argv[2]; n = int(sys.argv[3]); k = 3
env = dict(os.environ)
procs = []
for me in range(k):  # start one at a time: start-up is not what is compared
    procs.append(subprocess.Popen([sys.executable, "/tmp/il/worker.py", d, str(me), str(n), model], env=env,
                                  stdout=open(f"{d}/log-{me}", "w"), stderr=subprocess.STDOUT))
    while not os.path.exists(f"{d}/ready-{me}"):
        time.sleep(0.1)
        if procs[-1].poll() is not None: sys.exit("worker died")
for i in range(n):
    order = list(range(k)) if i % 2 == 0 else list(reversed(range(k)))
    for me in order:
        time.sleep(0.3)  # the previous worker's OpenMP threads spin 200 ms after its call (KMP_BLOCKTIME)
        open(f"{d}/go-{me}-{i}", "w").close()
        while not os.path.exists(f"{d}/done-{me}-{i}"):
            time.sleep(0.002)
for p in procs: p.wait()
res = [json.load(open(f"{d}/lat-{me}.json")) for me in range(k)]
mins = [min(r) / 512 * 1e3 for r in res]; meds = [sorted(r)[len(r)//2] / 512 * 1e3 for r in res]
print("min ms/tok", ["%.3f" % m for m in mins], "spread %.1f%%" % (100 * (max(mins) / min(mins) - 1)))
print("median ms/tok", ["%.3f" % m for m in meds], "spread %.1f%%" % (100 * (max(meds) / min(meds) - 1)))
