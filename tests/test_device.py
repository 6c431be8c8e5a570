import subprocess
import sys

import pytest
import torch

from b70bench import device
from b70bench.errors import UsageError


def test_cpu_is_the_fallback(monkeypatch):
    monkeypatch.delenv(device.ENV_BACKEND, raising=False)
    monkeypatch.setattr(device, "available", lambda b: b == "cpu")
    assert device.choose_backend() == "cpu"


def test_preference_order_is_xpu_then_cuda(monkeypatch):
    monkeypatch.delenv(device.ENV_BACKEND, raising=False)
    monkeypatch.setattr(device, "available", lambda b: b in ("cuda", "xpu", "cpu"))
    assert device.choose_backend() == "xpu"
    monkeypatch.setattr(device, "available", lambda b: b in ("cuda", "cpu"))
    assert device.choose_backend() == "cuda"


def test_env_var_overrides_and_flag_overrides_env(monkeypatch):
    monkeypatch.setenv(device.ENV_BACKEND, "cpu")
    assert device.choose_backend() == "cpu"
    monkeypatch.setenv(device.ENV_BACKEND, "nonsense")
    with pytest.raises(UsageError, match="unknown backend 'nonsense'"):
        device.choose_backend()
    assert device.choose_backend("CPU") == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_missing_backend_names_the_fix():
    with pytest.raises(UsageError) as err:
        device.choose_backend("cuda")
    assert "--backend cpu" in str(err.value)


def test_device_index_out_of_range():
    with pytest.raises(UsageError, match="out of range.*--device-index 0..0"):
        device.select("cpu", 1)
    with pytest.raises(UsageError, match="out of range"):
        device.select("cpu", -1)


def test_device_index_env_must_be_an_integer(monkeypatch):
    monkeypatch.setenv(device.ENV_INDEX, "first")
    with pytest.raises(UsageError, match="not an integer"):
        device.select("cpu")


def test_cpu_device_basics():
    dev = device.select("cpu")
    assert dev.torch_device == torch.device("cpu")
    assert dev.collective_backend == "gloo"
    assert not dev.has_events and not dev.has_graphs
    assert dev.memory_in_use() > 0  # the process's resident set
    with pytest.raises(UsageError, match="drop --graph"):
        dev.capture(lambda: None)


def test_elapsed_counts_every_call():
    dev = device.select("cpu")
    calls = []
    dev.elapsed(lambda: calls.append(1), number=7)
    assert len(calls) == 7


@pytest.mark.parametrize("args", [["--backend", "tpu"], ["--backend", "cuda"], ["--device-index", "9"]])
def test_cli_bad_input_is_one_line_exit_2(args):
    if args[-1] == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is present here")
    out = subprocess.run([sys.executable, "-m", "b70bench", "info", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert lines[0].startswith("b70bench info: error:")


def test_select_makes_the_chosen_gpu_current(monkeypatch):
    # Events record on the current device's stream; timing device 1 from device 0 read 121 TB/s once.
    class FakeCuda:
        current = 0

        def is_available(self):
            return True

        def device_count(self):
            return 2

        def set_device(self, i):
            FakeCuda.current = i

    fake = FakeCuda()
    monkeypatch.setattr(device, "_module", lambda b: fake if b != "cpu" else None)
    dev = device.select("cuda", 1)
    assert dev.index == 1 and FakeCuda.current == 1


def test_sigterm_unwinds_so_children_are_reaped(tmp_path):
    # A child started by a command must not outlive `kill <b70bench pid>`.
    import os
    import signal
    import time

    script = tmp_path / "hold.py"
    pidfile = tmp_path / "child.pid"
    script.write_text(
        "import subprocess, sys, time\n"
        "from b70bench import cli\n"
        "def hold(args):\n"
        "    p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"    open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "    try:\n"
        "        time.sleep(60)\n"
        "    finally:\n"
        "        p.kill(); p.wait()\n"
        "parser = cli.build_parser\n"
        "def build():\n"
        "    ap = parser(); sub = ap._subparsers._group_actions[0]\n"
        "    sub.add_parser('hold').set_defaults(func=hold); return ap\n"
        "cli.build_parser = build\n"
        "sys.exit(cli.main(['hold']))\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    child = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
