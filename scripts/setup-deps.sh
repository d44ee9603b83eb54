#!/usr/bin/env bash
# Installs the Debian packages hearth builds with, if any is missing (Debian 12).
set -euo pipefail
# chromium: the browser tests/cli/webui.sh drives headless (puppeteer-core) to test the chat page
need=(build-essential clang libclang-rt-14-dev libcjson-dev libpcre2-dev libmicrohttpd-dev python3 python3-jinja2 cmake git nginx wamerican chromium)
missing=()
for p in "${need[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# node and npm fetch the peer and the reference tokenizer; any install of them will do
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
