#!/usr/bin/env bash
# Makes sure a JDK (17+) and Maven are present: the test broker is Apache Kafka from its jars.
set -euo pipefail
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
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
