import json
import subprocess
import sys

import pytest

from b70bench import bandwidth, device, fingerprint


def test_copy_record_bandwidth_is_read_plus_written():
    dev = device.select("cpu")
    rec = bandwidth.measure(dev, 1 << 20, repeat=5, warmup=1)
    assert rec["wrong"] == 0
    assert rec["bandwidth_gbps"] == pytest.approx(2 * (1 << 20) / (rec["time_us"] * 1e-6) / 1e9)
    assert len(rec["samples_s"]) == 5


def test_copy_rejects_bad_size():
    with pytest.raises(ValueError, match="multiple of 4"):
        bandwidth.measure(device.select("cpu"), 6)


def test_fingerprint_has_the_fields_records_rely_on():
    fp = fingerprint.fingerprint(device.select("cpu"))
    for key in (
        "device",
        "device_count",
        "driver",
        "torch",
        "vllm",
        "triton",
        "collective_backend",
        "commit",
        "patch_set_hash",
        "date",
    ):
        assert key in fp
    assert fp["backend"] == "cpu" and fp["collective_backend"] == "gloo"


def test_info_json_lists_suites_and_anchor(tmp_path):
    out = tmp_path / "info.json"
    proc = subprocess.run(
        [sys.executable, "-m", "b70bench", "info", "--backend", "cpu", "--measure", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["suites"]["copy"] == {"runs": True, "reason": None}
    assert data["anchor"]["bandwidth_gbps"] > 0 and data["anchor"]["wrong"] == 0
    assert "copy" in proc.stdout and "collective_backend" in proc.stdout


def test_info_lists_every_suite_serve_included(tmp_path):
    """`info` names each suite of suites.SUITES, serve among them, with whether it runs here and why not."""
    from b70bench import serve, suites

    assert suites.SUITES["serve"] == "b70bench.serve"
    out = tmp_path / "info.json"
    proc = subprocess.run(
        [sys.executable, "-m", "b70bench", "info", "--backend", "cpu", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(out.read_text())["suites"]
    assert set(listed) == set(suites.installed()) and "serve" in listed
    reason = serve.unavailable_reason(device.select("cpu"))
    assert listed["serve"] == {"runs": reason is None, "reason": reason}
    assert any(line.startswith("serve ") for line in proc.stdout.splitlines())
