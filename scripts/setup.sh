#!/usr/bin/env bash
# One entry point that brings everything up, idempotently:
#   1. .venv with exactly the locked dependencies (requirements/dev.txt, `pip install --require-hashes`), then the
#      package itself editable with --no-deps; skipped when the venv's stamp says it already holds this lock;
#      then the package's bytecode compiled (what is stale only);
#   2. a Docker engine (scripts/setup-engine.sh: touches nothing when an engine already answers);
#   3. the sandbox images of images/ (scripts/build-image.sh --all: each built locally, reproducibly, only when
#      missing, one after the other; their SBOMs recorded; on a fresh machine about 6 minutes on 2 cores);
#   4. Debian's chromium for the HTML report test (only when missing);
#   5. podman and catatonit (the Kubernetes backend's `podman kube play` tests), only when missing;
#   6. `127.0.0.1 mirror.internal` in /etc/hosts (the egress tests' internal mirror), only when missing.
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
STAMP="$VENV/.gateway-lock.sha256"

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
# The stamp is the digest of the lock and of pyproject.toml (the package's own metadata and entry points), written
# only after a complete install: when it matches, nothing is installed and this step takes milliseconds.
LOCK=requirements/dev.txt
[[ -r "$LOCK" ]] || die "$LOCK is missing (refresh it with: bash scripts/lock.sh)"
want="$(cat "$LOCK" pyproject.toml | sha256sum | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [[ "$want" != "$have" ]] || ! "$VENV/bin/python" -c 'import gateway, pytest' >/dev/null 2>&1; then
    say "installing the locked dependencies ($LOCK, hash-checked), then the package (editable, --no-deps)"
    log="$(mktemp)"
    pip_install() { "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@" >"$log" 2>&1; }
    # Wheels only: building an sdist would run a build backend that is not in the lock.
    if ! pip_install --require-hashes --only-binary :all: -r "$LOCK"; then
        cat "$log" >&2; rm -f "$log"
        die "pip install --require-hashes -r $LOCK failed (a dependency changed in pyproject.toml? run: bash scripts/lock.sh)"
    fi
    # The build backend (hatchling) comes from the lock too, hence no build isolation.
    if ! pip_install --no-deps --no-build-isolation -e .; then
        cat "$log" >&2; rm -f "$log"
        die "pip install --no-deps -e . failed"
    fi
    rm -f "$log"
    # Exactly the lock: say so when the venv holds more (installed by hand; a fresh machine would not have it).
    extra="$("$VENV/bin/python" scripts/lockcheck.py extras "$LOCK")" || die "cannot compare .venv with $LOCK"
    if [[ -n "$extra" ]]; then
        printf 'setup: warning: .venv holds packages that %s does not list (a fresh machine will not have them): %s\n' \
            "$LOCK" "$extra" >&2
    fi
    printf '%s\n' "$want" >"$STAMP"
else
    say ".venv matches $LOCK"
fi
# The package's bytecode, as pip writes it for a regular install: with PYTHONDONTWRITEBYTECODE set (as here)
# nothing imported from the editable checkout is ever cached, so every gateway process and each of its worker
# interpreters would compile the sources again (~0.15 s of CPU each). Only what is stale is rewritten.
"$VENV/bin/python" -m compileall -q gateway >/dev/null || die "python -m compileall gateway failed"

# 2. Docker engine.
"$ROOT/scripts/setup-engine.sh"

# 3. Sandbox images: Python (the default policy's), Node.js, data science (the build script prints their ids).
ids="$("$ROOT/scripts/build-image.sh" --all)"
say "sandbox images: $(printf '%s\n' "$ids" | paste -sd ' ')"

# 4. A headless browser for the HTML report test (tests/unit/report/test_html.py): Debian's chromium.
if [[ ! -x /usr/bin/chromium ]] && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "installing chromium (the HTML report test renders in it)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
        || say "chromium could not be installed: the HTML report test will skip"
fi

# 5. podman (and catatonit, its pod infra's init) for the Kubernetes backend's layer-3 tests: `podman kube play`
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

# 6. The egress tests' internal mirror (policies/examples/egress-mirror.yaml allows mirror.internal on 127.0.0.0/8):
#    the name maps to 127.0.0.1 here, as an operator's DNS would map it to the mirror; the tests run their upstreams
#    on loopback and resolve the name through the system resolver. Added once, only as root.
if ! grep -qE '^[[:space:]]*127\.0\.0\.1([[:space:]].*)?[[:space:]]mirror\.internal([[:space:]]|$)' /etc/hosts 2>/dev/null; then
    if [[ "$(id -u)" == 0 ]]; then
        say "mapping mirror.internal to 127.0.0.1 in /etc/hosts (the egress tests' mirror)"
        printf '127.0.0.1 mirror.internal\n' >>/etc/hosts || say "cannot write /etc/hosts: the mirror egress test will skip"
    else
        say "mirror.internal is not in /etc/hosts (add '127.0.0.1 mirror.internal' as root): the mirror egress test will skip"
    fi
fi
