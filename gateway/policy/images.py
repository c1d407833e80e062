"""Image references and the allowlist match: repository plus an allowed tag or a pinned digest.

A reference without a tag and without a digest is refused: ``latest`` is never implied.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.policy.model import ImagesRule

__all__ = ["ImageRef", "image_allowed", "parse_image_ref"]


@dataclass(frozen=True, slots=True)
class ImageRef:
    repository: str
    tag: str | None
    digest: str | None


def parse_image_ref(reference: str) -> ImageRef:
    """Split ``repo[:tag][@sha256:hex]``; a registry port (``host:5000/x``) is not taken for a tag."""
    digest: str | None = None
    name = reference
    if "@" in name:
        name, digest = name.split("@", 1)
    tag: str | None = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    return ImageRef(repository=name, tag=tag, digest=digest)


def image_allowed(rule: ImagesRule, reference: str) -> str | None:
    """None when ``reference`` is allowed; otherwise what is wrong with it, in one sentence."""
    ref = parse_image_ref(reference)
    if ref.tag is None and ref.digest is None:
        return f"image {reference!r} has no tag or digest; 'latest' is never implied"
    entries = [e for e in rule.allow if e.repository == ref.repository]
    if not entries:
        allowed = ", ".join(sorted({e.repository for e in rule.allow}))
        return f"repository {ref.repository!r} is not on the allowlist ({allowed})"
    for entry in entries:
        if ref.digest is not None:
            if ref.digest in entry.digests and (ref.tag is None or not entry.tags or ref.tag in entry.tags):
                return None
        elif ref.tag in entry.tags:
            return None
    if ref.digest is not None:
        return f"digest {ref.digest} of {ref.repository!r} is not pinned in the allowlist"
    tags = sorted({t for e in entries for t in e.tags})
    return f"tag {ref.tag!r} of {ref.repository!r} is not allowed (allowed tags: {', '.join(tags) or 'none'})"
