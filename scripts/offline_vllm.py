#!/usr/bin/env python3
"""vLLM for a machine without network: pack it where the package index is reachable, install it there from parts.

    # where the package index is reachable (HAVE: `python3 -m pip list --format=freeze` of the other machine)
    python3 scripts/offline_vllm.py pack --version 0.20.1 --have HAVE --out DIR [--part-mib 58]
    # on the machine without network, once every part of DIR is there
    python3 scripts/offline_vllm.py install --parts DIR --target SITE
    export PYTHONPATH=SITE

`pack` downloads the vLLM wheel for the other machine's Python and platform (or takes `--wheel FILE`), leaves out
the files that `--drop` names (by default the FlashAttention and FlashMLA extension modules and DeepGEMM's sources:
then pick the Triton attention backend, VLLM_ATTENTION_BACKEND=TRITON_ATTN), and downloads as wheels every
dependency it needs that HAVE does not already satisfy, less the packages `--skip` names (by default torch and
the optional CUDA kernel libraries vLLM imports only where used). It writes one xz-compressed tar of those wheels
split into parts of at most `--part-mib` MiB, and `parts.json`, which names each part with its SHA-256. Carry the
parts over in as many trips as the link allows, `parts.json` with any of them.

`install` checks that every part is there and unaltered, reassembles the bundle and installs its wheels into
`--target` with that machine's pip (no index, no dependency resolution), leaving that machine's own packages as
they are. Standard library and pip only, on both ends.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

try:  # pip vendors packaging, so `pack` needs nothing beyond pip
    from packaging.markers import Marker  # noqa: F401  (imported for its availability check)
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pragma: no cover - depends on the interpreter
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

# Extension modules vLLM's CUDA wheel ships that the Triton attention backend does not need: FlashAttention 2 (190 MB
# unpacked), FlashMLA, DeepGEMM's headers and module (FP8 GEMMs on Hopper and later). FlashAttention 3 stays: on
# CUDA, vLLM 0.20.1 imports vllm.vllm_flash_attn when a model file loads, and that package refuses to import
# without one of the two extensions.
DEFAULT_DROP = (
    "vllm/vllm_flash_attn/_vllm_fa2_C*.so",
    "vllm/_flashmla*.so",
    "vllm/third_party/deep_gemm/*",
)
# torch comes with the machine (vLLM pins the exact version it was built against); the rest are optional CUDA kernel
# libraries that vLLM imports where a backend or quantization uses them, and that are each tens to hundreds of MB.
# Not apache-tvm-ffi (3 MB): xgrammar 0.2 imports it, and vLLM imports xgrammar whenever an engine starts.
DEFAULT_SKIP = (
    "torch",
    "torchaudio",
    "torchvision",
    "triton",
    "flashinfer-python",
    "flashinfer-cubin",
    "tilelang",
    "nvidia-cudnn-frontend",
    "nvidia-cutlass-dsl",
    "quack-kernels",
    "fastsafetensors",
)
# Dependencies as they stood when the wheel was current: a release of vLLM was tested against the dependency versions
# of its day, and later majors (openai, pydantic, starlette, ...) have broken older vLLMs' imports.
DEPS_GRACE_DAYS = 14
BUNDLE = "bundle.tar.xz"
MANIFEST = "parts.json"


class Refused(Exception):
    """Bad input or a broken transfer: one line naming the problem and the fix (exit 2)."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- what the other machine has --


def read_have(path: Path | None) -> dict[str, str | None]:
    """`pip list --format=freeze` / `pip freeze` lines (or bare names, one a line) -> {name: version or None}."""
    have: dict[str, str | None] = {}
    if path is None:
        return have
    if not path.is_file():
        raise Refused(f"--have {path}: no such file; write it with `python3 -m pip list --format=freeze` there")
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name, _, version = line.partition("==")
        if " @ " in name:  # `pip freeze` of a direct URL install
            name = name.split(" @ ", 1)[0]
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()):
            raise Refused(f"--have {path}: cannot read {raw!r}; give `pip list --format=freeze` output")
        have[canonical(name.strip())] = version.strip() or None
    return have


