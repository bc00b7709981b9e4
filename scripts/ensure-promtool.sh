#!/usr/bin/env bash
# Makes sure `promtool` is present: the tests check compose/prometheus/alerts.yml with
# `promtool test rules`. Debian's `prometheus` package provides /usr/bin/promtool; it also ships a
# Prometheus server with a service, which must not be left running or enabled here, so the install
# runs with a policy that forbids starting services, and the service is then disabled and any
# server the install started anyway is stopped. Safe to run again (installs only what is missing).
set -euo pipefail
command -v promtool >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "missing promtool: install Debian's prometheus package (apt-get install --no-install-recommends" \
       "prometheus) or put promtool on PATH, and run make again" >&2
  exit 1
fi
echo "installing promtool (Debian's prometheus package, its server left stopped and disabled)" >&2
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
own_policy=
if [ ! -e "$policy" ]; then  # exit 101: "action forbidden", so the package's postinst starts nothing
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
fi
cleanup() { if [ -n "$own_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The server must not start at boot either, whichever init system this machine has.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
if command -v update-rc.d >/dev/null 2>&1 && [ -e /etc/init.d/prometheus ]; then
  update-rc.d prometheus disable >/dev/null 2>&1 || true
fi
# A server the install started despite the policy (its pid file, else the package's binary run by
# the package's user) is stopped by its process id.
for pid in $(cat /run/prometheus/prometheus.pid 2>/dev/null; pgrep -u prometheus -x prometheus || true); do
  kill "$pid" 2>/dev/null || true
done
command -v promtool >/dev/null 2>&1 || { echo "promtool still missing after installing prometheus" >&2; exit 1; }
