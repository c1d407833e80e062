#!/usr/bin/env bash
# Build the sandbox image locally when it is missing (no registry needed).
#
# Air-gapped by design: the image is made from Debian packages with debootstrap
# (minbase + the full python3: python3-minimal lacks most of the standard
# library) from the apt mirror this machine already uses, then `docker import`ed.
# Nothing is pulled from an image registry. The image id is printed on stdout
# (and the build date, mirror suite and builder are stored as image labels) so
# it can be recorded and pinned.
#
# Usage: scripts/build-image.sh [NAME:TAG]      (default gateway/sandbox-python:3.11-bookworm)
# Environment:
#   GATEWAY_IMAGE           image name (overridden by the argument)
#   GATEWAY_MIRROR          apt mirror URL (default: read from the machine's apt sources)
#   GATEWAY_REBUILD=1       rebuild even if the image exists
#   GATEWAY_QUIET=1         no progress messages (default: quiet unless stderr is a tty)
set -euo pipefail

IMAGE="${1:-${GATEWAY_IMAGE:-gateway/sandbox-python:3.11-bookworm}}"
SUITE=bookworm

if [[ -z "${GATEWAY_QUIET:-}" ]]; then
    if [[ -t 2 ]]; then GATEWAY_QUIET=0; else GATEWAY_QUIET=1; fi
fi
say() { if [[ "$GATEWAY_QUIET" == 0 ]]; then printf 'build-image: %s\n' "$*" >&2; fi; }
die() { printf 'build-image: error: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || die "no Docker engine answers: run scripts/setup-engine.sh first"

if [[ -z "${GATEWAY_REBUILD:-}" ]] && id="$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null)"; then
    say "$IMAGE already present"
    printf '%s\n' "$id"
    exit 0
fi

[[ "$(id -u)" == 0 ]] || die "building $IMAGE needs root (debootstrap); run: sudo $0"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap is missing: run scripts/setup-engine.sh or apt-get install debootstrap"

# The mirror this machine's apt already uses (deb822 sources first, then the one-line format).
find_mirror() {
    local f uri
    for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources; do
        [[ -r "$f" ]] || continue
        # deb822 stanzas: the first URI of a stanza whose Suites include the plain suite.
        uri="$(awk -v suite="$SUITE" '
            function flush() { if (!done && uri != "" && ok) { print uri; done=1 } uri=""; ok=0 }
            /^[[:space:]]*$/ { flush(); next }
            tolower($1) == "uris:" { uri=$2 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) ok=1 }
            END { flush() }
        ' "$f")"
        if [[ -n "$uri" ]]; then printf '%s\n' "$uri"; return 0; fi
    done
    return 0
}
find_mirror_list() {
    [[ -r /etc/apt/sources.list ]] || return 0
    awk -v suite="$SUITE" '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($(i+1) == suite && !done) { print $i; done=1 } } }' /etc/apt/sources.list
}
MIRROR="${GATEWAY_MIRROR:-}"
[[ -n "$MIRROR" ]] || MIRROR="$(find_mirror)"
[[ -n "$MIRROR" ]] || MIRROR="$(find_mirror_list)"
[[ -n "$MIRROR" ]] || die "no apt mirror for '$SUITE' found in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list; set GATEWAY_MIRROR"

WORK="$(mktemp -d /var/tmp/gateway-rootfs.XXXXXX)"
cleanup() { rm -rf --one-file-system "$WORK"; }
trap cleanup EXIT
ROOTFS="$WORK/rootfs"

say "debootstrap $SUITE (minbase + python3) into $ROOTFS (about a minute)"
if ! debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
    tail -n 30 "$WORK/debootstrap.log" >&2 || true
    die "debootstrap failed (mirror from apt sources: see log above)"
fi
[[ -x "$ROOTFS/usr/bin/python3" ]] || die "python3 is missing from the new root file system"
chroot "$ROOTFS" /usr/bin/python3 -c 'import json, tarfile, base64, ctypes' \
    || die "the image's python3 lacks part of the standard library"

# Trim what a sandbox never needs: package caches and lists.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/log/*.log
PYVER="$(chroot "$ROOTFS" /usr/bin/python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"

say "docker import as $IMAGE"
id="$(tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'USER 65534:65534' \
    --change 'WORKDIR /workspace' \
    --change 'CMD ["python3"]' \
    --change "LABEL io.agent-gateway.image=sandbox-python io.agent-gateway.built-by=scripts/build-image.sh io.agent-gateway.suite=$SUITE io.agent-gateway.python=$PYVER" \
    --message "gateway sandbox: debootstrap $SUITE minbase + python3 $PYVER" \
    - "$IMAGE")" || die "docker import failed"
say "built $IMAGE ($id)"
printf '%s\n' "$id"
