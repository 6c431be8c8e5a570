"""Make a published asv site viewable without internet: `python scripts/asv_site_offline.py HTML_DIR OUT_DIR`.

asv's index.html loads jQuery, Flot, Bootstrap, stupidtable and md5 from public CDNs; a
machine without internet (CI, a lab box) shows "Can not determine continental origin of
swallow" instead of the site. This copies the site and points those tags at Debian's
packaged copies (scripts/install-chromium.sh installs them), dropping the SRI hashes that
only match the CDN's bytes. Flot's orderBars plugin is not packaged; a no-op stands in
(it only orders bars in bar charts, which the regressions page does not draw).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

DEBIAN = Path("/usr/share/javascript")
# CDN file name -> the packaged file that provides it (flot's pack.js bundles the core and
# the helpers that Flot >= 3 splits out).
LOCAL = {
    "jquery-3.3.1.min.js": "jquery/jquery.min.js",
    "jquery.flot.min.js": "jquery-flot/jquery.flot.pack.js",
    "jquery.flot.time.min.js": "jquery-flot/jquery.flot.time.js",
    "jquery.flot.selection.min.js": "jquery-flot/jquery.flot.selection.js",
    "jquery.flot.categories.min.js": "jquery-flot/jquery.flot.categories.js",
    "stupidtable.min.js": "jquery-stupidtable/stupidtable.min.js",
    "md5.min.js": "blueimp-md5/md5.min.js",
    "bootstrap.min.js": "bootstrap/js/bootstrap.min.js",
    "bootstrap.min.css": "bootstrap/css/bootstrap.min.css",
}
SHIMS = {"jquery.flot.orderBars.js": "/* b70bench: no-op stand-in for flot-orderbars (not packaged) */\n"}
TAG = re.compile(r'<(script|link)\b[^>]*?(?:src|href)="(https?://[^"]+)"[^>]*>', re.S)


def localize(html_dir: Path, out_dir: Path, debian: Path = DEBIAN) -> list[str]:
    """Copy html_dir to out_dir with CDN tags rewritten; returns the CDN URLs it could not replace."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(html_dir, out_dir)
    vendor = out_dir / "vendor"
    vendor.mkdir()
    missing = []

    def replace(m: re.Match) -> str:
        kind, url = m.group(1), m.group(2)
        name = url.rsplit("/", 1)[-1]
        if name in SHIMS:
            (vendor / name).write_text(SHIMS[name])
            local = name
        elif name in LOCAL and (debian / LOCAL[name]).is_file():
            local = Path(LOCAL[name]).name
            shutil.copy2(debian / LOCAL[name], vendor / local)
        else:
            missing.append(url)
            return m.group(0)
        if kind == "link":
            return f'<link rel="stylesheet" href="vendor/{local}">'
        # onerror stays: a file that fails to load still shows asv's own message.
        return f'<script src="vendor/{local}" onerror="js_load_failure()">'

    for page in out_dir.glob("*.html"):
        page.write_text(TAG.sub(replace, page.read_text()))
    return missing


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    missing = localize(Path(argv[0]), Path(argv[1]))
    for url in missing:
        print(f"not available locally (left as is): {url}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