def target_environment(python: str) -> dict[str, str]:
    """The marker environment of a CPython `python` (e.g. 3.12) on x86-64 Linux."""
    return {
        "python_version": python,
        "python_full_version": python + ".0",
        "implementation_name": "cpython",
        "implementation_version": python + ".0",
        "platform_python_implementation": "CPython",
        "platform_machine": "x86_64",
        "platform_system": "Linux",
        "sys_platform": "linux",
        "os_name": "posix",
    }


def requirements_of(wheel: Path, extras: set[str], env: dict[str, str]) -> list[Requirement]:
    """The wheel's Requires-Dist that apply on the target with these extras asked for."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = z.read(meta).decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
            out.append(req)
    return out


def wheel_name_version(wheel: Path) -> tuple[str, str]:
    parts = wheel.name.split("-")
    return canonical(parts[0]), parts[1]


# -- pack --


def pip_download(reqs: list[str], dest: Path, python: str, platforms: list[str], pip_args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += ["--python-version", python, "--implementation", "cp"]
    for p in platforms:
        cmd += ["--platform", p]
    done = subprocess.run(cmd + pip_args + reqs, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise Refused(
            f"pip could not download {' '.join(reqs)}: {' | '.join(tail)}; build a wheel of it and pass its "
            "folder with --pip-arg=--find-links=DIR, or --skip it"
        )


def slim(src: Path, dest_dir: Path, drop: list[str]) -> tuple[Path, list[str]]:
    """A copy of the wheel without the entries `drop` matches (RECORD rewritten to match), stored uncompressed so
    that the bundle's xz compresses the extension modules better than the wheel's deflate did."""
    out = dest_dir / src.name
    dropped = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        names = zin.namelist()
        keep = [n for n in names if not any(fnmatch.fnmatch(n, pat) for pat in drop)]
        dropped = sorted(set(names) - set(keep))
        for name in keep:
            data = zin.read(name)
            if name.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(ln for ln in lines if ln.split(",", 1)[0] not in dropped) + "\n").encode()
            zout.writestr(zin.getinfo(name), data, compress_type=zipfile.ZIP_STORED)
    return out, dropped


def built_on(wheel: Path) -> datetime.date:
    """The newest file date inside the wheel: when it was built."""
    with zipfile.ZipFile(wheel) as z:
        return max(datetime.date(*i.date_time[:3]) for i in z.infolist())


def resolve(
    root: Path, have: dict, skip: set[str], env: dict, dest: Path, python: str, platforms: list[str], pip_args
) -> tuple[list[dict], list[dict]]:
    """Download, level by level, every requirement reachable from `root` that the other machine lacks. Returns
    (downloaded, left out) with the reason for each package left out."""
    got: dict[str, Path] = {}
    left: dict[str, str] = {}
    wanted: dict[str, Requirement] = {}
    level = [(r, set(r.extras)) for r in requirements_of(root, set(), env)]
    while level:
        batch: dict[str, Requirement] = {}
        extras_of: dict[str, set[str]] = {}
        for req, extras in level:
            name = canonical(req.name)
            if name in skip:
                left.setdefault(name, "skipped (--skip)")
                continue
            if name in have:
                v = have[name]
                if v is None or not req.specifier or req.specifier.contains(Version(v), prereleases=True):
                    left.setdefault(name, f"there ({v or 'any version'})")
                    continue
            prior = wanted.get(name)
            if prior is not None:
                req = Requirement(f"{name}{prior.specifier & req.specifier}")
            if name in got:
                v = wheel_name_version(got[name])[1]
                if req.specifier.contains(Version(v), prereleases=True) and extras <= extras_of.get(name, extras):
                    continue
            wanted[name] = req
            batch[name] = req
            extras_of[name] = extras_of.get(name, set()) | extras
        if not batch:
            break
        with tempfile.TemporaryDirectory() as tmp:
            pip_download([f"{n}{r.specifier}" for n, r in sorted(batch.items())], Path(tmp), python, platforms,
                         pip_args)  # fmt: skip
            level = []
            for whl in sorted(Path(tmp).glob("*.whl")):
                name, _ = wheel_name_version(whl)
                if name in got:
                    got[name].unlink()
                target = dest / whl.name
                shutil.move(str(whl), target)
                got[name] = target
                left.pop(name, None)
                level += [(r, set(r.extras)) for r in requirements_of(target, extras_of.get(name, set()), env)]
    downloaded = [{"name": n, "wheel": p.name, "bytes": p.stat().st_size} for n, p in sorted(got.items())]
    return downloaded, [{"name": n, "why": w} for n, w in sorted(left.items())]


def write_parts(bundle: Path, out: Path, part_bytes: int) -> list[dict]:
    parts = []
    with open(bundle, "rb") as f:
        i = 0
        while chunk := f.read(part_bytes):
            p = out / f"{BUNDLE}.part-{i:03d}"
            p.write_bytes(chunk)
            parts.append({"name": p.name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
            i += 1
    return parts


def pack(args) -> int:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise Refused(f"--out {out}: not empty; give a new folder (parts of two bundles must not mix)")
    if args.part_mib <= 0:
        raise Refused(f"--part-mib {args.part_mib}: give a size above 0, e.g. 58 for trips of 64 MiB")
    have = read_have(Path(args.have) if args.have else None)
    skip = {canonical(s) for s in (*DEFAULT_SKIP, *(args.skip or ()))}
    drop = [*DEFAULT_DROP, *(args.drop or ())]
    env = target_environment(args.python)
    platforms = args.platform or [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + [
        "manylinux2014_x86_64",
        "manylinux1_x86_64",
    ]
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        wheels = work / "wheels"
        wheels.mkdir()
        if args.wheel:
            src = Path(args.wheel)
            if not src.is_file() or not src.name.endswith(".whl"):
                raise Refused(f"--wheel {src}: not a wheel file; give a .whl or leave --wheel out to download")
        else:
            fetched = work / "fetched"
            fetched.mkdir()
            pip_download([f"{args.package}=={args.version}"], fetched, args.python, platforms, args.pip_arg)
            src = next(fetched.glob("*.whl"))
        slimmed, dropped = slim(src, wheels, drop)
        if args.deps_before != "none":
            before = args.deps_before or str(built_on(src) + datetime.timedelta(days=DEPS_GRACE_DAYS))
            args.pip_arg = [*args.pip_arg, f"--uploaded-prior-to={before}T00:00:00Z"]
        print(f"{src.name}: {src.stat().st_size / 2**20:.1f} MiB, {len(dropped)} files left out by --drop")
        deps, left = resolve(slimmed, have, skip, env, wheels, args.python, platforms, args.pip_arg)
        for d in deps:
            print(f"  + {d['wheel']} ({d['bytes'] / 2**20:.1f} MiB)")
        for item in left:
            print(f"  - {item['name']}: {item['why']}")
        manifest = {
            "package": wheel_name_version(src)[0],
            "version": wheel_name_version(src)[1],
            "wheel": src.name,
            "python": args.python,
            "deps_before": args.deps_before or "default",
            "dropped": dropped,
            "drop": drop,
            "dependencies": deps,
            "left_out": left,
        }
        (work / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
        bundle = work / BUNDLE
        with tarfile.open(bundle, "w:xz", preset=args.xz_preset) as tar:
            tar.add(work / "bundle.json", arcname="bundle.json")
            for whl in sorted(wheels.glob("*.whl")):
                tar.add(whl, arcname=f"wheels/{whl.name}")
        parts = write_parts(bundle, out, int(args.part_mib * 2**20))
        total = {"name": BUNDLE, "bytes": bundle.stat().st_size, "sha256": sha256(bundle)}
    (out / MANIFEST).write_text(json.dumps({**manifest, "bundle": total, "parts": parts}, indent=1) + "\n")
    print(
        f"{out}: {len(parts)} parts, {total['bytes'] / 2**20:.1f} MiB in all, {len(deps)} dependency wheels, "
        f"{time.monotonic() - t0:.0f} s; carry {MANIFEST} with any part, then `install --parts DIR --target SITE`"
    )
    return 0


# -- install --


def install(args) -> int:
    parts_dir, target = Path(args.parts), Path(args.target)
    mpath = parts_dir / MANIFEST
    if not mpath.is_file():
        raise Refused(f"--parts {parts_dir}: no {MANIFEST}; copy it there with the parts `pack` wrote")
    manifest = json.loads(mpath.read_text())
    missing = [p["name"] for p in manifest["parts"] if not (parts_dir / p["name"]).is_file()]
    if missing:
        raise Refused(f"--parts {parts_dir}: {len(missing)} parts missing ({', '.join(missing)}); copy them there")
    for p in manifest["parts"]:
        path = parts_dir / p["name"]
        if path.stat().st_size != p["bytes"] or sha256(path) != p["sha256"]:
            raise Refused(f"{path}: not the part `pack` wrote (size or SHA-256 differ); copy it again")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        bundle, whole = Path(tmp, BUNDLE), hashlib.sha256()
        with open(bundle, "wb") as f:
            for p in manifest["parts"]:
                data = (parts_dir / p["name"]).read_bytes()
                whole.update(data)
                f.write(data)
        if whole.hexdigest() != manifest["bundle"]["sha256"]:
            raise Refused(f"--parts {parts_dir}: the parts do not make the bundle {MANIFEST} names; pack again")
        with tarfile.open(bundle, "r:xz") as tar:
            tar.extractall(tmp, filter="data")
        wheels = sorted(str(w) for w in Path(tmp, "wheels").glob("*.whl"))
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        cmd += ["--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", str(target)]
        done = subprocess.run(cmd + wheels, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise Refused(f"pip install --target {target} failed: {' | '.join(tail)}")
    print(
        f"{manifest['package']} {manifest['version']} and {len(wheels) - 1} dependencies installed in {target} "
        f"({time.monotonic() - t0:.0f} s); use it with: export PYTHONPATH={target.resolve()}"
        + (f"  (left out: {', '.join(manifest['drop'])})" if manifest.get("drop") else "")
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="offline_vllm.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pk = sub.add_parser("pack", help="download vLLM and what it needs, slimmed, split into parts")
    pk.add_argument("--version", default="0.20.1", help="vLLM's version (default 0.20.1)")
    pk.add_argument("--package", default="vllm", help="the distribution to pack (default vllm)")
    pk.add_argument("--wheel", help="pack this wheel instead of downloading one (a build of your own)")
    pk.add_argument("--have", help="the other machine's `python3 -m pip list --format=freeze`: skipped if it fits")
    pk.add_argument("--out", required=True, help="a new folder for the parts and parts.json")
    pk.add_argument("--part-mib", type=float, default=58.0, help="largest part in MiB (default 58)")
    pk.add_argument("--python", default="3.12", help="the other machine's Python, major.minor (default 3.12)")
    pk.add_argument("--platform", action="append", help="pip --platform tags (default manylinux x86-64 ones)")
    pk.add_argument("--drop", action="append", help="one more glob of wheel entries to leave out (repeat; always: "
                    + ", ".join(DEFAULT_DROP) + ")")  # fmt: skip
    pk.add_argument("--skip", action="append", help="one more dependency not to bring (repeat; always: "
                    + ", ".join(DEFAULT_SKIP) + ")")  # fmt: skip
    pk.add_argument("--deps-before", help="newest upload date of a dependency, YYYY-MM-DD, or none (default: "
                    f"{DEPS_GRACE_DAYS} days after the wheel was built; needs pip >= 26)")  # fmt: skip
    pk.add_argument("--pip-arg", action="append", default=[], help="passed to pip download (e.g. --no-index)")
    pk.add_argument("--xz-preset", type=int, default=6, help="xz compression preset 0-9 (default 6)")
    ins = sub.add_parser("install", help="check the parts, reassemble the bundle, install it into a folder")
    ins.add_argument("--parts", required=True, help="the folder holding parts.json and every part")
    ins.add_argument("--target", required=True, help="the folder to install into (then put it on PYTHONPATH)")
    args = p.parse_args(argv)
    try:
        return pack(args) if args.cmd == "pack" else install(args)
    except Refused as e:
        print(f"offline_vllm.py {args.cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
