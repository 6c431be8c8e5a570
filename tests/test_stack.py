"""The stack description: what a file says reaches every start, bad files are refused in one line, auto placement
and the gate key follow the stack, and `compare --plan` says what would run without running it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from b70bench import children
from b70bench.errors import UsageError
from b70bench.paired import placement
from b70bench.stack import description, gate, launch

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path, text: str, name: str = "rig.toml") -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    path = tmp_path / name
    path.write_text(text)
    return path


RIG = """
name = "b70-tp4"
backend = "xpu"
devices = [0, 1, 2, 3]
model = "./model"
tp = 4
quantization = "auto-round"
max_model_len = 4096
memory_fraction = 0.9
start_timeout_s = 1200
shapes = ["p512n1536"]
env_file = "promoted-env.sh"
env_unset = ["VLLM_XPU_OLD"]
server_args = ["--max-num-seqs", "16"]

[env]
VLLM_USE_FLAG = "1"

[engine_args]
enforce_eager = false
"""


def test_a_rig_stack_reaches_the_engine_spec_and_environment(tmp_path):
    (tmp_path / "promoted-env.sh").write_text("export VLLM_PROMOTED=1\nVLLM_USE_FLAG=0\n")
    st = description.load(write(tmp_path, RIG))
    assert st.name == "b70-tp4" and st.model == str((tmp_path / "model").resolve()) and st.tp == 4
    spec = st.engine_spec("p512n1536")
    assert spec["tp"] == 4 and spec["max_model_len"] == 4096 and spec["memory_fraction"] == 0.9
    assert spec["engine_args"] == {"enforce_eager": False, "quantization": "auto-round"}
    env = st.process_env({"VLLM_XPU_OLD": "1", "PATH": "/bin"}, "xpu")
    # The env file first, then the table (its VLLM_USE_FLAG wins), less what the stack unsets, its devices visible.
    assert env["VLLM_PROMOTED"] == "1" and env["VLLM_USE_FLAG"] == "1" and "VLLM_XPU_OLD" not in env
    assert env["ZE_AFFINITY_MASK"] == "0,1,2,3" and "CUDA_VISIBLE_DEVICES" not in env and env["PATH"] == "/bin"
    assert st.process_env({}, "cuda")["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    # Nothing of the CPU's: no pinning, KV size or preload comes from the stack on a GPU or XPU.
    assert not {"VLLM_CPU_KVCACHE_SPACE", "LD_PRELOAD", "OMP_NUM_THREADS"} & set(env)
    key = st.gate_key("xpu:Intel Arc Pro B70", "0.20.1")
    assert key["quantization"] == "auto-round" and key["tp"] == 4 and key["model"] == st.model
    assert "auto-round" in gate.describe(key)


def test_one_builder_gives_each_kind_of_start_its_environment(tmp_path):
    """launch.run_env: an offline engine, paired engines and a server differ only where they must, and what the
    caller or the stack set wins over every default."""
    cpu = description.default()
    solo = launch.run_env(cpu, "cpu", environ={})
    paired = launch.run_env(cpu, "cpu", paired=True, environ={"B70BENCH_PAIR_CPUS": "none"})
    pinned = launch.run_env(cpu, "cpu", paired=True, environ={})
    server = launch.run_env(cpu, "cpu", role=launch.SERVER, environ={})
    # The engine core in the calling process for offline engines only; the fixed KV cache for two at a time.
    assert solo["VLLM_ENABLE_V1_MULTIPROCESSING"] == paired["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server and "VLLM_CPU_KVCACHE_SPACE" not in solo
    assert paired["VLLM_CPU_KVCACHE_SPACE"] == server["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert pinned["B70BENCH_ENGINE_CPUS"] == launch.engine_cpus({}) and pinned["OMP_NUM_THREADS"] == "1"
    assert "B70BENCH_ENGINE_CPUS" not in paired and "B70BENCH_ENGINE_CPUS" not in server
    mine = launch.run_env(
        cpu, "cpu", paired=True, environ={"VLLM_CPU_KVCACHE_SPACE": "4"}, extra={"KMP_BLOCKTIME": "0"}
    )
    assert mine["VLLM_CPU_KVCACHE_SPACE"] == "4" and mine["KMP_BLOCKTIME"] == "0"
    # A rig's stack on its GPU: its own variables and devices, nothing of the CPU's.
    (tmp_path / "promoted-env.sh").write_text("export VLLM_PROMOTED=1\n")
    rig = description.load(write(tmp_path, RIG))
    gpu = launch.run_env(rig, "cuda", paired=True, environ={"PATH": "/bin"})
    assert gpu == {"PATH": "/bin", "VLLM_PROMOTED": "1", "VLLM_USE_FLAG": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    start = launch.start_env(gpu, tmp_path / "cache", rig.embedded)
    assert start["VLLM_CACHE_ROOT"] == str(tmp_path / "cache") and start["PYTHONPATH"] == str(ROOT)
    with pytest.raises(ValueError, match="role"):
        launch.run_env(cpu, "cpu", role="worker")


def test_the_default_is_the_embedded_model_and_old_pins_still_match(tmp_path):
    st = description.default()
    assert st.embedded and st.tp == 1 and st.vllm_dtype() == "bfloat16"
    key = st.gate_key("cpu:avx2", "0.32.0")
    old = {k: v for k, v in key.items() if k != "quantization"}  # a pin written before stacks had quantization
    pins = tmp_path / "gates.json"
    pins.write_text(json.dumps({"gates": [{**old, "token_sha256": "ab"}]}))
    assert gate.pinned(key, pins) == "ab"
    assert gate.pinned({**key, "quantization": "int4"}, pins) is None  # another stack's numerics: not this pin


def test_a_stack_files_gate_pins_live_beside_it_not_in_the_package(tmp_path):
    st = description.load(write(tmp_path, 'model = "./model"'))
    assert st.gate_file == str(tmp_path.resolve() / "gates.json")
    named = description.load(write(tmp_path, 'name = "x"\ngate_file = "pins/lab.json"', "named.toml"))
    assert named.gate_file == str(tmp_path.resolve() / "pins" / "lab.json")
    assert named.hash() == description.load(write(tmp_path, 'name = "x"', "plain.toml")).hash()  # where pins are kept
    assert description.default().gate_file is None  # the embedded model's pins ship with the package
    key = st.gate_key("cuda:NVIDIA H100 80GB HBM3", "0.20.1")
    before = gate.GATES_FILE.read_text()
    gate.accept(key, "cd" * 32, st.gate_file)
    assert gate.pinned(key, st.gate_file) == "cd" * 32 and gate.GATES_FILE.read_text() == before
    shown = b70bench("stack", "show", str(tmp_path / "rig.toml"), "--backend", "cpu")
    assert shown.returncode == 0, shown.stderr
    assert "no pin" in shown.stdout  # the pin above is for a GPU; the CPU's key is not pinned beside this file


@pytest.mark.parametrize(
    "text, words",
    [
        ("tp = [", "not valid TOML"),
        ("modle = './model'", "unknown key 'modle'"),
        ("tp = '4'", "tp = '4' should be a int"),
        ("tp = 0", "tp = 0: 1 or more"),
        ("model = './missing'", "model directory"),
        ("backend = 'rocm'", "backend 'rocm'"),
        ("memory_fraction = 1.5", "memory_fraction = 1.5"),
        ("devices = []", "devices = []"),
        ("env_file = 'nope.sh'", "cannot read env file"),
        ("shapes = ['512x512']", "bad shape '512x512'"),
        ("[env]\nX = [1]", "env.X should be a string"),
    ],
)
def test_a_bad_stack_file_is_one_line_naming_the_fix(tmp_path, text, words):
    with pytest.raises(UsageError) as err:
        description.load(write(tmp_path, text))
    assert words in str(err.value) and "\n" not in str(err.value), err.value


def test_a_missing_file_and_the_environment_variable(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        description.load(tmp_path / "none.toml")
    path = write(tmp_path, "model = './model'\ntp = 2\n", "cpu2.toml")
    assert description.from_env({description.ENV_VAR: str(path)}).tp == 2
    assert description.from_env({}).embedded


def test_devices_the_machine_lacks_and_tp_above_them_are_refused(tmp_path):
    st = description.load(write(tmp_path, "backend = 'cuda'\ndevices = [0, 1]\ntp = 4\nmodel = './model'\n"))
    with pytest.raises(UsageError, match="tp 4 is larger than the 2 cuda device"):
        st.check_devices("cuda", 8)
    with pytest.raises(UsageError, match="sees 1 cuda device"):
        st.check_devices("cuda", 1)
    with pytest.raises(UsageError, match="names backend cuda, this run is on cpu"):
        st.check_devices("cpu", 1)
    two = description.load(write(tmp_path, "tp = 2\nmodel = './model'\n", "two.toml"))
    two.check_devices("cpu", 1)  # the CPU's TP ranks share the host's cores
    with pytest.raises(UsageError, match="tp 2 is larger than the 1 xpu"):
        two.check_devices("xpu", 1)


def test_auto_places_together_only_where_two_processes_fit(tmp_path):
    cpu = description.default()
    assert placement.choose("auto", "cpu", cpu)[0] == placement.TOGETHER  # ~2.5 GiB each
    fits, why = cpu.two_fit("cpu", mem_available_gib=4.0)
    assert not fits and "exceed the 4.0 GiB" in why
    gpu = description.load(write(tmp_path, "model = './model'\nmemory_fraction = 0.9\n"))
    where, why = placement.choose("auto", "cuda", gpu)
    assert where == placement.ALTERNATE and "0.9 + 0.9" in why
    half = description.load(write(tmp_path, "model = './model'\nmemory_fraction = 0.45\n", "half.toml"))
    assert placement.choose("auto", "xpu", half)[0] == placement.TOGETHER
    unset = description.load(write(tmp_path, "model = './model'\n", "unset.toml"))
    assert placement.choose("auto", "cuda", unset) == (
        placement.ALTERNATE,
        "auto: the stack sets no memory_fraction, so each cuda process takes vLLM's default 0.9",
    )
    assert placement.choose("together", "cuda", gpu) == (placement.TOGETHER, "--placement together")


def b70bench(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "b70bench", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_compare_plan_prints_what_would_run_and_starts_nothing(tmp_path):
    path = write(tmp_path, "name = 'tp2'\nmodel = './model'\ntp = 2\nkv_cache_gib = 2\n[env]\nMY_FLAG = 'on'\n")
    got = b70bench("compare", "HEAD", "HEAD", "--stack", str(path), "--plan", "--placement", "alternate")
    assert got.returncode == 0, got.stderr
    out = got.stdout
    assert "stack tp2" in out and "tp 2" in out and "placement: alternate (--placement alternate)" in out
    for side in "AB":
        line = next(x for x in out.splitlines() if x.startswith(f"  side {side} environment"))
        assert "MY_FLAG=on" in line and "VLLM_CPU_KVCACHE_SPACE=2" in line and f"vllm-cache-{side}" in line
        assert "B70BENCH_ENGINE_CPUS" not in line  # TP ranks are bound by vLLM, not pinned to one core
    assert "one uncounted start per side" in out and "first look after 6 blocks" in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--stack", "missing.toml"], "does not exist"),
        (["--max-starts", "3"], "--max-starts 3"),
    ],
)
def test_compare_refuses_bad_stack_input_with_exit_2(args, words):
    got = b70bench("compare", "HEAD", "HEAD", "--plan", *args)
    assert got.returncode == 2 and words in got.stderr and got.stderr.count("\n") == 1, got.stderr


def test_a_gpu_stack_on_a_machine_without_one_is_refused(tmp_path):
    path = write(tmp_path, "backend = 'cuda'\nmodel = './model'\n")
    got = b70bench("compare", "HEAD", "HEAD", "--plan", "--stack", str(path))
    assert got.returncode == 2 and "cuda" in got.stderr and got.stderr.count("\n") == 1, got.stderr


def test_revisions_refuses_a_gpu_stack_on_an_environment_without_that_device(tmp_path):
    """The walk on a GPU/XPU rig is `revisions` on that rig's environment; a CPU build there is refused before any
    commit is applied."""
    path = write(tmp_path, "backend = 'xpu'\nmodel = './model'\n")
    got = b70bench("revisions", "HEAD", "--stack", str(path))
    assert got.returncode == 2 and "has no xpu device (a CPU build?)" in got.stderr, got.stderr
    assert got.stderr.count("\n") == 1


def test_a_revisions_walk_pairs_each_commit_as_asv_does(monkeypatch):
    """asv gives an existing environment no ASV_COMMIT; `revisions` sets B70BENCH_COMMIT per commit, and the adapters
    pair on it as on ASV_COMMIT (they measured separate starts there before)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import common

    monkeypatch.delenv("ASV_COMMIT", raising=False)
    monkeypatch.delenv("B70BENCH_COMMIT", raising=False)
    assert not common.paired_walk(None, "B70BENCH_DECODE_PAIRED")
    monkeypatch.setenv("B70BENCH_COMMIT", "ab" * 20)
    assert common.walked_commit() == "ab" * 20 and common.paired_walk(None, "B70BENCH_DECODE_PAIRED")
    monkeypatch.setenv("B70BENCH_DECODE_PAIRED", "0")
    assert not common.paired_walk(None, "B70BENCH_DECODE_PAIRED")


