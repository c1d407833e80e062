#!/usr/bin/env python3
"""Regenerate gateway/runner/docker/gateway-seccomp.json from the pinned copy of moby's default profile.

    python3 scripts/gen-seccomp.py            # write the profile
    python3 scripts/gen-seccomp.py --check    # exit 1 when the shipped file differs

What is removed, and why, is listed entry by entry in ``gateway.runner.docker.seccomp.NEVER``; the steps of
the derivation are in that module's docstring. To move to a newer moby profile: replace
``scripts/seccomp/moby-default.json`` with the new file, update ``SOURCE`` (commit, sha256), run this script,
and review the diff of the shipped profile.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.runner.docker.seccomp import PROFILE_FILE, SOURCE, derive  # noqa: E402

PINNED = ROOT / "scripts" / "seccomp" / "moby-default.json"
TARGET = ROOT / "gateway" / "runner" / "docker" / PROFILE_FILE


def render() -> str:
    raw = PINNED.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SOURCE["sha256"]:
        raise SystemExit(f"{PINNED} has sha256 {digest}, SOURCE says {SOURCE['sha256']}: update SOURCE")
    return json.dumps(derive(json.loads(raw)), indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET} is out of date: run scripts/gen-seccomp.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
