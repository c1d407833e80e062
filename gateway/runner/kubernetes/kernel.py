"""Kernels on Kubernetes: one long-lived hardened Pod running the supervisor in kernel mode, cells sent over its
attach session one WebSocket message at a time (``gateway.runner.kernel.HostKernel`` speaks the cell protocol).

The Pod is made exactly as a run's (``KubernetesRunner.prepare``: the decision's manifest, guarded again, created,
watched until running, attached). Its ``activeDeadlineSeconds`` must cover the kernel's lifetime plus the start
margin (``open_kernel`` refuses a shorter one), so the kubelet ends it and any reaper deletes it once that has
passed. Closing the attach session closes the supervisor's stdin (``stdinOnce``): it kills everything and exits;
the Pod is deleted (grace 0) as well, also when the supervisor does not answer by the host's deadline.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.errors import ContainerLeftError, GatewayError, SandboxError
from gateway.runner.kernel import HostKernel

if TYPE_CHECKING:
    from gateway.runner.kubernetes.runner import KubernetesRunner, KubernetesSandbox
    from gateway.slots import Slot

__all__ = ["KubernetesKernel"]


class KubernetesKernel(HostKernel["KubernetesSandbox"]):
    """A live kernel in its own Pod (``KubernetesRunner.open_kernel``); see ``gateway.runner.interface.Kernel``."""

    def __init__(self, runner: KubernetesRunner, sandbox: KubernetesSandbox, slot: Slot | None, grace_s: float) -> None:
        if sandbox.attach is None:
            raise SandboxError("the kernel's Pod has no attach session")
        super().__init__(sandbox, slot, grace_s)
        self._runner = runner
        self._attach = sandbox.attach
        self._reason: str | None = None

    @property
    def pod(self) -> str:
        """``namespace/name`` of the kernel's Pod."""
        return f"{self._sandbox.namespace}/{self._sandbox.name}"

    @property
    def where(self) -> str:
        return f"Pod {self.pod}"

    def _send(self, data: bytes, timeout: float) -> None:
        self._attach.send(data, timeout=timeout)

    def _receive(self, timeout: float) -> Iterable[tuple[int, bytes]] | None:
        message = self._attach.recv(timeout)
        return None if message is None else [message]

    def _memory(self) -> bool:
        """Whether the kubelet says the Pod ended for memory (it ended without a word); keeps its reason."""
        with contextlib.suppress(GatewayError):
            state, self._reason = self._runner._settle(self._sandbox)
            return bool(state.get("OOMKilled"))
        return False

    def _sandbox_facts(self) -> Mapping[str, Any]:
        sb = self._sandbox
        return {"container_id": sb.container_id, "image_id": sb.image_id, "sandbox": sb.names(self._reason)}

    def _end(self) -> GatewayError | None:
        """End the session and delete the Pod; why it could not be deleted, if so."""
        # Closing the session closes the supervisor's stdin (stdinOnce): it kills every process and exits.
        self._attach.close()
        try:
            self._runner.client.delete_pod(self._sandbox.namespace, self._sandbox.name)
        except GatewayError as exc:
            error = ContainerLeftError(
                f"the kernel's Pod {self.pod} could not be deleted ({exc.message}); it was left for "
                "`gateway reap` (its activeDeadlineSeconds ends it too)"
            )
            error.__cause__ = exc
            return error
        return None
