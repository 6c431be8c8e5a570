"""The README and docs/ as a user reads them: short manual, every page linked, every CPU example runs.

Examples are the lines starting with `b70bench ` inside ```sh blocks of README.md and docs/*.md.
Each runs as written, from a scratch working directory (what it writes stays out of the checkout) with
state in a temporary B70BENCH_HOME; a line ending in a comment naming what it needs (# cuda, # xpu, # torchrun,
# long, # needs results, # needs the file above) is skipped with that reason.

Also: lines of at most 120 characters (README.md all of them; docs/*.md outside code fences and table rows),
every relative link of README.md, docs/*.md and docs/history/*.md resolving to a file and heading, and no
tracked text outside tests/ naming a path of one machine or a tool that is not part of the project.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HISTORY = sorted((ROOT / "docs" / "history").glob("*.md"))
NEEDS = ("cuda", "xpu", "torchrun", "long", "needs results", "needs the file above")
# `make test-long`: the examples marked "# long" run too (one at a time, with an hour each), in a job of their own.
LONG_ENV = "B70BENCH_LONG_EXAMPLES"
LONG_TIMEOUT_S = 3600
README_MAX_LINES = 250
MAX_WIDTH = 120


def examples() -> list[tuple[str, int, str]]:
    out, seen = [], set()
    for page in PAGES:
        fence = None
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                fence = line[3:].strip() if fence is None else None
                continue
            if fence == "sh" and line.startswith("b70bench ") and line not in seen:
                seen.add(line)  # the same command on two pages runs once
                out.append((page.relative_to(ROOT).as_posix(), n, line))
    return out


EXAMPLES = examples()


def test_readme_is_a_manual_and_links_every_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", text))
    pages = {p.relative_to(ROOT).as_posix() for p in PAGES[1:]}
    assert pages and pages <= linked, sorted(pages - linked)
    assert len(EXAMPLES) >= 10  # the extraction found the examples (a broken fence would find none)


def example_param(page: str, line_no: int, line: str):
    # An example that patches or restores this environment's vLLM would change it under the tests beside it; a long
    # one measures for minutes, which tests beside it would disturb.
    alone = line.startswith(("b70bench patches apply", "b70bench patches restore")) or "# long" in line
    return pytest.param(page, line_no, line, id=f"{page}:{line_no}", marks=[pytest.mark.alone] if alone else [])


@pytest.mark.parametrize("page, line_no, line", [example_param(*e) for e in EXAMPLES])
def test_example_runs_as_written(page, line_no, line, tmp_path):
    command, _, comment = line.partition(" #")
    need = next((tag for tag in NEEDS if tag in comment), None)
    if need == "long" and os.environ.get(LONG_ENV) == "1":
        need = None
    if need:
        more = f" ({LONG_ENV}=1, `make test-long`, runs it)" if need == "long" else ""
        pytest.skip(f'{page}:{line_no} is marked "# {need}"{more}')
    args = shlex.split(command)[1:]
    env = dict(os.environ, B70BENCH_HOME=str(tmp_path / "home"))
    env.pop("B70BENCH_BACKEND", None)
    work = tmp_path / "work"
    work.mkdir()
    run = lambda a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "b70bench", *a],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=LONG_TIMEOUT_S if "# long" in line else 900,
    )
    try:
        done = run(args)
    finally:
        if args[:2] == ["patches", "apply"]:  # an example that patches this environment's vLLM: put it back
            back = run(["patches", "restore"])
            assert back.returncode == 0, back.stderr
    assert done.returncode == 0, f"{page}:{line_no}: {line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def without_fences(text: str) -> str:
    """The text with every ``` block blanked (line numbers kept): code is not prose and holds no links."""
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
            out.append("")
            continue
        out.append("" if fence else line)
    return "\n".join(out)


def test_lines_at_most_120_characters():
    long = []
    for page in PAGES:
        readme = page.parent == ROOT
        fence = False
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                fence = not fence
            elif not readme and (fence or line.startswith("|")):
                continue  # docs/*.md: code and table rows may run long; the README may not
            if len(line) > MAX_WIDTH:
                long.append(f"{page.relative_to(ROOT).as_posix()}:{n}: {len(line)} characters")
    assert not long, long


def anchors(page: Path) -> Iterator[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    for line in without_fences(page.read_text()).splitlines():
        m = re.match(r"#{1,6} +(.*?) *#*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            yield slug if n == 0 else f"{slug}-{n}"


LINK = re.compile(r"\[[^\]]*\]\(([^()\s]+)\)")


def test_relative_links_resolve():
    broken = []
    for page in [*PAGES, *HISTORY]:
        for target in LINK.findall(without_fences(page.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT).as_posix()}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in set(anchors(dest)):
                broken.append(f"{where}: no such heading")
    assert not broken, broken


# A path that exists on one machine only, at the start of a path (not /tmp inside a longer one).
MACHINE_PATH = re.compile(r"(?<![\w.~/])/(?:tmp|root|work|mnt|home|opt)(?![\w.-])")
# Tools of the environment this project was written in, which a user does not have.
OUTSIDE_TOOL = re.compile(
    r"\bdevice (?:tool|machine)s?\b|\bsub-?agents?\b|\bsearch tool\b|\bremote[- ]execution\b"
    r"|\bthe `?run`? tool\b|\bkinds? `?nvidia-h200|\.mirror/|\bfiles_(?:fetch|at)\b|\bbudget_left_s\b",
    re.IGNORECASE,
)
# Lines that match for a reason that holds on any machine: (path, text on the line).
ALLOWED = {
    # Nsight Compute's default install directory, tried when `ncu` is not on PATH.
    ("scripts/device/moe_dram.sh", "/opt/nvidia/nsight-compute/"),
    ("scripts/device/moe_probe.sh", "/opt/nvidia/nsight-compute/"),
}


def tracked_text_files() -> dict[str, list[str]]:
    """Tracked files outside tests/ (whose fixtures use temporary paths), by top-level entry."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    groups: dict[str, list[str]] = {}
    for name in listed.splitlines():
        if not name.startswith("tests/"):
            groups.setdefault(name.split("/", 1)[0], []).append(name)
    return groups


TRACKED = tracked_text_files()


@pytest.mark.skipif(not TRACKED, reason="not a git checkout")
@pytest.mark.parametrize("area", sorted(TRACKED) or ["-"])
def test_no_machine_paths_or_outside_tools(area):
    found = []
    for name in TRACKED.get(area, []):
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary, or listed but absent
        for n, line in enumerate(text.splitlines(), 1):
            for rx in (MACHINE_PATH, OUTSIDE_TOOL):
                m = rx.search(line)
                if m and not any(name == path and allowed in line for path, allowed in ALLOWED):
                    found.append(f"{name}:{n}: {m.group(0)!r}")
    assert not found, found
