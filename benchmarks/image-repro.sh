#!/usr/bin/env bash
# Two builds of the sandbox image from the same mirror, one after the other, under throwaway tags: do they give
# the same image id (and the same layer)? Needs root, debootstrap and the engine, like scripts/build-image.sh.
# The live image (gateway/sandbox-python:3.11-bookworm) is not touched; both tags are removed at the end.
#
# Usage: bash benchmarks/image-repro.sh          (about two builds' time: 3-6 minutes on 2 cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tag="gateway/sandbox-python:repro-$$"
ids=()
cleanup() { docker rmi "$tag-a" "$tag-b" >/dev/null 2>&1 || true; }
trap cleanup EXIT
for run in a b; do
    start=$(date +%s)
    id="$(GATEWAY_REBUILD=1 GATEWAY_IMAGE_PINS="${GATEWAY_IMAGE_PINS:-warn}" GATEWAY_BIN=/nonexistent \
        bash "$ROOT/scripts/build-image.sh" "$tag-$run" 2> >(grep -v 'no SBOM was recorded' >&2))"
    printf 'build %s: %s (%ss)\n' "$run" "$id" "$(( $(date +%s) - start ))"
    ids+=("$id")
done
if [[ "${ids[0]}" == "${ids[1]}" ]]; then
    printf 'same image id: yes\n'
else
    printf 'same image id: NO\n'
    exit 1
fi
