#!/usr/bin/env bash
# Makes sure Debian's chromium and chromium-driver are present: the console's tests drive a real
# headless browser with Selenium. Safe to run again (installs only what is missing).
set -euo pipefail
. "$(dirname "$0")/lib/apt-missing.sh"
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
install_missing ${missing[@]+"${missing[@]}"}
