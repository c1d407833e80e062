#!/usr/bin/env bash
# Bring up a Docker engine (with gVisor's runsc registered) when none answers.
#
# Idempotent: if `docker info` already answers (a developer laptop, a CI runner
# with Docker), this script touches nothing, except that as root it adds the
# flags the gateway needs to a runsc already registered in daemon.json and then
# reloads dockerd (SIGHUP). Otherwise, as root on Debian, it installs Debian's
# docker.io, runsc and debootstrap, registers runsc as a runtime in
# /etc/docker/daemon.json (merged, never clobbered), removes a stale pid file
# left by an engine that was killed, starts dockerd detached with --bridge=none
# (CIS Docker 5.30: no default bridge) and waits for it.
#
# runsc's flags: --platform=ptrace, --network=none, --oci-seccomp (gVisor applies
# the container's seccomp profile too) and --host-uds=open (a sandbox may connect
# to a host unix socket bound into it: the egress proxy's). A registration that
# lacks the last two gets them; its other flags are kept.
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

# A live process of that name, not a zombie awaiting its reaper nor an unrelated process that reused the pid.
is_live() {
    local pid="$1" name="$2" state comm
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" || return 1
    comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
    [[ "$state" != Z && "$comm" == "$name" ]]
}

engine_answers() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

# Register runsc, merging into an existing daemon.json (never clobbering it); with --amend, only add the
# flags the gateway needs to an existing registration. Prints "changed" when it wrote the file.
register_runsc() {
    local runsc
    runsc="$(command -v runsc || true)"
    [[ -n "$runsc" ]] || return 0
    mkdir -p "$(dirname "$DAEMON_JSON")"
    python3 - "$DAEMON_JSON" "$runsc" "$@" <<'PY' || die "cannot update $DAEMON_JSON"

import json, os, sys
path, runsc, amend = sys.argv[1], sys.argv[2], "--amend" in sys.argv[3:]
try:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    conf = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    conf = {}
if not isinstance(conf, dict):
    sys.exit(f"{path}: not a JSON object")


def name(arg):
    return arg.lstrip("-").split("=", 1)[0]


def host_uds_connects(args):
    """Does runsc let a sandbox connect to a host unix socket? The last --host-uds / --fsgofer-host-uds wins."""
    found = False
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if "=" in arg else None
        if name(arg) == "host-uds":
            value = value if value is not None else (args[i + 1] if i + 1 < len(args) else "")
            found = value in ("open", "all")
        elif name(arg) == "fsgofer-host-uds":
            found = value is None or value.lower() in ("1", "t", "true")
    return found


runtimes = conf.setdefault("runtimes", {})
entry = runtimes.get("runsc")
created = entry is None
if created:
    if amend:
        sys.exit(0)
    # --oci-seccomp: gVisor applies the container's seccomp profile (the policy's) inside the sandbox too;
    # without it the sentry serves ptrace, io_uring, keyctl, ... itself whatever the profile says.
    # --host-uds=open: a sandbox may connect to (never create) a host unix socket bound into it.
    entry = {"path": runsc, "runtimeArgs": ["--platform=ptrace", "--network=none"]}
    runtimes["runsc"] = entry
if not isinstance(entry, dict):
    sys.exit(f"{path}: runtimes.runsc is not a JSON object")
before = [str(a) for a in entry.get("runtimeArgs") or []]
args = list(before)
if "oci-seccomp" not in map(name, args):
    args.append("--oci-seccomp")
if not host_uds_connects(args):
    # (a value given as a separate argument, "--host-uds none", goes with its flag)
    drop = {i for i, a in enumerate(args) if name(a) in ("host-uds", "fsgofer-host-uds")}
    drop |= {i + 1 for i in drop if "=" not in args[i] and name(args[i]) == "host-uds"}
    args = [a for i, a in enumerate(args) if i not in drop] + ["--host-uds=open"]
if args == before and not created:
    sys.exit(0)
entry["runtimeArgs"] = args
tmp = path + ".tmp"
with open(tmp, "w", encoding="utf-8") as fh:
    json.dump(conf, fh, indent=2, sort_keys=True)
    fh.write("\n")
os.replace(tmp, path)
print("changed")
PY
}

# SIGHUP makes dockerd re-read daemon.json (its runtimes included); running containers are not touched.
reload_dockerd() {
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    if ! is_live "$pid" dockerd; then
        say "runsc now gets --host-uds=open and --oci-seccomp from $DAEMON_JSON: reload dockerd (SIGHUP) yourself"
        return 0
    fi
    say "reloading dockerd (pid $pid) for the runsc flags in $DAEMON_JSON"
    kill -HUP "$pid"
    local deadline=$((SECONDS + WAIT_S))
    until docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q -- '--host-uds=open'; do
        ((SECONDS < deadline)) || die "dockerd (pid $pid) did not take up runsc's flags within ${WAIT_S}s after SIGHUP"
        sleep 0.5
    done
}

if engine_answers; then
    changed=""
    if [[ "$(id -u)" == 0 && -f "$DAEMON_JSON" ]] && command -v python3 >/dev/null 2>&1; then
        changed="$(register_runsc --amend)"
    fi
    if [[ "$changed" == changed ]]; then
        reload_dockerd
    else
        say "a Docker engine already answers; nothing to do"
    fi
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

register_runsc >/dev/null

# An engine killed without a clean stop leaves pid files behind: dockerd refuses to start over its own, and
# waits forever for a containerd that its stale pid file names. Remove the ones whose process is gone.
clear_stale() {
    local file="$1" name="$2" pid
    [[ -f "$file" ]] || return 0
    pid="$(cat "$file" 2>/dev/null || true)"
    if is_live "$pid" "$name"; then
        return 1
    fi
    say "removing stale $file (pid ${pid:-?} is not a running $name)"
    rm -f "$file"
}

start_dockerd() {
    command -v dockerd >/dev/null 2>&1 || die "dockerd not found after installation"
    clear_stale /var/run/docker/containerd/containerd.pid containerd || true
    say "starting dockerd --bridge=none (log: $LOG)"
    mkdir -p "$(dirname "$LOG")"
    # setsid + nohup: the engine outlives this script and its session.
    setsid nohup dockerd --bridge=none >>"$LOG" 2>&1 </dev/null &
    DOCKERD_PID=$!
    disown || true
}

DOCKERD_PID=""
if clear_stale "$PIDFILE" dockerd; then
    start_dockerd
else
    DOCKERD_PID="$(cat "$PIDFILE")"
    say "dockerd (pid $DOCKERD_PID) is running but does not answer yet; waiting for it"
fi

deadline=$((SECONDS + WAIT_S))
restarts=0
until engine_answers; do
    if ((SECONDS >= deadline)); then
        tail -n 20 "$LOG" >&2 2>/dev/null || true
        die "the Docker engine did not answer within ${WAIT_S}s (log: $LOG)"
    fi
    if [[ -n "$DOCKERD_PID" ]] && ! is_live "$DOCKERD_PID" dockerd; then
        # it died during start-up (for instance over a stale containerd): clean up and try once more
        ((restarts < 1)) || { tail -n 20 "$LOG" >&2 2>/dev/null || true; die "dockerd exited during start-up (log: $LOG)"; }
        restarts=$((restarts + 1))
        managed="$(cat /var/run/docker/containerd/containerd.pid 2>/dev/null || true)"
        if is_live "$managed" containerd; then kill -9 "$managed" 2>/dev/null || true; fi
        clear_stale "$PIDFILE" dockerd || true
        start_dockerd
    fi
    sleep 0.5
done
say "Docker engine is up"
