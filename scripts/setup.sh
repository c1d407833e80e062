#!/usr/bin/env bash
# One entry point that brings everything up, idempotently:
#   1. .venv with the package installed editable with its dev extras (only when missing or pyproject changed);
#   2. a Docker engine (scripts/setup-engine.sh: touches nothing when an engine already answers);
#   3. the sandbox image (scripts/build-image.sh: built locally only when missing);
#   4. podman and catatonit (the Kubernetes backend's `podman kube play` tests), only when missing.
# Progress goes to stderr when it is a terminal; quiet when piped (errors are always shown).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ -z "${GATEWAY_QUIET:-}" ]]; then
    if [[ -t 2 ]]; then GATEWAY_QUIET=0; else GATEWAY_QUIET=1; fi
fi
export GATEWAY_QUIET
say() { if [[ "$GATEWAY_QUIET" == 0 ]]; then printf 'setup: %s\n' "$*" >&2; fi; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
STAMP="$VENV/.gateway-pyproject.sha256"

# 1. Python environment.
if [[ ! -x "$VENV/bin/python" ]]; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (Python 3.11+ is needed)"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "Python 3.11+ is needed ($PYTHON is older)"
    say "creating .venv"
    if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
        if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            say "installing python3-venv"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null 2>&1 \
                || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; } \
                || die "cannot install python3-venv"
            rm -rf "$VENV"
            "$PYTHON" -m venv "$VENV" || die "cannot create $VENV"
        else
            die "cannot create $VENV (install python3-venv)"
        fi
    fi
fi
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [[ "$want" != "$have" ]] || ! "$VENV/bin/python" -c 'import gateway, pytest' >/dev/null 2>&1; then
    say "installing the package (editable, with dev extras)"
    log="$(mktemp)"
    if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e '.[dev]' >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        die "pip install -e '.[dev]' failed"
    fi
    rm -f "$log"
    printf '%s\n' "$want" >"$STAMP"
else
    say ".venv is up to date"
fi

# 2. Docker engine.
"$ROOT/scripts/setup-engine.sh"

# 3. Sandbox image (its id goes to stderr when verbose; the build script prints it on stdout).
id="$("$ROOT/scripts/build-image.sh")"
say "sandbox image: $id"

# 4. podman (and catatonit, its pod infra's init) for the Kubernetes backend's layer-3 tests: `podman kube play`
#    runs the assembled Pod manifests for real (tests/integration/test_kubernetes_podman.py). Installed only when
#    missing, and only where apt-get is usable as root; everything podman stores lives under the tests' temp dirs.
if ! command -v podman >/dev/null 2>&1 || ! command -v catatonit >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing podman and catatonit"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman catatonit >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null 2>&1 \
                 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman catatonit >/dev/null; } \
            || die "cannot install podman and catatonit"
    else
        say "podman or catatonit missing (install both: the Kubernetes layer-3 tests need them)"
    fi
else
    say "podman is installed"
fi
