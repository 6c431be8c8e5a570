"""Screenshot a published asv site in headless Chromium, served on localhost.

    python scripts/asv_screenshot.py results/html results/regressions.png [--page '#regressions']

Installs Debian's chromium and JS packages if missing (scripts/install-chromium.sh), makes an
offline copy of the site (scripts/asv_site_offline.py), serves it from 127.0.0.1 on a free
port, and writes the screenshot and, with --dom FILE, the page's DOM after its scripts ran.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import asv_site_offline  # noqa: E402


def chromium() -> str:
    subprocess.run(["sh", str(HERE / "install-chromium.sh")], check=True, timeout=900)
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise SystemExit("chromium is not on PATH after scripts/install-chromium.sh")
    return found


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would bury the test's own output
        pass


@contextlib.contextmanager
def serve(directory: Path):
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def browse(browser: str, url: str, out_png: Path, width: int = 1400, height: int = 900) -> str:
    """The page's DOM after its scripts ran (virtual time lets them finish), and a screenshot."""
    base = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--virtual-time-budget=15000",
        f"--window-size={width},{height}",
    ]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True).stdout
    subprocess.run([*base, f"--screenshot={out_png}", url], capture_output=True, timeout=120, check=True)
    return dom


def screenshot(html_dir: Path, out_png: Path, page: str = "#regressions") -> str:
    """Screenshot html_dir's index.html<page>; returns the DOM. Raises if the site's scripts did not load."""
    browser = chromium()
    with tempfile.TemporaryDirectory(prefix="b70bench-site-") as tmp:
        site = Path(tmp) / "site"
        missing = asv_site_offline.localize(html_dir, site)
        if missing:
            raise SystemExit(f"no local copy of {', '.join(missing)}: run scripts/install-chromium.sh")
        with serve(site) as url:
            dom = browse(browser, f"{url}/index.html{page}", out_png)
    if "Can not determine continental origin of swallow" in dom:  # asv's "scripts failed to load" page
        raise SystemExit("the site's JavaScript did not load; see the screenshot")
    return dom


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html_dir", type=Path)
    ap.add_argument("out_png", type=Path)
    ap.add_argument("--page", default="#regressions", help="fragment of index.html to open (default #regressions)")
    ap.add_argument("--dom", type=Path, default=None, help="also write the rendered DOM here")
    args = ap.parse_args()
    dom = screenshot(args.html_dir, args.out_png, args.page)
    if args.dom:
        args.dom.write_text(dom)
    print(f"wrote {args.out_png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