def test_a_stack_that_states_its_costs_sizes_the_budget_and_refuses_one_that_cannot_decide(tmp_path):
    """The seeds' rig (a warm start ~4 min, a call ~3 s, alternate): the plan says what the first look costs and
    sizes the default budget to reach it and one doubling; a named budget short of the first look is refused in one
    line with the budget that reaches it; a cost that is not positive seconds is refused at load."""
    stack = write(tmp_path, 'backend = "cpu"\nmodel = "./model"\nstart_s = 240\ncall_s = 3\nshapes = ["p512n256"]\n')
    plan = b70bench("compare", "HEAD", "HEAD", "--stack", str(stack), "--placement", "alternate", "--rounds", "16",
                    "--plan")  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    # 2 sides x (240 s + 19 calls x 3 s) x (6 blocks + the uncounted warm pair) = 4158 s.
    assert "the first look ~69 min (6 blocks" in plan.stdout and "budget: 139 min" in plan.stdout, plan.stdout
    short = b70bench("compare", "HEAD", "HEAD", "--stack", str(stack), "--placement", "alternate", "--rounds", "16",
                     "--budget", "30", "--plan")  # fmt: skip
    assert short.returncode == 2 and "does not reach a first look" in short.stderr
    assert "pass --budget 70 or more" in short.stderr and short.stderr.count("\n") == 1
    unknown = b70bench("compare", "HEAD", "HEAD", "--plan")
    assert "cost: unknown" in unknown.stdout and "budget: 10 min" in unknown.stdout
    with pytest.raises(UsageError, match="start_s = 0: seconds"):
        description.load(write(tmp_path, 'model = "./model"\nstart_s = 0\n', "zero.toml"))


