"""Language, image, files, network, runtime and user: one small rule each."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gateway.decision.rules.base import Context, Finding, Rule, fail, ok, skip
from gateway.payload import file_name_problems
from gateway.policy.images import image_allowed
from gateway.policy.model import EGRESS

if TYPE_CHECKING:
    from gateway.egress.addresses import Destination

__all__ = ["RULES"]


def _one_of(what: str, path: str, got: str, allowed: list[str], verb: str = "allowed") -> Finding:
    """``got`` must be one of ``allowed``."""
    if got in allowed:
        return ok(path, got, allowed, f"{what} {got!r} is {verb}")
    return fail(path, got, allowed, f"{what} {got!r} is not {verb} (allowed: {allowed})")


def _language(ctx: Context) -> Iterator[Finding]:
    yield _one_of("language", "$.language", ctx.settings.language, list(ctx.policy.languages.allowed), "supported")


def _language_image(ctx: Context) -> Iterator[Finding]:
    language = ctx.settings.language
    rule = ctx.policy.languages.images_of(language)
    if rule is None:
        yield skip("$.image", f"the policy names no images of its own for {language!r}: spec.images applies")
        return
    image = ctx.settings.profile.image
    expected = {"language": language, "allow": [{"repository": e.repository, "tags": list(e.tags),
                                                  "digests": list(e.digests)} for e in rule.allow]}  # fmt: skip
    why = image_allowed(rule, image)
    if why is None:
        yield ok("$.image", image, expected, f"image {image!r} may run {language}")
    else:
        yield fail("$.image", image, expected, f"image {image!r} may not run {language}: {why}")


def _images(ctx: Context) -> Iterator[Finding]:
    image = ctx.settings.profile.image
    expected = list(ctx.compiled.images_expected)
    why = image_allowed(ctx.policy.images, image)
    if why is None:
        yield ok("$.image", image, expected, f"image {image!r} is allowed")
    else:
        yield fail("$.image", image, expected, why)


_FILES_EXPECTED = "relative path without '..', NUL, backslash, empty components or reserved names"


def _files(ctx: Context) -> Iterator[Finding]:
    files = ctx.request.files
    if not files:
        yield skip("$.files", "no files sent")
        return
    bad = False
    for name, why in file_name_problems(files):
        bad = True
        # The payload refuses such a name too (one check, gateway/payload.py): denied even in audit mode.
        yield fail(f"$.files[{name!r}]", name, _FILES_EXPECTED, f"file name {name!r} {why}", never_relaxed=True)
    count = len(files)
    max_count = ctx.policy.files.max_count
    if count > max_count:
        bad = True
        yield fail("$.files", count, {"max_count": max_count}, f"{count} files sent; at most {max_count} allowed")
    if not bad:
        yield ok("$.files", count, _FILES_EXPECTED, f"{count} file name(s) are safe")


def _network(ctx: Context) -> Iterator[Finding]:
    got = ctx.settings.profile.network
    allowed = list(ctx.policy.network.allowed)
    egress = ctx.policy.network.egress
    if got == "host" or got.startswith("container:"):
        yield fail("$.network", got, allowed, f"network {got!r} can never be allowed", never_relaxed=True)
    elif got == EGRESS and egress is None:
        message = "network 'egress' is not allowed: the policy lists no egress destinations (spec.network.egress)"
        yield fail("$.network", got, [*allowed, "egress (with spec.network.egress)"], message, never_relaxed=True)
    elif got == EGRESS:
        assert egress is not None  # noqa: S101 -- the branch above
        count = len(egress.allow)
        yield ok("$.network", got, [*allowed, EGRESS], f"network 'egress' is allowed ({count} destination(s))")
    else:
        yield _one_of("network", "$.network", got, allowed)


def _show_destination(destination: Destination) -> dict[str, object]:
    return {"host": destination.host, "ports": list(destination.ports)}


def _egress(ctx: Context) -> Iterator[Finding]:
    asks = ctx.request.egress
    network = ctx.settings.profile.network
    resolved = ctx.settings.egress
    if network != EGRESS:
        if asks is not None:
            message = f"an egress list was given but the network is {network!r}; ask for network egress with it"
            yield fail("$.egress", len(asks), {"network": EGRESS}, message, never_relaxed=True)
        else:
            yield skip("$.egress", f"network {network!r}: no egress")
        return
    if resolved is None:
        yield skip("$.egress", "the policy lists no egress destinations (rule network.mode)")
        return
    rule = ctx.policy.network.egress
    expected = [_show_destination(d) for d in rule.allow] if rule is not None else []
    for index, why in resolved.outside:
        assert asks is not None  # noqa: S101 -- only a request's own list has destinations outside
        got = {"host": asks[index].host, "ports": list(asks[index].ports)}
        yield fail(f"$.egress[{index}]", got, expected, f"{why}; a request may narrow the list, never widen it")
    if not resolved.outside:
        hosts = ", ".join(f"{d.host}:{','.join(map(str, d.ports))}" for d in resolved.destinations)
        what = "the policy's list" if asks is None else "within the policy's list"
        got_list = [_show_destination(d) for d in resolved.destinations]
        yield ok("$.egress", got_list, expected, f"the run may reach {hosts} ({what})")


def _runtime_allowed(ctx: Context) -> Iterator[Finding]:
    yield _one_of("runtime", "$.runtime", ctx.settings.profile.runtime, list(ctx.policy.runtime.allowed))


def _runtime_required(ctx: Context) -> Iterator[Finding]:
    required = ctx.policy.runtime.required
    if required is None:
        yield skip("$.runtime", "the policy requires no particular runtime")
        return
    got = ctx.settings.profile.runtime
    if got == required:
        yield ok("$.runtime", got, required, f"runtime {got!r} is the required {required!r}")
    else:
        yield fail("$.runtime", got, required, f"runtime {got!r} is not the required {required!r}")


def _user(ctx: Context) -> Iterator[Finding]:
    user = ctx.policy.user
    got = f"{user.uid}:{user.gid}"
    if user.uid != 0 and user.gid != 0:
        yield ok("$", got, "uid and gid not 0", "runs as a non-root user")
    else:
        yield fail("$", got, "uid and gid not 0", "the policy user is root")


RULES: tuple[Rule, ...] = (
    Rule(
        "language.supported", _language, lambda p: p.languages.mode, "$.language",
        checks="the request's language is one the policy allows",
        setting="$.spec.languages", audit="warn",
        example="language 'ruby' is not supported (allowed: ['python'])",
    ),
    Rule(
        "images.allowlist", _images, lambda p: p.images.mode, "$.image",
        checks="the image's repository is listed with the requested tag or pinned digest (or local image id)",
        setting="$.spec.images", audit="warn",
        never_relaxed="nothing is pulled unless the policy says pull: if-missing; a digest pin is still checked "
        "against the engine before create",
        example="tag 'latest' of 'gateway/sandbox-python' is not allowed (allowed tags: 3.11-bookworm)",
    ),
    Rule(
        "language.image", _language_image, lambda p: p.languages.mode, "$.image",
        checks="the image is one of those the policy allows for the request's language (spec.languages.images), "
        "when it names any for that language",
        setting="$.spec.languages.images", audit="warn",
        example="image 'gateway/sandbox-python:3.11-bookworm' may not run javascript: repository "
        "'gateway/sandbox-python' is not on the allowlist (gateway/sandbox-node)",
    ),
)  # fmt: skip
"""Judged before the limits (the order results appear in a decision)."""

LATER_RULES: tuple[Rule, ...] = (
    Rule(
        "files.path", _files, lambda p: p.files.mode, "$.files",
        checks="file names are safe relative paths, and no more files are sent than files.max_count",
        setting="$.spec.files", audit="warn",
        never_relaxed="an unsafe file name (absolute, '..', NUL, backslash, empty components, reserved names)",
        example="65 files sent; at most 64 allowed",
    ),
    Rule(
        "network.mode", _network, lambda p: p.network.mode, "$.network",
        checks="the network is one the policy allows; 'egress' only when the policy lists egress destinations",
        setting="$.spec.network", audit="warn",
        never_relaxed="host networking and container:* networks; 'egress' without spec.network.egress",
        example="network 'bridge' is not allowed (allowed: ['none'])",
    ),
    Rule(
        "network.egress", _egress, lambda p: p.network.egress.mode if p.network.egress else p.network.mode, "$.egress",
        checks="with network egress, each destination the request lists (host and every port) is within the "
        "policy's egress list; the run may reach exactly the resolved list (the decision's plan.egress)",
        setting="$.spec.network.egress", audit="warn",
        never_relaxed="a destination outside the list is never added to the run's (audit mode only warns about "
        "it); an egress list without network egress",
        example="host 'pypi.org' is not within any host of the policy's egress list; a request may narrow the "
        "list, never widen it",
    ),
    Rule(
        "runtime.allowed", _runtime_allowed, lambda p: p.runtime.mode, "$.runtime",
        checks="the OCI runtime (runc, runsc) is one the policy allows",
        setting="$.spec.runtime.allowed", audit="warn",
        example="runtime 'runsc' is not allowed (allowed: ['runc'])",
    ),
    Rule(
        "runtime.required", _runtime_required, lambda p: p.runtime.mode, "$.runtime",
        checks="the runtime is the one the policy requires, when it requires one",
        setting="$.spec.runtime.required", audit="warn",
        example="runtime 'runc' is not the required 'runsc'",
    ),
    Rule(
        "user.non_root", _user, lambda _p: "enforce", "$",
        checks="the policy's user is not root (uid and gid not 0)",
        setting="$.spec.user",
        never_relaxed="always enforced",
        example="the policy user is root",
    ),
)  # fmt: skip
"""Judged after the limits."""
