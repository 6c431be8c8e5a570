"""A tiny installed distribution with a real pip-written RECORD, to patch without touching vLLM.

The wheel is built by hand (zip + dist-info) and installed with `pip install --target`, so
the RECORD, its sha256 entries and the compiled bytecode are exactly what pip writes.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

MODEL = '''"""A stand-in for vllm/model_executor/models/minimax_m2.py."""

import os


class MiniMaxM2MoE:
    def __init__(self, config):
        self.experts = dict(
            num_experts=config["num_local_experts"],
            top_k=config["num_experts_per_tok"],
            scoring_func=config["scoring_func"],
            renormalize=True,
        )

    def forward(self, hidden_states):
        return hidden_states


class MiniMaxM2Attention:
    def forward(self, q, k):
        return q + k
'''


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(out: Path, name: str = "fakevllm", version: str = "0.32.0") -> Path:
    files = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        f"{name}/models/__init__.py": b"",
        f"{name}/models/minimax_m2.py": MODEL.encode(),
    }
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: b70bench-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(f"{p},{_digest(d)},{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def install(wheel: Path, site: Path) -> Path:
    # --compile and a bytecode-writing environment, so RECORD lists .pyc files as pip usually writes them.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--compile",
            "--no-deps",
            "--no-index",
            "--no-warn-script-location",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        timeout=120,
        env=env,
    )
    return site


def copy_site(src: Path, dst: Path) -> Path:
    """A copy that keeps mtimes, so copied bytecode stays valid for its source."""
    shutil.copytree(src, dst, copy_function=shutil.copy2)
    return dst


def model_path(site: Path, name: str = "fakevllm") -> Path:
    return site / name / "models" / "minimax_m2.py"


def write_patch(directory: Path, name: str, target: str, old: str, new: str, path: str, series: bool = True) -> Path:
    """A patch named name whose diff turns old into new at path, headed by a target line."""
    import difflib

    diff = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
    )
    directory.mkdir(parents=True, exist_ok=True)
    p = directory / name
    p.write_text(f"test patch {name}\n\nB70bench-Target: {target}\n\n" + "".join(diff))
    if series:
        with open(directory / "series", "a") as f:
            f.write(name + "\n")
    return p