def test_an_engine_goes_with_the_process_that_started_it(tmp_path):
    """stack.children.guarded: while its starter lives, a module runs as `python -m` would (its arguments, its exit
    status) and stays up; once the starter is SIGKILLed (asv at its timeout), its whole session is gone, a worker it
    started included, within a few seconds."""
    import signal
    import time

    ROOT = Path(__file__).resolve().parent.parent
    done = subprocess.run(children.guarded(sys.executable, "json.tool", "--sort-keys"), input='{"b": 1, "a": 2}',
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.index('"a"') < done.stdout.index('"b"')
    bad = subprocess.run(
        children.guarded(sys.executable, "json.tool", "--no-such-flag"), capture_output=True, timeout=60
    )
    assert bad.returncode == 2
    # An "engine" that starts a worker in its own group, as vLLM's engine core is, then serves until stopped.
    engine = tmp_path / "engine.py"
    engine.write_text(
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(w.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    starter = (
        "import subprocess, sys\n"
        "from b70bench import children\n"
        f"p = subprocess.Popen(children.guarded(sys.executable, 'engine'), cwd={str(tmp_path)!r}, "
        "start_new_session=True, stdout=subprocess.PIPE, text=True)\n"
        "print(p.pid, p.stdout.readline().strip(), flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pgid, worker = (int(x) for x in proc.stdout.readline().split())
        time.sleep(2.0)  # the starter alive: nothing is stopped
        assert sorted(children.group_members(pgid)) == sorted([pgid, worker])
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while children.group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children.group_members(pgid) == []
    finally:
        proc.kill()
        children.kill_group(pgid, grace_s=1.0)
