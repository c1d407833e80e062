#!/usr/bin/env bash
# The README's test command: set everything up (idempotent), audit the locked dependencies, then lint, type-check
# and run the whole suite (unit tests, golden policy cases, and integration tests against the real Docker engine).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

PY=.venv/bin
say() { printf '==> %s\n' "$*" >&2; }

# The locked set against the known vulnerabilities (one ==> pip-audit line; SKIPPED, not failed, without network).
"$PY/python" scripts/audit-deps.py
say "ruff check"
"$PY/ruff" check .
say "ruff format --check"
"$PY/ruff" format --check .
say "mypy (strict on gateway/)"
"$PY/mypy"
say "pytest (unit + policies + integration)"
# Integration tests never skip silently in CI: the conftest turns a missing engine into a failure when CI is set.
exec "$PY/pytest" "$@"
