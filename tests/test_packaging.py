"""The project builds as asv builds it for every commit (`pip wheel --no-deps`), with no deprecation pending.

setuptools announced that pyproject's `license = { text = ... }` table stops building after 2027-02-18; a
warning today is a fresh clone (and every asv environment of a commit) that cannot install then."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_builds_without_deprecation_and_states_its_license(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "is deprecated" not in out and "DeprecationWarning" not in out, out[-4000:]
    (wheel,) = tmp_path.glob("b70bench-*.whl")
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta, meta[:1000]
