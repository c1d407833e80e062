"""Layer 3's harness: run a Pod manifest the backend assembled with ``podman kube play`` on this machine, and hand
its in-Pod supervisor one payload through the same framed, authenticated protocol the runners use.

Everything podman touches lives under one temporary directory (``--root``, ``--runroot``, ``--tmpdir`` and a
``containers.conf`` of its own), so nothing global changes; the sandbox image comes from the local Docker engine
(``docker save | podman load``), never from a registry.

What podman 4.3 does with a Pod manifest, as measured here (README / docs/ARCHITECTURE.md repeat it):

- honours: runAsUser / runAsGroup, runAsNonRoot, readOnlyRootFilesystem, capabilities drop ALL,
  allowPrivilegeEscalation false (no_new_privs), seccompProfile RuntimeDefault, memory and CPU limits,
  hostname, the emptyDir volumes (as volumes), restartPolicy;
- ignores: ``stdin`` / ``stdinOnce`` (the container's stdin is /dev/null), emptyDir ``medium: Memory`` and
  ``sizeLimit`` (a disk volume without a size cap), RuntimeClass, NetworkPolicy, ephemeral-storage, and any pids
  limit (not even its ``containers.conf`` ``pids_limit``; on a node the kubelet's ``podPidsLimit`` is the bound);
- refuses: annotation values over 63 characters (Kubernetes allows far more), and a block scalar that starts with
  a newline (both are avoided by the assembler).

Because podman ignores ``stdin``, the one field the harness changes is ``command``: the same supervisor, exec'ed
as PID 1 by a one-line prefix that first makes a FIFO in the ``tmp`` volume its stdin. The host writes the payload
there and keeps the FIFO open (its EOF means "the gateway is gone", as an attach session's end does on a cluster).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.errors import GatewayError
from gateway.runner.frames import Collected, FrameDecoder, outcome_of, take_frame
from gateway.runner.interface import Outcome, RunSpec
from gateway.runner.kubernetes.kernel import KubernetesKernel
from gateway.runner.kubernetes.runner import KubernetesSandbox
from gateway.runner.supervisor import encode_payload, new_key

STDIN_FIFO = "/tmp/.gateway-stdin"
_PREFIX = (
    "import os,sys\n"
    f"fd=os.open({STDIN_FIFO!r},os.O_RDONLY)\n"
    "os.dup2(fd,0)\n"
    "os.close(fd)\n"
    "os.execv(sys.argv[1],sys.argv[1:])"
)


def podman_command(command: list[str]) -> list[str]:
    """The manifest's command behind the stdin prefix (podman ignores ``stdin``)."""
    return ["/usr/bin/python3", "-I", "-S", "-c", _PREFIX, *command]


