#!/usr/bin/env bash
# Bring up a Docker engine (with gVisor's runsc registered) when none answers.
#
# Idempotent: if `docker info` already answers (a developer laptop, a CI runner
# with Docker), this script touches nothing. Otherwise, as root on Debian, it
# installs Debian's docker.io, runsc and debootstrap, registers runsc as a
# runtime in /etc/docker/daemon.json (merged, never clobbered), removes a stale
# pid file left by an engine that was killed, starts dockerd detached with
# --bridge=none (CIS Docker 5.30: no default bridge) and waits for it.
#
# Environment:
#   GATEWAY_ENGINE_WAIT_S   seconds to wait for the engine (default 60)
#   GATEWAY_DOCKERD_LOG     dockerd log file (default /var/log/gateway-dockerd.log)
#   GATEWAY_QUIET=1         no progress messages (default: quiet unless stderr is a tty)
set -euo pipefail

WAIT_S="${GATEWAY_ENGINE_WAIT_S:-60}"
LOG="${GATEWAY_DOCKERD_LOG:-/var/log/gateway-dockerd.log}"
DAEMON_JSON=/etc/docker/daemon.json
PIDFILE=/var/run/docker.pid

if [[ -z "${GATEWAY_QUIET:-}" ]]; then
    if [[ -t 2 ]]; then GATEWAY_QUIET=0; else GATEWAY_QUIET=1; fi
fi
say() { if [[ "$GATEWAY_QUIET" == 0 ]]; then printf 'setup-engine: %s\n' "$*" >&2; fi; }
die() { printf 'setup-engine: error: %s\n' "$*" >&2; exit 1; }

engine_answers() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

if engine_answers; then
    say "a Docker engine already answers; nothing to do"
    exit 0
fi

[[ "$(id -u)" == 0 ]] || die "no Docker engine answers and this is not root: start Docker yourself (or run this script as root on Debian)"
[[ -r /etc/debian_version ]] || die "no Docker engine answers and this is not Debian: install and start Docker yourself"

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v runsc >/dev/null 2>&1 || need+=(runsc)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if ((${#need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    APTLOG="$(mktemp)"
    trap 'rm -f "$APTLOG"' EXIT
    # apt-get update only when the package lists do not know the packages yet.
    if ! apt-cache show "${need[@]}" >/dev/null 2>&1; then
        say "apt-get update"
        apt-get update -qq >"$APTLOG" 2>&1 || { cat "$APTLOG" >&2; die "apt-get update failed"; }
    fi
    say "installing ${need[*]}"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >"$APTLOG" 2>&1 \
        || { cat "$APTLOG" >&2; die "apt-get install ${need[*]} failed"; }
    if [[ "$GATEWAY_QUIET" == 0 ]]; then tail -n 3 "$APTLOG" >&2; fi
fi

# Register runsc, merging into an existing daemon.json (never clobbering it).
RUNSC="$(command -v runsc || true)"
if [[ -n "$RUNSC" ]]; then
    mkdir -p "$(dirname "$DAEMON_JSON")"
    python3 - "$DAEMON_JSON" "$RUNSC" <<'PY' || die "cannot update $DAEMON_JSON"
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
try:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    conf = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    conf = {}
if not isinstance(conf, dict):
    sys.exit(f"{path}: not a JSON object")
runtimes = conf.setdefault("runtimes", {})
if "runsc" not in runtimes:
    runtimes["runsc"] = {"path": runsc, "runtimeArgs": ["--platform=ptrace", "--network=none"]}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(conf, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
PY
fi

# A dockerd killed without a clean stop leaves its pid file and the next one refuses to start.
if [[ -f "$PIDFILE" ]]; then
    oldpid="$(cat "$PIDFILE" 2>/dev/null || true)"
    if [[ -n "$oldpid" ]] && kill -0 "$oldpid" 2>/dev/null; then
        say "dockerd (pid $oldpid) is running but does not answer yet; waiting for it"
    else
        say "removing stale $PIDFILE (pid ${oldpid:-?} is gone)"
        rm -f "$PIDFILE"
    fi
fi

if [[ ! -f "$PIDFILE" ]]; then
    command -v dockerd >/dev/null 2>&1 || die "dockerd not found after installation"
    say "starting dockerd --bridge=none (log: $LOG)"
    mkdir -p "$(dirname "$LOG")"
    # setsid + nohup: the engine outlives this script and its session.
    setsid nohup dockerd --bridge=none >>"$LOG" 2>&1 </dev/null &
    disown || true
fi

deadline=$((SECONDS + WAIT_S))
until engine_answers; do
    if ((SECONDS >= deadline)); then
        tail -n 20 "$LOG" >&2 2>/dev/null || true
        die "the Docker engine did not answer within ${WAIT_S}s (log: $LOG)"
    fi
    sleep 0.5
done
say "Docker engine is up"
