#!/bin/sh
# Debian's chromium, plus Debian's packaged copies of the JavaScript asv's website loads from
# CDNs (scripts/asv_site_offline.py points the site at them), for headless screenshots of the
# published site on machines without internet (tests/test_asv_walk.py). Idempotent.
set -eu
PKGS="chromium fonts-dejavu-core libjs-jquery libjs-jquery-flot libjs-jquery-stupidtable node-blueimp-md5 libjs-bootstrap"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
command -v chromium
