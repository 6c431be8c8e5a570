"""Decode suite without vLLM: log parsing, the gate, the checkpoint, shapes and engine arguments, hooks.

The runner and measure()'s bookkeeping are in test_decode_runner.py."""

import hashlib
import json
import textwrap

import numpy as np
import pytest

from b70bench.decode import hooks
from b70bench.errors import UsageError
from b70bench.stack import environment, gate, logs, model, shapes

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
    # A TP worker killed during a start: vLLM logs its death, then the caller raises "cancelled": the death is it.
    killed = textwrap.dedent("""\
        (EngineCore pid=2) ERROR 12-05 [multiproc_executor.py:316] Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.
        Traceback (most recent call last):
        RuntimeError: cancelled
        """)  # noqa: E501
    assert logs.failure_reason(killed) == "Worker proc VllmWorker-1 died unexpectedly (exit code: -9)"


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
    assert shapes.parse_shape("p512n1536") == (512, 1536, 1)
    assert shapes.parse_shape("P16N8B4") == (16, 8, 4)
    assert shapes.shape_name(512, 512, 1) == "p512n512b1"
    for bad in ("512x512", "p0n5", "p5"):
        with pytest.raises(UsageError, match="p512n512"):
            shapes.parse_shape(bad)
    f = tmp_path / "flags.env"
    f.write_text("# lab flags\nexport VLLM_A=1\nB='two words'\n\n")
    assert environment.read_env_file(f) == {"VLLM_A": "1", "B": "two words"}
    f.write_text("not a line\n")
    with pytest.raises(UsageError, match="flags.env:1"):
        environment.read_env_file(f)
    assert shapes.parse_engine_args(["enforce_eager=true", "block-size=64", "kv_cache_dtype=fp8"]) == {
        "enforce_eager": True,
        "block_size": 64,
        "kv_cache_dtype": "fp8",
    }
    with pytest.raises(UsageError):
        shapes.parse_engine_args(["novalue"])


def test_hook_plugin_dir_registers_vllm_general_plugins(tmp_path):
    from importlib.metadata import distributions

    d = hooks.write_plugin_dir(tmp_path, ["scale-attention", "pkg.mod:fn"])
    (dist,) = [x for x in distributions(path=[str(d)])]
    eps = {ep.name: ep.value for ep in dist.entry_points if ep.group == "vllm.general_plugins"}
    assert sorted(eps.values()) == ["b70bench.decode.hooks:scale_attention_output", "pkg.mod:fn"]
    with pytest.raises(UsageError):
        hooks.resolve("nonsense")


def test_the_embedded_defaults_pins_are_written_to_the_state_directory_never_the_package(tmp_path, monkeypatch):
    """Without a stack file, --accept-gate writes the state directory's gates.json (a reinstall keeps it, the package
    stays as shipped); reading takes that file first, then the shipped pins."""
    monkeypatch.setenv("B70BENCH_HOME", str(tmp_path / "home"))
    shipped = json.loads(gate.GATES_FILE.read_text())["gates"][0]
    k = {name: shipped[name] for name in shipped if name not in ("token_sha256", "accepted", "note")}
    before = gate.GATES_FILE.read_text()
    assert gate.pinned(k) == shipped["token_sha256"]  # the shipped pin, read
    other = {**k, "backend": "cpu:amx_bf16"}
    assert gate.pinned(other) is None and gate.accept(other, "ee" * 32) is None
    assert gate.pinned(other) == "ee" * 32 and gate.user_file() == tmp_path / "home" / "gates.json"
    assert gate.accept(k, "ff" * 32) == shipped["token_sha256"]  # re-pinned here: the state directory's wins
    assert gate.verdict(k, "ff" * 32)[0] == gate.PASS and gate.GATES_FILE.read_text() == before
