#!/usr/bin/env bash
# Build the sandbox images locally when they are missing (no registry needed), reproducibly, and record their SBOMs.
#
# One definition per image, images/<name>.conf (a bash fragment: name:tag, the packages debootstrap adds to
# minbase, the image's command and environment, a check that the interpreter and its libraries import, the
# labels); images/<name>.packages pins its package set. Every image has bash (minbase's, essential in Debian)
# and python3 (the gateway's supervisor runs on it), so shell needs no image of its own.
#
# A definition may also take files from wheels (WHEELS: pip requirement lines, each with its --hash=sha256:): the
# Node.js image's node is the upstream build, which Debian does not package with its start-up snapshot. They are
# fetched with `pip download --require-hashes --no-deps --only-binary=:all:` from the package index pip is set to
# use, before debootstrap, and the definition's `customize` copies a file out with `wheel_file`, which lists it in
# /usr/share/agent-gateway/components.json for the SBOM (the wheel's purl and sha256, the file's path and sha256).
#
# Air-gapped by design: each image is made from Debian packages (and the pinned wheels above) with debootstrap (minbase + the definition's
# packages; the Python image takes the full python3: python3-minimal lacks most of the standard library) from
# the apt mirror this machine already uses. Nothing is pulled from an image registry. The image id is printed on
# stdout (one line per image).
#
# Reproducible: the same package set gives the same image id. Every file time
# is clamped to SOURCE_DATE_EPOCH (the newest Debian changelog date of the
# installed packages, so it follows the package set and nothing else), the
# layer tar is sorted with numeric owners, what installing writes that depends
# on the day (logs, caches, shadow password dates) is removed or fixed, and the
# image config is written by scripts/image-archive.py with that time instead
# of `docker import`'s wall clock (an image id is the sha256 of its config).
#
# Pinned: images/<name>.packages lists the packages (name version arch) the
# image is built from. When the mirror serves a different set, the build
# warns and names each difference (GATEWAY_IMAGE_PINS=strict refuses instead;
# GATEWAY_IMAGE_PINS=update re-pins to what was installed).
#
# SBOM: `gateway sbom --image NAME --record` stores the image's CycloneDX SBOM
# under the gateway's state directory, keyed by the image id (gateway doctor
# and the compliance report read it there); also done for an image that is
# already present but has none recorded yet.
#
# Usage: scripts/build-image.sh [IMAGE ...]   (default: sandbox-python, i.e. gateway/sandbox-python:3.11-bookworm)
#        scripts/build-image.sh --all         (every definition in images/, one after the other)
#        scripts/build-image.sh --list        (each definition's name and image, nothing built)
#   IMAGE is a definition's name (sandbox-node) or its image (gateway/sandbox-node:24-bookworm).
# Environment:
#   GATEWAY_IMAGE           the image to build when no argument is given
#   GATEWAY_TAG             load the one image built under this NAME:TAG instead (to compare two builds)
#   GATEWAY_MIRROR          apt mirror URL (default: read from the machine's apt sources)
#   GATEWAY_REBUILD=1       rebuild even if the image exists
#   GATEWAY_IMAGE_PINS      warn (default) | strict | update: what to do when the packages differ from the pins
#   GATEWAY_BIN             the gateway command that records the SBOM (default: .venv/bin/gateway)
#   GATEWAY_QUIET=1         no progress messages (default: quiet unless stderr is a tty)
#   GATEWAY_KEEP_WORK=1     keep the work directory (root file system, layer tar) to compare two builds
#   GATEWAY_PIP_PYTHON      the Python whose pip fetches a definition's WHEELS (default: .venv/bin/python)
set -euo pipefail

SUITE=bookworm
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEFINITIONS="$ROOT/images"
PIN_MODE="${GATEWAY_IMAGE_PINS:-warn}"
GATEWAY_BIN="${GATEWAY_BIN:-$ROOT/.venv/bin/gateway}"

if [[ -z "${GATEWAY_QUIET:-}" ]]; then
    if [[ -t 2 ]]; then GATEWAY_QUIET=0; else GATEWAY_QUIET=1; fi
