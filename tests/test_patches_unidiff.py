"""The pure-Python unified-diff applier against difflib's diffs and GNU patch's rules."""

from __future__ import annotations

import difflib
import random

import pytest

from b70bench import unidiff


def udiff(old: str, new: str, path: str = "m.py", n: int = 3) -> bytes:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}", n=n
        )
    ).encode()


def patched(original: bytes | None, diff: bytes) -> bytes | None:
    (fd,) = unidiff.parse(diff)
    return unidiff.apply(original, fd)


@pytest.mark.parametrize("seed", range(40))
def test_random_edits_round_trip(seed):
    rng = random.Random(seed)
    old = [f"line {i} {rng.randrange(5)}\n" for i in range(rng.randrange(1, 80))]
    new = list(old)
    for _ in range(rng.randrange(1, 6)):
        op = rng.choice("id r")
        at = rng.randrange(len(new) + 1)
        if op == "i" or not new:
            new[at:at] = [f"new {rng.random()}\n" for _ in range(rng.randrange(1, 4))]
        elif op == "d":
            del new[min(at, len(new) - 1)]
        else:
            new[min(at, len(new) - 1)] = f"changed {rng.random()}\n"
    old_s, new_s = "".join(old), "".join(new)
    if old_s == new_s:
        return
    assert patched(old_s.encode(), udiff(old_s, new_s, n=rng.choice([0, 1, 3]))) == new_s.encode()


def test_offset_is_followed_but_changed_context_fails():
    old = "".join(f"{i}\n" for i in range(30))
    new = old.replace("15\n", "fifteen\n")
    diff = udiff(old, new)
    moved = "header\nheader\n" + old  # file grew above the hunk: the hunk moves by 2
    assert patched(moved.encode(), diff) == ("header\nheader\n" + new).encode()
    with pytest.raises(unidiff.PatchError, match=r"m.py: hunk 1 @@ -13,7 \+13,7 @@ does not apply"):
        patched(old.replace("14\n", "fourteen\n").encode(), diff)
    with pytest.raises(unidiff.PatchError, match="does not apply"):
        patched(new.encode(), diff)  # applied already


def test_no_newline_at_end_of_file_both_ways():
    diff = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"
    assert patched(b"a\nb", diff) == b"a\nb\n"
    back = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+b\n\\ No newline at end of file\n"
    assert patched(b"a\nb\n", back) == b"a\nb"


def test_create_and_delete_files():
    create = b"--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
    assert patched(None, create) == b"x = 1\ny = 2\n"
    with pytest.raises(unidiff.PatchError, match="creates this file but it already exists"):
        patched(b"x = 1\n", create)
    delete = b"--- a/old.py\n+++ /dev/null\n@@ -1,1 +0,0 @@\n-x = 1\n"
    assert patched(b"x = 1\n", delete) is None
    with pytest.raises(unidiff.PatchError, match="does not exist"):
        patched(None, delete)


def test_crlf_and_bytes_are_kept():
    old = b"a\r\nb\r\nc\r\n"
    diff = b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\r\n-b\r\n+\xc3\xa9\r\n c\r\n"
    assert patched(old, diff) == b"a\r\n\xc3\xa9\r\nc\r\n"


def test_text_around_diffs_is_ignored_and_paths_are_stripped():
    text = b"Subject: x\nB70bench-Target: dist:vllm\n\n" + udiff("a\n", "b\n", "vllm/x.py") + b"-- \n2.43\n"
    (fd,) = unidiff.parse(text)
    assert fd.path == "vllm/x.py" and fd.old_path == "vllm/x.py"


def test_truncated_hunk_is_a_parse_error():
    with pytest.raises(unidiff.PatchError, match="truncated"):
        unidiff.parse(b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n")