@dataclass
class Podman:
    """A podman with its own storage under ``root`` and the sandbox image loaded from Docker."""

    root: Path
    attached: dict[str, PodmanAttach] = field(default_factory=dict)
    """The attach session of each kernel opened (by container name): a test may end one as a dying gateway would."""

    @classmethod
    def create(cls, image: str) -> Podman:
        root = Path(tempfile.mkdtemp(prefix="gateway-podman-"))
        podman = cls(root)
        (root / "tmp").mkdir()
        podman.configure()
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        load = podman.run(["load"], stdin=save.stdout, check=False)
        save.wait(timeout=300)
        if save.stdout is not None:
            save.stdout.close()
        if save.returncode != 0 or load.returncode != 0:
            podman.destroy()
            raise RuntimeError(f"docker save | podman load failed: {load.stderr[-500:]}")
        return podman

    def configure(self) -> None:
        """``containers.conf``: ulimits the host's hard limits allow (podman's defaults exceed them here)."""
        lines = ["[containers]", 'default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]']
        (self.root / "containers.conf").write_text("\n".join([*lines, "[engine]", ""]))

    def argv(self, args: list[str]) -> list[str]:
        return ["podman", "--root", str(self.root / "root"), "--runroot", str(self.root / "run"), "--tmpdir",
                str(self.root / "tmp"), *args]  # fmt: skip

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.root / "containers.conf")}

    def run(self, args: list[str], *, stdin: Any = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(args),
            stdin=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=300,
            check=False,
            cwd=self.root,  # conmon drops an `oom` file into its working directory on an OOM kill
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:3])} failed: {proc.stderr[-800:]}")
        return proc

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.run(["pod", "rm", "--all", "--force"], check=False)
        with contextlib.suppress(Exception):
            self.run(["system", "reset", "--force"], check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- one Pod ---------------------------------------------------------------------------------------

    def play(self, pod: dict[str, Any], spec: RunSpec, code: str, *, files: dict[str, bytes] | None = None) -> Outcome:
        """Play ``pod``, hand ``code`` to its supervisor, collect the verified frames, remove the Pod."""
        played = copy.deepcopy(pod)
        container = played["spec"]["containers"][0]
        container["command"] = podman_command(container["command"])
        manifest = self.root / f"{pod['metadata']['name']}.yaml"
        manifest.write_text(json.dumps(played))
        name = f"{pod['metadata']['name']}-{container['name']}"
        self.run(["kube", "play", "--start=false", "--network", "none", str(manifest)])
        try:
            return self._hand_over(name, spec, code, files or {})
        finally:
            self.run(["kube", "down", str(manifest)], check=False)
            self.run(["volume", "rm", "--force", "--all"], check=False)

    def open_kernel(
        self, pod: dict[str, Any], spec: RunSpec, *, files: dict[str, bytes] | None = None, grace_s: float = 1.0
    ) -> KubernetesKernel:
        """Play ``pod`` and open the backend's own kernel (``KubernetesKernel``) on it: the FIFO and the attached
        pipes stand in for the attach session, and deleting the Pod is ``kube down``. Close it when done."""
        played = copy.deepcopy(pod)
        container = played["spec"]["containers"][0]
        container["command"] = podman_command(container["command"])
        manifest = self.root / f"{pod['metadata']['name']}.yaml"
        manifest.write_text(json.dumps(played))
        name = f"{pod['metadata']['name']}-{container['name']}"
        self.run(["kube", "play", "--start=false", "--network", "none", str(manifest)])
        pods = PodmanPods(self, manifest, name)
        try:
            fifo = self._stdin_fifo()
            proc = subprocess.Popen(self.argv(["start", "--attach", name]), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=self.env, cwd=self.root)  # fmt: skip
            pods.proc = proc
            attach = self.attached[name] = PodmanAttach(proc, _open_writer(fifo, proc))
            sandbox = KubernetesSandbox(
                spec=spec, namespace="podman", name=str(pod["metadata"]["name"]), uid="",
                digest=str(spec.options["pod_sha256"]), attach=attach, container_id=name, used=True,
            )  # fmt: skip
            kernel = KubernetesKernel(pods, sandbox, None, grace_s)  # type: ignore[arg-type]
        except BaseException:
            pods.delete_pod("podman", name)
            raise
        try:
            kernel.start(files or {})
        except BaseException:
            with contextlib.suppress(Exception):
                kernel.close()
            raise
        return kernel

    def running(self, name: str) -> bool:
        """Whether the container ``name`` runs now."""
        found = self.run(["inspect", name, "--format", "{{.State.Running}}"], check=False)
        return found.returncode == 0 and found.stdout.strip() == "true"

    def _stdin_fifo(self) -> Path:
        tmp = self.volume_dir("tmp")
        for volume in (tmp, self.volume_dir("workspace")):
            volume.chmod(0o777)
        fifo = tmp / Path(STDIN_FIFO).name
        os.mkfifo(fifo, 0o666)
        os.chmod(fifo, 0o666)  # noqa: S103 - the sandbox uid must open it; it lives in this run's own volume
        return fifo

    def volume_dir(self, name: str) -> Path:
        out = self.run(["volume", "inspect", name, "--format", "{{.Mountpoint}}"]).stdout.strip()
        return Path(out)

    def _hand_over(self, name: str, spec: RunSpec, code: str, files: dict[str, bytes]) -> Outcome:
        fifo = self._stdin_fifo()
        key = new_key()
        payload = encode_payload(key, code, files, spec.output_files_bytes, spec.output_files, env={},
                                 timeout_s=spec.timeout_s)  # fmt: skip
        start = time.monotonic()
        proc = subprocess.Popen(self.argv(["start", "--attach", name]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=self.env, cwd=self.root)  # fmt: skip
        writer = _open_writer(fifo, proc)
        got = Collected()
        decoder = FrameDecoder(key)
        deadline = time.monotonic() + spec.timeout_s  # like the runner: from the hand-over
        try:
            os.write(writer, payload)
            assert proc.stdout is not None
            while not decoder.finished:
                left = deadline - time.monotonic()
                if left <= 0:
                    got.timed_out = True
                    break
                ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                if any(take_frame(f.kind, f.data, got, spec) for f in decoder.feed(chunk)):
                    break  # over the output cap: the EOF below ends the run, as a kill would
        finally:
            os.close(writer)  # the supervisor's stdin EOF: it exits (it ends the run if it was still running)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        state = json.loads(self.run(["inspect", name, "--format", "{{json .State}}"]).stdout or "{}")
        duration = round((time.monotonic() - start) * 1000)
        return outcome_of(got, state, duration, runtime="runc", container_id=name, image_id=None, pulled=False)


def _open_writer(fifo: Path, proc: subprocess.Popen[bytes]) -> int:
    """Open the FIFO for writing once the supervisor's prefix has opened it for reading (bounded wait)."""
    until = time.monotonic() + 60
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            if proc.poll() is not None or time.monotonic() > until:
                err = proc.stderr.read().decode() if proc.stderr is not None and proc.poll() is not None else ""
                raise RuntimeError(f"the Pod's supervisor never opened its stdin: {err[-500:]}") from None
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return fd


class PodmanAttach:
    """The attach session of a Pod under podman (``gateway.runner.kubernetes.client.Attach``'s interface): stdin is
    the FIFO, channel 1 the container's stdout and channel 2 its stderr, read from ``podman start --attach``."""

    def __init__(self, proc: subprocess.Popen[bytes], writer: int) -> None:
        assert proc.stdout is not None
        assert proc.stderr is not None
        self._proc = proc
        self._writer: int | None = writer
        self._channels = {proc.stdout.fileno(): 1, proc.stderr.fileno(): 2}
        self.closed = False

    def send(self, data: bytes, *, timeout: float) -> None:
        if self._writer is None:
            raise BrokenPipeError("the session is closed")
        view = memoryview(data)
        while view:
            view = view[os.write(self._writer, view) :]

    def recv(self, timeout: float) -> tuple[int, bytes] | None:
        while not self.closed:
            ready, _, _ = select.select(list(self._channels), [], [], max(timeout, 0.001))
            if not ready:
                raise TimeoutError("nothing from the Pod in time")
            fd = ready[0]
            data = os.read(fd, 65536)
            if data:
                return self._channels[fd], data
            if self._channels.pop(fd) == 1:
                self.closed = True  # stdout ended: the supervisor is gone
        return None

    def idle(self) -> bool:
        return not self.closed and not select.select(list(self._channels), [], [], 0)[0]

    def close(self) -> None:
        self.closed = True
        if self._writer is not None:
            os.close(self._writer)  # the supervisor's stdin EOF: it kills everything and exits
            self._writer = None


class PodmanPods:
    """What ``KubernetesKernel`` asks of its runner, under podman: delete the Pod (``kube down``, its volumes too)
    and say why it ended (the container's OOM flag)."""

    def __init__(self, podman: Podman, manifest: Path, name: str) -> None:
        self.podman = podman
        self.manifest = manifest
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = self

    def delete_pod(self, namespace: str, name: str) -> bool:
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        down = self.podman.run(["kube", "down", str(self.manifest)], check=False)
        self.podman.run(["volume", "rm", "--force", "--all"], check=False)
        if down.returncode != 0:
            raise GatewayError(f"podman kube down failed: {down.stderr[-300:]}")
        return True

    def _settle(self, sandbox: KubernetesSandbox) -> tuple[dict[str, Any], str | None]:
        found = self.podman.run(["inspect", self.name, "--format", "{{json .State}}"], check=False)
        state = json.loads(found.stdout or "{}") if found.returncode == 0 else {}
        oom = bool(state.get("OOMKilled"))
        return {"OOMKilled": oom}, "OOMKilled" if oom else None
