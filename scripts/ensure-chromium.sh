#!/usr/bin/env bash
# Makes sure Debian's chromium and chromium-driver are present: the console's tests drive a real
# headless browser with Selenium. Safe to run again (installs only what is missing).
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing ${missing[*]}: install them (apt-get install ${missing[*]}) and run make again" >&2
    exit 1
  fi
  echo "installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
