#!/usr/bin/env bash
# Two builds of a sandbox image from the same mirror, one after the other, under throwaway tags: do they give
# the same image id (and the same layer)? Needs root, debootstrap and the engine, like scripts/build-image.sh.
# The live image (e.g. gateway/sandbox-python:3.11-bookworm) is not touched; both tags are removed at the end.
#
# Usage: bash benchmarks/image-repro.sh [NAME]   (a definition of images/, default sandbox-python; about two
#                                               builds' time: 2-8 minutes on 2 cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${1:-sandbox-python}"
tag="gateway/$name:repro-$$"
ids=()
cleanup() { docker rmi "$tag-a" "$tag-b" >/dev/null 2>&1 || true; }
trap cleanup EXIT
for run in a b; do
    start=$(date +%s)
    id="$(GATEWAY_REBUILD=1 GATEWAY_IMAGE_PINS="${GATEWAY_IMAGE_PINS:-warn}" GATEWAY_BIN=/nonexistent \
        GATEWAY_TAG="$tag-$run" bash "$ROOT/scripts/build-image.sh" "$name" 2> >(grep -v 'no SBOM was recorded' >&2))"
    printf 'build %s: %s (%ss)\n' "$run" "$id" "$(( $(date +%s) - start ))"
    ids+=("$id")
done
if [[ "${ids[0]}" == "${ids[1]}" ]]; then
    printf 'same image id: yes\n'
else
    printf 'same image id: NO\n'
    exit 1
fi
