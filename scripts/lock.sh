#!/usr/bin/env bash
# Refresh the hash-locked requirements from pyproject.toml. The one command, after any dependency change:
#
#     bash scripts/lock.sh              keep every existing pin that still fits, add what is new
#     bash scripts/lock.sh --upgrade    move every pin to the newest release that pyproject's ranges allow
#
# It writes (and scripts/setup.sh installs with `pip install --require-hashes`):
#   requirements/dev.txt      every dependency of every extra (dev, service, otel, ...) plus the build backend,
#                             what scripts/setup.sh puts in .venv (the project itself then goes in with --no-deps)
#   requirements/runtime.txt  the library's own dependencies only, at the same versions, for deployments
#
# The lock is resolved against the public package index only: this machine's pip configuration (local indexes,
# find-links, constraints) is switched off so that a fresh machine, which reaches only the public index, can
# install exactly these files and these hashes. Lock for the Python the project runs on (3.11, like CI).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
die() { printf 'lock: error: %s\n' "$*" >&2; exit 1; }

PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
"$PY" -m piptools compile --version >/dev/null 2>&1 \
    || die "pip-tools is not installed for $PY: run 'bash scripts/setup.sh' first (or: $PY -m pip install pip-tools)"

# No configuration file, no PIP_* variable: pip's defaults, i.e. the public index and nothing else.
export PIP_CONFIG_FILE=/dev/null
while IFS= read -r var; do unset "$var"; done < <(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p')
export CUSTOM_COMPILE_COMMAND="bash scripts/lock.sh"

common=(--quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-trusted-host
        --no-emit-find-links --resolver=backtracking "$@")
# dev first: the complete set, resolved as one; runtime is then constrained to the same versions.
"$PY" -m piptools compile "${common[@]}" --all-extras --build-deps-for=editable \
    --output-file requirements/dev.txt pyproject.toml
"$PY" -m piptools compile "${common[@]}" --constraint requirements/dev.txt \
    --output-file requirements/runtime.txt pyproject.toml
printf 'lock: requirements/dev.txt (%s pins), requirements/runtime.txt (%s pins)\n' \
    "$(grep -c '^[a-zA-Z0-9]' requirements/dev.txt)" "$(grep -c '^[a-zA-Z0-9]' requirements/runtime.txt)" >&2
