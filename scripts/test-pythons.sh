#!/usr/bin/env bash
# The unit tests on every Python from 3.11 on that this machine has: pyenv's versions, or
# python3.X on PATH. Each gets a virtual environment of its own, .venv-3.X, with the test extras
# (made once, refreshed when pyproject.toml changes), and runs tests/unit there. Prints one line
# per Python, then exits non-zero if any failed or none was found. PYTHON_VERSIONS="3.12 3.13"
# limits the run; TEST_ARGS adds pytest arguments (e.g. "tests/unit tests/integration").
set -uo pipefail
cd "$(dirname "$0")/.."
versions=${PYTHON_VERSIONS:-"3.11 3.12 3.13 3.14"}
args=${TEST_ARGS:-"tests/unit"}
stamp="installed-$(cksum pyproject.toml | cut -d' ' -f1)"
pyenv_root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
found=0 failed=0 summary=()

interpreter() {  # the newest pyenv build of version $1, else python$1 on PATH
  local candidate
  candidate=$(ls -d "$pyenv_root"/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -V | tail -1)
  if [ -n "$candidate" ] && [ -x "$candidate" ]; then echo "$candidate"; return; fi
  command -v "python$1" 2>/dev/null || true
}

for version in $versions; do
  python=$(interpreter "$version")
  if [ -z "$python" ]; then
    summary+=("$version: not on this machine")
    continue
  fi
  found=$((found + 1))
  full=$("$python" -c 'import platform; print(platform.python_version())')
  venv=".venv-$version"
  if [ ! -e "$venv/.$stamp" ]; then
    echo "== Python $full: $venv" >&2
    rm -rf "$venv"
    if ! "$python" -m venv "$venv" || ! "$venv/bin/pip" install -q --disable-pip-version-check -e '.[test]'; then
      summary+=("$full: FAILED to install the test extras")
      failed=$((failed + 1))
      continue
    fi
    touch "$venv/.$stamp"
  fi
  echo "== Python $full: pytest $args" >&2
  log="$venv/pytest.log"
  # shellcheck disable=SC2086  # TEST_ARGS is a list of arguments
  "$venv/bin/pytest" -q -p no:cacheprovider $args >"$log" 2>&1
  code=$?
  tail -n 1 "$log" >&2
  result=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)' "$log" | tail -1 | tr -d '=' | xargs)
  if [ "$code" -ne 0 ]; then
    failed=$((failed + 1))
    summary+=("$full: FAILED ($result; see $log)")
  else
    summary+=("$full: ok ($result)")
  fi
done

printf '%s\n' "${summary[@]}"
if [ "$found" -eq 0 ]; then
  echo "no Python 3.11 or later found (pyenv or python3.X on PATH)" >&2
  exit 1
fi
[ "$failed" -eq 0 ]
