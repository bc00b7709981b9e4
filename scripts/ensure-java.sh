#!/usr/bin/env bash
# Makes sure a JDK (17+) and Maven are present: the test broker is Apache Kafka from its jars.
set -euo pipefail
. "$(dirname "$0")/lib/apt-missing.sh"
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
install_missing ${missing[@]+"${missing[@]}"}
