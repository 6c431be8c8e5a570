"""Where b70bench keeps what it writes at run time (records, cache-key pins): never in the package.

The state directory is B70BENCH_HOME when set; else the results/ folder (ignored by git) of the
asv project b70bench runs in: the directory asv names in ASV_CONF_DIR while it runs a benchmark,
or the nearest directory holding asv.conf.json at or above the working directory; else
~/.cache/b70bench/state. So an installed wheel (asv's managed environments) and the checkout
agree, and `b70bench cache-key explain` finds the records from any directory of the project.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

HOME_ENV = "B70BENCH_HOME"
CONF = "asv.conf.json"


def project_dir(start: Path | None = None) -> Path | None:
    """The asv project: ASV_CONF_DIR, else the nearest directory with asv.conf.json upwards."""
    if os.environ.get("ASV_CONF_DIR"):
        return Path(os.environ["ASV_CONF_DIR"])
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / CONF).is_file():
            return d
    return None


def home() -> Path:
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV])
    project = project_dir()
    if project is not None:
        return project / "results"
    return Path(os.path.expanduser("~")) / ".cache" / "b70bench" / "state"


def records_dir() -> Path:
    return home() / "records"


def pins_path() -> Path:
    return home() / "cache-key-pins.json"


def asv_results_dir(project: Path | None = None) -> Path:
    """The asv project's results_dir (asv.conf.json, relative to the project; default: project_dir()), else
    results/asv there."""
    project = project or project_dir() or Path.cwd()
    try:
        text = (project / CONF).read_text()
        # asv.conf.json allows // comments; none of its strings holds "//" at a line's start.
        conf = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
        return project / conf.get("results_dir", "results")
    except (OSError, ValueError):
        return project / "results" / "asv"
