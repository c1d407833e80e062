"""The Kubernetes runner: one hardened, single-use Pod per execution, the same life as a Docker sandbox.

``prepare``
    guard the decision's options again (``pod.guard``); create the Pod exactly as recorded (its name is the
    decision's, so a create retried after a lost answer meets its own Pod: 409 is adopted only when the Pod
    there carries this decision's and this instance's labels); watch it (from the create's resourceVersion; a
    410 Gone re-reads the Pod and watches again) until its container runs. A container waiting on an image it
    may not pull (``imagePullPolicy: Never``) is ``ImageMissingError``; a Pod not running within
    ``start_timeout_s`` (unschedulable, quota) is a ``SandboxError`` with the scheduler's reason. Then attach to
    the container's stdin / stdout / stderr: the supervisor (PID 1) waits for its one payload there.
``run``
    send the payload (the supervisor and its framed, authenticated protocol are every backend's:
    ``runner/supervisor.py``, ``runner/frames.py``) and read the attach session one WebSocket message at a time:
    stdout carries the supervisor's verified frames, capped per stream (``frames.take_frame``); a monotonic
    deadline covers the whole read; a flood, the deadline, a cancel or a raising callback closes the session
    (the supervisor's stdin closes: it kills everything) and deletes the Pod. A run that ends without a final
    frame reads the Pod's status: the kubelet's ``OOMKilled`` and the eviction (``Evicted``) are reported as such
    (``oom_killed``; ``resource_killed`` with ``sandbox.reason``). The Pod is deleted in ``finally``, always.

``open_kernel``
    a session's kernel: a Pod made by ``prepare`` from the decision's manifest exactly as a run's, whose
    supervisor runs in kernel mode and takes cells until the kernel is closed (``runner/kubernetes/kernel.py``).

The outcome names the Pod (``Outcome.sandbox``: namespace, name, uid, the manifest's sha256), so the outcome
record carries the digest the decision record holds and the uid the API server gave the Pod.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gateway.decision.settings import SandboxProfile
from gateway.errors import (
    CancelledRunError,
    ContainerLeftError,
    GatewayError,
    ImageMissingError,
    OutputCallbackError,
    SandboxError,
    UnsafeOptionsError,
)
from gateway.runner.frames import (
    KERNEL_GRACE_S,
    Collected,
    FrameDecoder,
    ProtocolError,
    outcome_of,
    read_timeout,
    take_frame,
)
from gateway.runner.interface import OnGone, OnOutput, Outcome, Payload, RunSpec, prepare_and_run
from gateway.runner.kubernetes.client import Attach, Gone, KubeClient, KubeConfig
from gateway.runner.kubernetes.kernel import KubernetesKernel
from gateway.runner.kubernetes.pod import (
    CONTAINER_NAME,
    DECISION_LABEL,
    INSTANCE_LABEL,
    MANAGED_LABEL,
    START_MARGIN_S,
    KubernetesAssembler,
    guard,
    label_value,
    pod_digest,
    pool_key,
    pooled_pod,
    profile_part,
)
from gateway.runner.supervisor import encode_payload, new_key
from gateway.slots import Slot

__all__ = ["EXPIRY_GRACE_S", "KubernetesRunner", "KubernetesSandbox"]

EXPIRY_GRACE_S = 60
"""Seconds past a Pod's ``activeDeadlineSeconds`` (from its creation) after which any reaper deletes it."""
_IMAGE_REASONS = frozenset({"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
_FAILED_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
_DIAG_BYTES = 4096
_SETTLE_S = 10.0
"""How long a run that ended without a final frame waits for the kubelet to say why (OOMKilled, Evicted)."""


@dataclass(eq=False)
class KubernetesSandbox:
    """A running Pod whose supervisor waits for one payload on the attach session. Used once, then deleted."""

    spec: RunSpec
    namespace: str
    name: str
    uid: str
    digest: str
    attach: Attach | None = field(repr=False, default=None)
    container_id: str | None = None
    image_id: str | None = None
    used: bool = False
    created_with: Mapping[str, Any] | None = None
    """For a warm pool's Pod: the exact options (manifest and digest) it was created with, re-guarded at claim."""

    def names(self, reason: str | None = None) -> dict[str, str]:
        out = {"namespace": self.namespace, "pod": self.name, "pod_uid": self.uid, "pod_sha256": self.digest}
        if reason:
            out["reason"] = reason
        return out


class KubernetesRunner:
    """Runs payloads in hardened single-use Pods through the Kubernetes API.

    ``client`` is injectable; otherwise one is made from ``config`` (namespace, kubeconfig or in-cluster).
    ``instance`` names this gateway on every Pod (default ``$GATEWAY_INSTANCE``: in the shipped Deployment,
    the gateway Pod's own name), so :meth:`reap` deletes its own Pods and expired ones, never another live
    gateway's.
    """

    def __init__(
        self, client: KubeClient | None = None, *, config: KubeConfig | None = None, instance: str | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:  # fmt: skip
        self.client = client or KubeClient(config)
        self.namespace = self.client.config.namespace
        self.instance = instance or os.environ.get("GATEWAY_INSTANCE") or f"gateway-{os.getpid()}"
        self.start_timeout_s = start_timeout_s
        self.assembler = KubernetesAssembler(namespace=self.namespace, instance=self.instance)
        """Builds and guards the Pods; the Gateway hands it to the decision."""

    def close(self) -> None:
        self.client.close()

    def image_id(self, image: str) -> str | None:
        """The reference itself once the API server answers (``GET /readyz``'s engine check): images live on the
        nodes, not behind the API, so whether a node has it is known only when a Pod starts there (a missing
        image is then ``ImageMissingError``; the outcome carries the node's image id)."""
        self.client.list_pods(self.namespace, f"{MANAGED_LABEL}=true")
        return image

    # -- prepare ---------------------------------------------------------------------------------------

    def prepare(self, spec: RunSpec) -> KubernetesSandbox:
        return self._start(spec, dict(spec.options))

    def _start(self, spec: RunSpec, options: dict[str, Any], *, pooled: bool = False) -> KubernetesSandbox:
        """Guard, create, watch until running, attach: a Pod whose supervisor waits for its payload."""
        guard(options)
        pod: Mapping[str, Any] = options["pod"]
        namespace = str(options["namespace"])
        name = str(pod["metadata"]["name"])
        created = self._create(namespace, pod)  # a Pod that is not ours (409) is never touched
        try:
            running = self._wait_running(namespace, name, created)
            status = _container_status(running)
            box = KubernetesSandbox(
                spec=spec, namespace=namespace, name=name, uid=str(running["metadata"].get("uid", "")),
                digest=str(options["pod_sha256"]), container_id=status.get("containerID"),
                image_id=status.get("imageID"), created_with=options if pooled else None,
            )  # fmt: skip
            box.attach = self.client.attach(namespace, name, CONTAINER_NAME)
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.delete_pod(namespace, name)
            raise
        return box

    def _create(self, namespace: str, pod: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return self.client.create_pod(namespace, pod)
        except SandboxError as exc:
            if _status(exc) != 409:
                raise
            # The name is the decision's: a Pod already there is ours only if a retried create made it.
            found = self.client.read_pod(namespace, str(pod["metadata"]["name"]))
            labels = (found or {}).get("metadata", {}).get("labels") or {}
            wanted = pod["metadata"]["labels"]
            if found is None or any(labels.get(k) != wanted[k] for k in (DECISION_LABEL, INSTANCE_LABEL)):
                raise SandboxError(
                    f"a Pod named {pod['metadata']['name']} already exists and is not this decision's; nothing ran"
                ) from exc
            return found

    def _wait_running(self, namespace: str, name: str, pod: dict[str, Any]) -> dict[str, Any]:
        """Watch the Pod until its container runs; raise on a start it will never make."""
        deadline = time.monotonic() + self.start_timeout_s
        version = str(pod.get("metadata", {}).get("resourceVersion", ""))
        while True:
            if self._start_state(namespace, name, pod) == "running":
                return pod
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError(
                    f"the Pod {name} was not running after {self.start_timeout_s:g} s: {_pending_reason(pod)}",
                    hint="check the nodes' capacity and the namespace's quota; the Pod was deleted",
                )
            try:
                for event in self.client.watch_pod(namespace, name, version, timeout_s=left):
                    obj = event.get("object") or {}
                    if event.get("type") == "DELETED":
                        raise SandboxError(f"the Pod {name} was deleted before it started; nothing ran")
                    if isinstance(obj, dict) and obj.get("metadata"):
                        pod = obj
                        version = str(obj["metadata"].get("resourceVersion", version))
                    if self._start_state(namespace, name, pod) != "pending" or time.monotonic() >= deadline:
                        break
            except Gone:
                fresh = self.client.read_pod(namespace, name)
                if fresh is None:
                    raise SandboxError(f"the Pod {name} disappeared before it started; nothing ran") from None
                pod = fresh
                version = str(fresh.get("metadata", {}).get("resourceVersion", ""))

    def _start_state(self, namespace: str, name: str, pod: Mapping[str, Any]) -> str:
        """``_start_state``, with the tail of the container's log added when it ended before the hand-over."""
        try:
            return _start_state(pod, name)
        except ImageMissingError:
            raise
        except SandboxError as exc:
            if "ended before" not in exc.message:
                raise
            try:
                tail = self.client.read_log(namespace, name, limit_bytes=_DIAG_BYTES).decode("utf-8", "replace")
            except GatewayError:
                tail = ""
            raise SandboxError(exc.message + (f"; its log: {tail.strip()!r}" if tail.strip() else "")) from exc

    # -- kernels (gateway.runner.interface.KernelRunner) -----------------------------------------------------

    def open_kernel(
        self, spec: RunSpec, *, files: Mapping[str, bytes] | None = None, slot: Slot | None = None,
        grace_s: float = KERNEL_GRACE_S,
    ) -> KubernetesKernel:  # fmt: skip
        """A kernel in a Pod made exactly as a run's (see ``gateway.runner.interface.KernelRunner``):
        ``spec.timeout_s`` is its lifetime, and the Pod's ``activeDeadlineSeconds`` must cover it plus
        ``START_MARGIN_S`` (a decision assembled with the lifetime as its timeout), so that the kubelet and the
        reapers end the Pod only after the kernel's own end."""
        try:
            _check_lifetime(spec)
            sandbox = self.prepare(spec)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        sandbox.used = True  # a kernel's Pod never takes a run's payload
        try:
            kernel = KubernetesKernel(self, sandbox, slot, grace_s)
        except BaseException:
            self.discard(sandbox)
            if slot is not None:
                slot.release()
            raise
        try:
            kernel.start(dict(files or {}))
        except BaseException:
            with contextlib.suppress(Exception):
                kernel.close()
            raise
        return kernel

    # -- the warm pool (gateway.runner.interface.PoolingRunner) --------------------------------------------

    def pool_key(self, profile: SandboxProfile) -> str:
        return pool_key(profile, namespace=self.namespace, instance=self.instance)

    def prepare_idle(self, profile: SandboxProfile, *, ttl_s: float) -> KubernetesSandbox:
        """A running Pod of ``profile`` alone, its supervisor waiting on the attach session: nothing of a request
        (no environment, no decision or request label), ``activeDeadlineSeconds`` = ``ttl_s``."""
        pod = pooled_pod(profile, ttl_s=ttl_s, namespace=self.namespace, instance=self.instance)
        options = {"image": profile.image, "namespace": self.namespace, "environment": {}, "pod": pod,
                   "pod_sha256": pod_digest(pod)}  # fmt: skip
        spec = RunSpec(options=options, timeout_s=max(ttl_s, 1.0), output_bytes=0, pull=profile.pull,
                       backend="kubernetes")  # fmt: skip
        return self._start(spec, options, pooled=True)

    def claim(self, sandbox: Any, spec: RunSpec) -> KubernetesSandbox | None:
        """Bind an idle pooled Pod to one request's ``spec``; None when it is no longer alive.

        The guard runs again on the manifest the Pod was created with and on the decision's, and the two must
        have the same profile part (``pod.profile_part``: every field but the name, the labels naming a run or a
        pool, and the backstop deadline). The outcome then names the Pod that ran (its own digest and uid)."""
        if not isinstance(sandbox, KubernetesSandbox) or sandbox.created_with is None:
            raise SandboxError("only an idle pooled sandbox can be claimed")
        if sandbox.used:
            raise SandboxError("a sandbox is used once; this one was already claimed")
        guard(sandbox.created_with)
        guard(spec.options)
        made, wanted = profile_part(sandbox.created_with["pod"]), profile_part(spec.options["pod"])
        if spec.mounts or made != wanted or sandbox.created_with["namespace"] != spec.options["namespace"]:
            raise UnsafeOptionsError(
                "the pooled Pod was created from another profile than the decision's; it was deleted and nothing "
                "ran in it"
            )
        sandbox.used = True
        if sandbox.attach is None or not sandbox.attach.idle():
            return None
        return replace(sandbox, spec=spec, used=False)

    def discard(self, sandbox: Any) -> None:
        """Delete a Pod that will never run (its supervisor also ends when the attach session closes)."""
        if not isinstance(sandbox, KubernetesSandbox):
            return
        sandbox.used = True
        if sandbox.attach is not None:
            sandbox.attach.close()
        with contextlib.suppress(Exception):
            self.client.delete_pod(sandbox.namespace, sandbox.name)

    # -- run -------------------------------------------------------------------------------------------

    def run(
        self, sandbox: Any, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        """``on_gone`` (the warm pool's interface): called once the Pod is deleted (with None), or with why it
        could not be (then no ``ContainerLeftError`` is raised: the caller audits it)."""
        if not isinstance(sandbox, KubernetesSandbox):
            raise SandboxError(f"KubernetesRunner cannot run a {type(sandbox).__name__}")
        if sandbox.used:
            raise SandboxError("a sandbox is used once; prepare a new one")
        sandbox.used = True
        got = Collected()
        start = time.monotonic()
        reason: list[str] = []
        left: GatewayError | None = None
        try:
            outcome = self._run(sandbox, payload, got, start, reason, on_output=on_output, cancel=cancel)
        except GatewayError as exc:
            exc.outcome = exc.outcome or self._partial(sandbox, got, start, reason)
            raise
        finally:
            if sandbox.attach is not None:
                sandbox.attach.close()
            try:
                self.client.delete_pod(sandbox.namespace, sandbox.name)
            except GatewayError as exc:
                left = exc
            if on_gone is not None:
                with contextlib.suppress(Exception):
                    on_gone(left)
        if left is not None and on_gone is None:
            error = ContainerLeftError(
                f"the run ended, but its Pod {sandbox.namespace}/{sandbox.name} could not be deleted ({left.message}); "
                "it was left for `gateway reap` (activeDeadlineSeconds ends it too)"
            )
            error.__cause__ = left
            error.outcome = outcome
            raise error
        return outcome

    def execute(
        self, spec: RunSpec, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        return prepare_and_run(self, spec, payload, on_output=on_output, cancel=cancel, on_gone=on_gone)

    def _run(
        self, sb: KubernetesSandbox, payload: Payload, got: Collected, start: float, reason: list[str], *,
        on_output: OnOutput | None, cancel: threading.Event | None,
    ) -> Outcome:  # fmt: skip
        spec = sb.spec
        attach = sb.attach
        if attach is None:
            raise SandboxError("the sandbox has no attach session")
        key = new_key()
        data = encode_payload(
            key, payload.code, payload.files, spec.output_files_bytes, spec.output_files,
            env=dict(spec.options.get("environment") or {}), timeout_s=spec.timeout_s, language=payload.language,
        )  # fmt: skip
        deadline = start + spec.timeout_s
        decoder = FrameDecoder(key)
        kill = False
        try:
            attach.send(data, timeout=deadline - time.monotonic())
            kill = self._read(attach, decoder, got, spec, deadline, on_output=on_output, cancel=cancel)
        except TimeoutError:
            got.timed_out = kill = True
        except ProtocolError as exc:
            attach.close()
            self.client.delete_pod(sb.namespace, sb.name)
            raise SandboxError(
                f"the sandbox's output stream failed verification ({exc}); the program tampered with it"
            ) from exc
        if kill:
            attach.close()
            self.client.delete_pod(sb.namespace, sb.name)
        if got.callback_error is not None:
            raise OutputCallbackError(
                f"the output callback raised {type(got.callback_error).__name__}: {got.callback_error}; "
                "the sandbox was killed"
            ) from got.callback_error
        if got.cancelled:
            raise CancelledRunError("the run was cancelled by its caller; the sandbox was killed")
        if got.error is not None:
            raise SandboxError(f"the sandbox could not start the program: {got.error}")
        state: dict[str, Any] = {}
        if not kill and got.final is None:
            # No final frame: the container died under the supervisor. The kubelet says why.
            state, why = self._settle(sb)
            if why:
                reason.append(why)
        attach.close()
        duration_ms = round((time.monotonic() - start) * 1000)
        runtime = "runsc" if spec.options["pod"]["spec"].get("runtimeClassName") else "runc"
        outcome = outcome_of(
            got, state, duration_ms, runtime=runtime, container_id=sb.container_id, image_id=sb.image_id, pulled=False
        )
        if reason and reason[0] == "Evicted":
            outcome = replace(outcome, exit_code=None, resource_killed=True)
        return replace(outcome, sandbox=sb.names(reason[0] if reason else None))

    def _read(
        self, attach: Attach, decoder: FrameDecoder, got: Collected, spec: RunSpec, deadline: float, *,
        on_output: OnOutput | None, cancel: threading.Event | None,
    ) -> bool:  # fmt: skip
        """Read until the final frame or the end of the session. True when the Pod must be killed."""
        while True:
            timeout = read_timeout(got, deadline, cancel)
            if timeout is None:
                return True
            try:
                message = attach.recv(timeout)
            except TimeoutError:
                continue  # the loop checks the cancel event and the deadline again
            if message is None:
                return False
            channel, data = message
            if channel == 1:
                for frame in decoder.feed(data):
                    if take_frame(frame.kind, frame.data, got, spec, on_output):
                        return True
                    if decoder.finished:
                        return False
            elif channel in (2, 3) and len(got.diagnostics) < _DIAG_BYTES:
                got.diagnostics += data[: _DIAG_BYTES - len(got.diagnostics)]

    def _settle(self, sb: KubernetesSandbox) -> tuple[dict[str, Any], str | None]:
        """The engine-state view of a Pod that ended without a final frame: ``OOMKilled`` and the reason."""
        until = time.monotonic() + _SETTLE_S
        while True:
            pod = self.client.read_pod(sb.namespace, sb.name)
            if pod is None:
                return {}, None
            status = pod.get("status") or {}
            terminated = (_container_status(pod).get("state") or {}).get("terminated") or {}
            pod_reason = status.get("reason")
            if pod_reason in ("Evicted", "DeadlineExceeded"):
                return {}, str(pod_reason)
            if terminated:
                why = terminated.get("reason")
                return {"OOMKilled": why == "OOMKilled"}, str(why) if why in ("OOMKilled",) else None
            if time.monotonic() >= until:
                return {}, None
            time.sleep(0.2)

    def _partial(self, sb: KubernetesSandbox, got: Collected, start: float, reason: list[str]) -> Outcome:
        got.final = None
        outcome = outcome_of(
            got, {}, round((time.monotonic() - start) * 1000), runtime="runc", container_id=sb.container_id,
            image_id=sb.image_id, pulled=False,
        )  # fmt: skip
        return replace(outcome, resource_killed=False, sandbox=sb.names(reason[0] if reason else None))

    # -- reap ------------------------------------------------------------------------------------------

    def reap(
        self, *, everything: bool = False, expired_only: bool = False, dead: Callable[[str], bool] | None = None
    ) -> list[str]:
        """Delete this instance's Pods, finished ones and expired ones (``everything``: every gateway Pod in the
        namespace; ``expired_only``: only finished and expired ones; ``dead(instance)``: also those of another
        instance it says is gone). Returns ``namespace/name`` of each deleted Pod."""
        found = self.client.list_pods(self.namespace, f"{MANAGED_LABEL}=true")
        now = time.time()
        me = label_value(self.instance)
        removed: list[str] = []
        for pod in found.get("items") or []:
            meta = pod.get("metadata") or {}
            owner = str((meta.get("labels") or {}).get(INSTANCE_LABEL, ""))
            mine = owner == me and not expired_only
            orphan = dead is not None and owner != me and dead(owner)
            if everything or mine or orphan or _finished(pod) or _expired(pod, now):
                name = str(meta.get("name"))
                self.client.delete_pod(self.namespace, name)
                removed.append(f"{self.namespace}/{name}")
        return removed


def _check_lifetime(spec: RunSpec) -> None:
    """Refuse a kernel whose Pod would be ended (``activeDeadlineSeconds``) before the kernel's lifetime."""
    deadline = (spec.options.get("pod") or {}).get("spec", {}).get("activeDeadlineSeconds")
    needed = math.ceil(spec.timeout_s) + START_MARGIN_S
    if not isinstance(deadline, int) or deadline < needed:
        raise SandboxError(
            f"the kernel's Pod has activeDeadlineSeconds {deadline!r}, shorter than its lifetime of "
            f"{spec.timeout_s:g} s plus the start margin ({needed} s); nothing was created",
            hint="assemble a kernel's Pod with its lifetime as the timeout (the settings' timeout_s)",
        )


def _status(exc: GatewayError) -> int | None:
    from gateway.runner.kubernetes.errors import api_status  # noqa: PLC0415 - one helper, no cycle at import

    found = api_status(exc.__cause__) if exc.__cause__ is not None else None
    return found.status if found is not None else None


def _container_status(pod: Mapping[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if isinstance(status, dict) and status.get("name") == CONTAINER_NAME:
            return status
    return {}


def _start_state(pod: Mapping[str, Any], name: str) -> str:
    """``running``, ``pending``, or raise for a Pod that will never run its container."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    state = _container_status(pod).get("state") or {}
    if "running" in state:
        return "running"
    waiting = state.get("waiting") or {}
    why = str(waiting.get("reason") or "")
    if why in _IMAGE_REASONS:
        image = pod.get("spec", {}).get("containers", [{}])[0].get("image")
        raise ImageMissingError(
            f"the node cannot start the Pod {name}: image {image!r} is not present there ({why}: "
            f"{waiting.get('message', '')}); the policy allows no pull, so nothing ran",
            hint="load the sandbox image into every node without a registry (README: `ctr images import`, or "
            "`kind load docker-image` / `k3s ctr images import`), or allow pulls from a registry you run",
        )
    if why in _FAILED_REASONS:
        raise SandboxError(f"the Pod {name} could not start its container ({why}: {waiting.get('message', '')})")
    if "terminated" in state or phase in ("Succeeded", "Failed"):
        detail = status.get("reason") or (state.get("terminated") or {}).get("reason") or phase
        raise SandboxError(f"the Pod {name} ended before the payload was handed over ({detail}); nothing ran")
    return "pending"


def _pending_reason(pod: Mapping[str, Any]) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"not scheduled ({cond.get('reason')}: {cond.get('message', '')})"
    waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
    if waiting:
        return f"container waiting ({waiting.get('reason')}: {waiting.get('message', '')})"
    return f"phase {(pod.get('status') or {}).get('phase', 'unknown')}"


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _expired(pod: Mapping[str, Any], now: float) -> bool:
    """Past creation + ``activeDeadlineSeconds`` + the grace (or unreadable: nobody waits for it)."""
    meta = pod.get("metadata") or {}
    try:
        created = datetime.strptime(str(meta.get("creationTimestamp")), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        limit = float(str((pod.get("spec") or {}).get("activeDeadlineSeconds")))
    except (TypeError, ValueError):
        return True
    return now > created.timestamp() + limit + EXPIRY_GRACE_S
