"""scripts/offline_vllm.py's mechanics on small wheels standing in for vLLM and its dependencies (no download):
the slimmed wheel, the dependencies the other machine lacks, parts split and reassembled, the package importable
from the target folder, and the refusals for a missing or altered part."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "offline_vllm.py"


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], requires: list[str]) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD with hashes) of pure-Python files."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    tags = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = {**files, f"{dist}/METADATA": meta.encode(), f"{dist}/WHEEL": tags}
    record = []
    for path, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    entries[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in entries.items():
            z.writestr(path, data)
    return out


def run(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def packed(tmp_path):
    """fakevllm (with a 'big extension' under vllm_flash_attn/ to drop) needing fakedep (lacking there), numpy
    (there) and torch (skipped by default); fakedep needs fakeleaf (lacking there too, one level down)."""
    index = tmp_path / "index"
    index.mkdir()
    big = os.urandom(300_000)  # incompressible: the bundle's parts are then several
    make_wheel(
        index,
        "fakevllm",
        "0.20.1",
        {
            "fakevllm/__init__.py": b"from fakedep import VALUE\nVERSION = '0.20.1'\n",
            "fakevllm/vllm_flash_attn/_big.so": big,
            "fakevllm/kept.so": os.urandom(200_000),
        },
        ["fakedep>=1.0", "numpy", "torch==2.11.0", 'windowsonly; sys_platform == "win32"'],
    )
    dep = {"fakedep/__init__.py": b"from fakeleaf import LEAF\nVALUE = LEAF + 1\n"}
    make_wheel(index, "fakedep", "1.2", dep, ["fakeleaf"])
    make_wheel(index, "fakeleaf", "3.0", {"fakeleaf/__init__.py": b"LEAF = 41\n"}, [])
    have = tmp_path / "have.txt"
    have.write_text("numpy==2.5.2\npip==26.0\n")
    out = tmp_path / "parts"
    wheel = next(index.glob("fakevllm-*.whl"))
    done = run(
        "pack", "--wheel", str(wheel), "--have", str(have), "--out", str(out), "--part-mib", "0.1",
        "--drop", "fakevllm/vllm_flash_attn/*.so", "--deps-before", "none",
        "--pip-arg=--no-index", f"--pip-arg=--find-links={index}",
        env_extra={"PIP_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stdout


def test_pack_splits_and_install_reassembles_an_importable_package(packed, tmp_path):
    out, printed = packed
    manifest = json.loads((out / "parts.json").read_text())
    assert len(manifest["parts"]) >= 2, manifest["parts"]
    assert all(p["bytes"] <= int(0.1 * 2**20) for p in manifest["parts"])
    assert sum(p["bytes"] for p in manifest["parts"]) == manifest["bundle"]["bytes"]
    assert manifest["dropped"] == ["fakevllm/vllm_flash_attn/_big.so"]
    assert {d["name"] for d in manifest["dependencies"]} == {"fakedep", "fakeleaf"}
    left = {d["name"]: d["why"] for d in manifest["left_out"]}
    assert left["numpy"].startswith("there") and left["torch"].startswith("skipped"), left
    assert "windowsonly" not in left and "windowsonly" not in printed  # its marker is false on the target

    target = tmp_path / "site"
    done = run("install", "--parts", str(out), "--target", str(target))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"export PYTHONPATH={target.resolve()}" in done.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import fakevllm; print(fakevllm.VERSION, fakevllm.VALUE)"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path,
    )  # fmt: skip
    assert probe.stdout.split() == ["0.20.1", "42"], probe.stderr
    assert not (target / "fakevllm" / "vllm_flash_attn" / "_big.so").exists()
    assert (target / "fakevllm" / "kept.so").stat().st_size == 200_000
    record = next(target.glob("fakevllm-*.dist-info")).joinpath("RECORD").read_text()
    assert "_big.so" not in record and "kept.so" in record  # what pip and b70bench's patches read agrees with disk


def test_install_refuses_a_missing_or_altered_part_in_one_line(packed, tmp_path):
    out, _ = packed
    parts = sorted(out.glob("bundle.tar.xz.part-*"))
    last = parts[-1].read_bytes()
    parts[-1].unlink()
    done = run("install", "--parts", str(out), "--target", str(tmp_path / "site"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "1 parts missing" in done.stderr and parts[-1].name in done.stderr
    parts[-1].write_bytes(last[:-1] + bytes([last[-1] ^ 1]))
    done = run("install", "--parts", str(out), "--target", str(tmp_path / "site"))
    assert done.returncode == 2 and "copy it again" in done.stderr, done.stderr
    assert not (tmp_path / "site").exists()


def test_pack_refuses_bad_input_in_one_line(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for args, words in (
        (["--wheel", str(tmp_path / "nope.whl"), "--out", str(tmp_path / "o1")], "not a wheel file"),
        (["--wheel", "x.whl", "--out", str(tmp_path / "full")], "not empty"),
        (["--wheel", "x.whl", "--have", str(tmp_path / "none.txt"), "--out", str(tmp_path / "o2")], "no such file"),
    ):
        done = run("pack", *args)
        assert done.returncode == 2 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr
