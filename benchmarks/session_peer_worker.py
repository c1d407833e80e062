"""A peer's persistent mode, driven over a pipe by ``benchmarks/sessions.py``; runs in that peer's own virtualenv.

It imports only the peer and the standard library (never ``gateway``), configures the peer for the local image
with the network off and no pull, opens one long-lived sandbox (AutoGen's ``DockerCommandLineCodeExecutor``: a
persistent container; llm-sandbox: one reused ``SandboxSession``), then answers one line per request on stdin:

- ``print``: run ``print(2+2)`` in the long-lived sandbox (stdout must be ``4``);
- ``reuse``: run a cell that reuses what an earlier one left: neither peer keeps an interpreter between calls
  (each call runs a new ``python3`` process in the same container), so the state is a file in the sandbox's
  working directory, read, incremented and written back (:data:`REUSE`); the printed count must be one more
  than the last;
- ``create``: open a second sandbox of the same kind and wait until it is ready (the peer's session create);
- ``drop``: close that second sandbox through the peer's API (its container stopped and removed);
- ``discard``: remove that second sandbox's container at once (``docker rm -f``), then close it: AutoGen's
  ``stop()`` waits out the engine's 10 s stop timeout (its ``/bin/sh`` on a TTY ignores SIGTERM, also under
  an init), so the benchmark times ``drop`` once and ``discard`` in its rounds;
- ``quit`` (or end of input): close what is open and exit.

Each reply is ``{"ok": true}`` or ``{"ok": false, "error": "..."}``; the first line is ``{"ready": true,
"versions": {...}}`` or ``{"ready": false, "error": "..."}``. The benchmark times each request from its side of
the pipe. Every container carries the label given with ``--label KEY=VALUE``.

What AutoGen 0.7.5 needed to run here (no network, local image, no pull):

- ``image`` local: ``start()`` finds it with ``images.get`` and pulls only when it is missing;
- it has no network, runtime or label setting: one wrapper around docker-py's ``ContainerCollection.create``
  adds ``network_disabled``/``network_mode: none``, the runtime, the label and ``init: True`` (its container's
  command is ``/bin/sh`` on a TTY, which as PID 1 ignores ``stop()``'s SIGTERM: every stop would wait 10 s);
- the code block's language ``python3``: for ``python`` it runs ``python FILE``, and the image has ``python3``
  only;
- ``stop_container=False``: the worker stops it itself; with its default ``True`` the executor registers an
  exit hook on the event loop that recursed at interpreter exit here (``RecursionError`` in ``asyncio_atexit``);
- ``work_dir``: a host directory of mode 0777 made by this worker (bound at ``/workspace``): its default
  temporary directory is 0700 and root's, which the image's user (65534) can neither read nor write.

Usage (by the benchmark): ``PEER_VENV/bin/python session_peer_worker.py --peer autogen|llm_sandbox_reused
--image IMAGE --runtime runc|runsc --label KEY=VALUE``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

from peer_worker import _llm_sandbox_config, _register_python3_handler

CODE = "print(2+2)"
REUSE = (
    "import os\np = 'bench-state'\nn = int(open(p).read()) + 1 if os.path.exists(p) else 1\n"
    "open(p, 'w').write(str(n))\nprint(n)"
)
"""The reuse step: a counter file in the working directory. Only ``os`` (imported at start-up): under runsc,
once a program run by llm-sandbox as root imported ``pathlib`` (writing its bytecode into the image's file
system, presumably), the code files llm-sandbox copies in afterwards (``put_archive``) were not seen inside the
sandbox ("can't open file"), and every later call printed nothing (measured, 2026-12-05)."""

Sandbox = tuple[Callable[[str], str], Callable[[], None], Callable[[], None]]
"""(run code, return stdout; close; remove the container at once, then close)."""


def _autogen(image: str, runtime: str, labels: dict[str, str]) -> Callable[[], Sandbox]:
    import docker.models.containers  # noqa: PLC0415
    from autogen_core import CancellationToken  # noqa: PLC0415
    from autogen_core.code_executor import CodeBlock  # noqa: PLC0415
    from autogen_ext.code_executors.docker import DockerCommandLineCodeExecutor  # noqa: PLC0415

    original = docker.models.containers.ContainerCollection.create

    def create(self: Any, image: Any, command: Any = None, **kwargs: Any) -> Any:
        kwargs.update(network_disabled=True, network_mode="none", runtime=runtime, init=True)
        kwargs["labels"] = {**labels, **(kwargs.get("labels") or {})}
        return original(self, image, command, **kwargs)

    docker.models.containers.ContainerCollection.create = create  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()

    def open_one() -> Sandbox:
        work = tempfile.mkdtemp(prefix="autogen-bench-")
        os.chmod(work, 0o777)  # noqa: S103 - the container's user (65534) writes its files there
        executor = DockerCommandLineCodeExecutor(image=image, work_dir=work, timeout=60, stop_container=False)
        loop.run_until_complete(executor.start())

        def run(code: str) -> str:
            block = CodeBlock(code=code, language="python3")
            result = loop.run_until_complete(executor.execute_code_blocks([block], CancellationToken()))
            if result.exit_code != 0:
                raise RuntimeError(f"exit {result.exit_code}: {result.output[-300:]}")
            return str(result.output)

        def close() -> None:
            try:
                loop.run_until_complete(executor.stop())
            finally:
                shutil.rmtree(work, ignore_errors=True)

        def discard() -> None:
            docker.from_env().containers.get(executor.container_name).remove(force=True)
            close()  # finds the container gone and returns

        return run, close, discard

    return open_one


def _llm_sandbox(image: str, runtime: str, labels: dict[str, str]) -> Callable[[], Sandbox]:
    from llm_sandbox import SandboxSession  # noqa: PLC0415

    _register_python3_handler()
    config = _llm_sandbox_config(image, runtime, labels)

    def open_one() -> Sandbox:
        session = SandboxSession(**config)
        session.open()
        return (lambda code: str(session.run(code).stdout)), session.close, session.close

    return open_one


PEERS: dict[str, tuple[str, ...]] = {
    "autogen": ("autogen-ext", "autogen-core", "docker"),
    "llm_sandbox_reused": ("llm-sandbox", "docker"),
}


def _reply(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", required=True, choices=sorted(PEERS))
    parser.add_argument("--image", required=True)
    parser.add_argument("--runtime", default="runc")
    parser.add_argument("--label", required=True, help="KEY=VALUE put on every container the peer creates")
    args = parser.parse_args(argv)
    key, _, value = args.label.partition("=")
    logging.disable(logging.CRITICAL)
    try:
        make = (_autogen if args.peer == "autogen" else _llm_sandbox)(args.image, args.runtime, {key: value})
        run, close, _ = make()
    except Exception as exc:  # noqa: BLE001 - reported to the benchmark, which records it for this case
        _reply({"ready": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]})
        return 1
    _reply({"ready": True, "versions": {n: importlib.metadata.version(n) for n in PEERS[args.peer]}})
    second: Sandbox | None = None
    count = 0
    try:
        for line in sys.stdin:
            command = line.strip()
            try:
                if command == "print":
                    out = run(CODE)
                    error = None if out == "4\n" else f"stdout was {out[:300]!r}"
                elif command == "reuse":
                    out = run(REUSE)
                    count += 1
                    error = None if out == f"{count}\n" else f"stdout was {out[:300]!r}, expected {count}"
                elif command == "create":
                    second = make()
                    error = None
                elif command in ("drop", "discard") and second is not None:
                    second[1 if command == "drop" else 2]()
                    second, error = None, None
                else:
                    break
            except Exception as exc:  # noqa: BLE001 - one failed call is reported, not fatal to the worker
                error = f"{type(exc).__name__}: {exc}"
            _reply({"ok": True} if error is None else {"ok": False, "error": error})
    finally:
        if second is not None:
            second[1]()
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