fi
say() { if [[ "$GATEWAY_QUIET" == 0 ]]; then printf 'build-image: %s\n' "$*" >&2; fi; }
die() { printf 'build-image: error: %s\n' "$*" >&2; exit 1; }

case "$PIN_MODE" in warn|strict|update) ;; *) die "GATEWAY_IMAGE_PINS must be warn, strict or update, got '$PIN_MODE'" ;; esac

# The definitions: NAME IMAGE per line, sorted by name.
definitions() {
    local f
    for f in "$DEFINITIONS"/*.conf; do
        [[ -r "$f" ]] || continue
        printf '%s %s\n' "$(basename "$f" .conf)" "$(IMAGE='' && source "$f" && printf '%s' "$IMAGE")"
    done
}
# The definition an argument names (its name, its image, or its image's repository): "NAME IMAGE".
resolve() {
    local want="$1" name image
    while read -r name image; do
        if [[ "$want" == "$name" || "$want" == "$image" || "$want" == "${image%:*}" ]]; then
            printf '%s %s\n' "$name" "$image"; return 0
        fi
    done < <(definitions)
    die "no image definition for '$want' in ${DEFINITIONS#"$ROOT"/}/ (defined: $(definitions | sed 's/ / = /' | paste -sd ',' | sed 's/,/, /g'))"
}

if [[ "${1:-}" == --list ]]; then definitions; exit 0; fi
if [[ "${1:-}" == --all ]]; then
    [[ $# == 1 ]] || die "--all takes no other argument"
    mapfile -t names < <(definitions | cut -d' ' -f1)
    set -- "${names[@]}"
fi
[[ -z "${GATEWAY_TAG:-}" || $# -le 1 ]] || die "GATEWAY_TAG names one image: give one definition"
if [[ $# -gt 1 ]]; then
    # One after the other, each in its own run of this script (its own work directory, cleanup and exit).
    for want in "$@"; do resolve "$want" >/dev/null; done
    for want in "$@"; do bash "${BASH_SOURCE[0]}" "$want"; done
    exit 0
fi
read -r NAME IMAGE < <(resolve "${1:-${GATEWAY_IMAGE:-sandbox-python}}") || exit 1
INCLUDE='' CMD='' ENV='' WHEELS=''
customize() { :; }
# shellcheck source=/dev/null
source "$DEFINITIONS/$NAME.conf"
IMAGE="${GATEWAY_TAG:-$IMAGE}"
[[ -n "$INCLUDE" && -n "$CMD" ]] || die "${DEFINITIONS#"$ROOT"/}/$NAME.conf must set INCLUDE and CMD"
declare -F check >/dev/null && declare -F labels >/dev/null \
    || die "${DEFINITIONS#"$ROOT"/}/$NAME.conf must define the functions check and labels"
PINS="$DEFINITIONS/$NAME.packages"

docker info >/dev/null 2>&1 || die "no Docker engine answers: run scripts/setup-engine.sh first"

# The SBOM is keyed by the image id, so it is recorded for whatever image the tag names now.
record_sbom() {
    if [[ ! -x "$GATEWAY_BIN" ]]; then
        printf 'build-image: warning: %s is missing, so no SBOM was recorded for %s (run scripts/setup.sh)\n' \
            "$GATEWAY_BIN" "$IMAGE" >&2
        return 0
    fi
    local where
    where="$("$GATEWAY_BIN" sbom --image "$IMAGE" --record)" || die "recording the SBOM of $IMAGE failed"
    say "SBOM: $where"
}

# Where `gateway sbom --record` puts an image's SBOM: the rule of gateway/sbom.py's default_state_dir, restated
# here because importing the gateway costs seconds (tests/unit/core/test_supply_chain.py checks that both agree).
state_dir() {
    if [[ -n "${GATEWAY_STATE_DIR:-}" ]]; then printf '%s\n' "$GATEWAY_STATE_DIR"
    elif [[ "$(id -u)" == 0 ]]; then printf '%s\n' /var/lib/agent-gateway
    else printf '%s/agent-gateway\n' "${XDG_STATE_HOME:-$HOME/.local/state}"; fi
}
sbom_recorded() { [[ -s "$(state_dir)/sbom/${1#sha256:}.cdx.json" ]]; }

if [[ -z "${GATEWAY_REBUILD:-}" ]] && id="$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null)"; then
    say "$IMAGE already present"
    sbom_recorded "$id" || record_sbom
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
cleanup() { if [[ -z "${GATEWAY_KEEP_WORK:-}" ]]; then rm -rf --one-file-system "$WORK"; else printf "build-image: kept %s\n" "$WORK" >&2; fi; }
trap cleanup EXIT
ROOTFS="$WORK/rootfs"

# The definition's wheels, hash-checked by pip (a wheel whose sha256 differs from its pin is refused).
if [[ -n "$WHEELS" ]]; then
    PIP_PYTHON="${GATEWAY_PIP_PYTHON:-$ROOT/.venv/bin/python}"
    [[ -x "$PIP_PYTHON" ]] || PIP_PYTHON="$(command -v python3 || true)"
    "$PIP_PYTHON" -m pip --version >/dev/null 2>&1 \
        || die "${DEFINITIONS#"$ROOT"/}/$NAME.conf needs wheels, and no pip was found to fetch them: run scripts/setup.sh (it makes .venv) or set GATEWAY_PIP_PYTHON"
    printf '%s\n' "$WHEELS" >"$WORK/wheels.txt"
    say "pip download (hash-checked): $(grep -o '^[^ ]*' "$WORK/wheels.txt" | paste -sd ' ')"
    if ! "$PIP_PYTHON" -m pip download --disable-pip-version-check -q --no-deps --require-hashes \
        --only-binary=:all: -d "$WORK/wheels" -r "$WORK/wheels.txt" >"$WORK/pip.log" 2>&1; then
        tail -n 20 "$WORK/pip.log" >&2 || true
        die "fetching the wheels of ${DEFINITIONS#"$ROOT"/}/$NAME.conf failed (see pip's output above)"
    fi
fi
# For a definition's customize: copy MEMBER of DISTRIBUTION's wheel to DEST in the root file system, listed as the
# SBOM component NAME (scripts/wheel-file.py).
wheel_file() {
    [[ $# == 4 ]] || die "wheel_file takes DISTRIBUTION MEMBER DEST NAME"
    python3 "$ROOT/scripts/wheel-file.py" "$WORK/wheels" "$1" "$2" "$ROOTFS" "$3" "$4"
}

say "debootstrap $SUITE (minbase + $INCLUDE) into $ROOTFS for $IMAGE (a minute or more)"
if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
    tail -n 30 "$WORK/debootstrap.log" >&2 || true
    die "debootstrap failed (mirror from apt sources: see log above)"
fi
[[ -x "$ROOTFS/usr/bin/python3" ]] || die "python3 (the supervisor's interpreter) is missing from the new root file system"
customize "$ROOTFS" || die "customize in ${DEFINITIONS#"$ROOT"/}/$NAME.conf failed for $IMAGE"
check "$ROOTFS" || die "the check of ${DEFINITIONS#"$ROOT"/}/$NAME.conf failed: $IMAGE lacks what it is for"
LABELS="$(labels "$ROOTFS")" || die "the labels of ${DEFINITIONS#"$ROOT"/}/$NAME.conf failed"

# What installing wrote that depends on the day or the run rather than on the packages.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/lib/apt/lists/* \
    "$ROOTFS"/var/log/* "$ROOTFS"/var/cache/ldconfig/aux-cache "$ROOTFS"/var/lib/dpkg/*-old \
    "$ROOTFS"/var/cache/debconf/*-old "$ROOTFS"/etc/*- "$ROOTFS"/etc/machine-id "$ROOTFS"/debootstrap
# SOURCE_DATE_EPOCH: the newest changelog among the installed packages (their files keep the packages' times).
EPOCH="$(find "$ROOTFS/usr/share/doc" -name 'changelog.Debian.gz' -printf '%T@\n' | sort -n | tail -n 1 | cut -d. -f1)"
[[ "$EPOCH" =~ ^[0-9]+$ ]] || die "no Debian changelog found to derive SOURCE_DATE_EPOCH from"
export SOURCE_DATE_EPOCH="$EPOCH"
# Password change dates in /etc/shadow are days since 1970 at install time: set them to the epoch's day.
if [[ -f "$ROOTFS/etc/shadow" ]]; then
    awk -v day="$((EPOCH / 86400))" 'BEGIN { FS = OFS = ":" } { if ($3 != "") $3 = day; print }' \
        "$ROOTFS/etc/shadow" >"$WORK/shadow" && cat "$WORK/shadow" >"$ROOTFS/etc/shadow"
fi

# The package set against the pins in the repository.
dpkg-query --admindir="$ROOTFS/var/lib/dpkg" -W -f '${Package} ${Version} ${Architecture}\n' | LC_ALL=C sort >"$WORK/packages"
pinned() { grep -v '^#' "$PINS" | grep -v '^[[:space:]]*$' | LC_ALL=C sort; }
if [[ "$PIN_MODE" == update || ! -f "$PINS" ]]; then
    mkdir -p "$(dirname "$PINS")"
    {
        printf '# The Debian packages %s is built from (name version architecture), as\n' "${IMAGE%:*}"
        printf '# scripts/build-image.sh installed them from %s (debootstrap minbase + %s).\n' "$SUITE" "${INCLUDE//,/ }"
        printf '# A build that gets another set warns (GATEWAY_IMAGE_PINS=strict refuses); re-pin with\n'
        printf '# GATEWAY_IMAGE_PINS=update GATEWAY_REBUILD=1 bash scripts/build-image.sh %s\n' "$NAME"
        cat "$WORK/packages"
    } >"$PINS"
    say "pinned $(wc -l <"$WORK/packages") packages in ${PINS#"$ROOT"/}"
elif ! diff <(pinned) "$WORK/packages" >"$WORK/pins.diff"; then
    changes="$(grep '^[<>]' "$WORK/pins.diff" | sed 's/^</pinned:/; s/^>/served:/' | paste -sd ';' | sed 's/;/; /g')"
    if [[ "$PIN_MODE" == strict ]]; then
        die "the mirror no longer serves the pinned package set (${PINS#"$ROOT"/}): $changes"
    fi
    printf 'build-image: warning: the mirror serves another package set than %s pins, so this image differs from the pinned one: %s (re-pin: GATEWAY_IMAGE_PINS=update GATEWAY_REBUILD=1 bash scripts/build-image.sh %s)\n' \
        "${PINS#"$ROOT"/}" "$changes" "$NAME" >&2
fi

say "layer: sorted tar, times clamped to SOURCE_DATE_EPOCH=$EPOCH"
tar --format=gnu --sort=name --numeric-owner --mtime="@$EPOCH" --clamp-mtime -C "$ROOTFS" -cf "$WORK/layer.tar" .
label_args=()
while IFS= read -r label; do [[ -z "$label" ]] || label_args+=("io.agent-gateway.$label"); done <<<"$LABELS"
env_args=()
for setting in $ENV; do env_args+=(--env "$setting"); done
python3 "$ROOT/scripts/image-archive.py" "${env_args[@]}" --cmd "$CMD" \
    --history "scripts/build-image.sh: debootstrap minbase + ${INCLUDE//,/ }${WHEELS:+; wheels: $(grep -o '^[^ ]*' <<<"$WHEELS" | paste -sd ' ')}" \
    "$WORK/layer.tar" "$IMAGE" "$EPOCH" "$WORK/image.tar" \
    "io.agent-gateway.image=$NAME" io.agent-gateway.built-by=scripts/build-image.sh \
    "io.agent-gateway.suite=$SUITE" "${label_args[@]}" >"$WORK/id" || die "writing the image archive failed"
id="$(cat "$WORK/id")"
say "docker load as $IMAGE"
docker load -i "$WORK/image.tar" >/dev/null || die "docker load failed"
[[ "$(docker image inspect --format '{{.Id}}' "$IMAGE")" == "$id" ]] || die "the engine gave $IMAGE another id than $id"
say "built $IMAGE ($id)"
record_sbom
printf '%s\n' "$id"
