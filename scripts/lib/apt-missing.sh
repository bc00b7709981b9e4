# Sourced by the ensure-* scripts: `install_missing PACKAGE…` installs Debian packages (as root), or
# says which to install and exits 1 when it cannot (not root). Does nothing for an empty list.
install_missing() {
  [ $# -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ]; then
    echo "missing $*: install them (apt-get install $*) and run make again" >&2
    exit 1
  fi
  echo "installing $*" >&2
  export DEBIAN_FRONTEND=noninteractive
  # One package index refresh an hour: make test installs chromium, then promtool.
  local stamp=/var/lib/apt/lists/.lapse-updated
  if [ -z "$(find "$stamp" -mmin -60 2>/dev/null)" ]; then
    apt-get update -qq >/dev/null
    touch "$stamp"
  fi
  apt-get install -y -qq "$@" >/dev/null
}
