"""One peer sandbox library, driven over a pipe by ``benchmarks/peers.py``; runs in that peer's own virtualenv.

It imports only the peer and the standard library (never ``gateway``), configures the peer for the local
image with the network off and no pull, then answers one line per request on stdin:

- ``run``: run ``print(2+2)`` once through the peer's public API, reply ``{"ok": true}`` or
  ``{"ok": false, "error": "..."}`` (anything but stdout ``4\\n`` is an error);
- ``quit`` (or end of input): close what is open (the reused session's container) and exit.

The first line it writes is ``{"ready": true, "versions": {...}}`` once set up, or ``{"ready": false,
"error": "..."}``. The benchmark times each request from its side of the pipe (a pipe round trip is tens of
microseconds). Every container the peer creates carries the label given with ``--label KEY=VALUE``, so the
benchmark can count (and remove) what was left behind.

Usage (by the benchmark): ``PEER_VENV/bin/python peer_worker.py --peer llm_sandbox|llm_sandbox_reused|epicbox
--image IMAGE --runtime runc|runsc --label KEY=VALUE``. Never run this by hand against images you care
about: it only reads them, but it does create and remove containers.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any

CODE = "print(2+2)"
EXPECTED = "4\n"


def _versions(*names: str) -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in names}


# --- llm-sandbox ----------------------------------------------------------------------------------------


def _llm_sandbox_config(image: str, runtime: str, labels: dict[str, str]) -> dict[str, Any]:
    """What llm-sandbox needs to run ``print(2+2)`` in the local image without network or pull.

    - ``image`` local: ``_get_or_pull_image`` finds it with ``images.get`` and never pulls;
    - ``skip_environment_setup=True``: otherwise every session runs ``python -m venv`` and ``pip install
      --upgrade pip`` in the container, which needs the network (and a ``python`` the image does not have);
    - ``workdir="/var/tmp"``: the default ``/sandbox`` does not exist in the image and, with the setup skipped,
      nothing creates it; not ``/tmp``, which gVisor covers with its own tmpfs, so that under runsc the code
      file copied in (``put_archive``) is not there ("can't open file ... No such file or directory");
    - the user stays llm-sandbox's default, ``root``: with the image's ``65534:65534`` the copied code file
      (mode 0600, owned by root) cannot be read under runsc ("Permission denied");
    - ``runtime_configs`` (merged into ``containers.create``): ``network_disabled``/``network_mode: none``, the
      runtime, the label, and ``init: True``: the container's command is the image's ``python3`` on a TTY,
      which as PID 1 ignores the SIGTERM of ``close()``'s ``container.stop()``, so without an init every close
      waits out the 10 s stop (measured: 10.07-10.11 s per close);
    - ``command: ["sleep", "infinity"]`` in ``runtime_configs`` too: llm-sandbox runs code with ``exec``, the
      container's own command only keeps it alive, and the image's default (``python3``, a REPL on the TTY)
      spins under gVisor while the session is idle: 93-99 % of a core per session (``docker stats``; ``sleep``:
      0.07 %), which also slowed every other case measured while a reused session was open.
    """
    return {
        "backend": "docker",
        "lang": "python",
        "image": image,
        "skip_environment_setup": True,
        "workdir": "/var/tmp",  # noqa: S108 - a path inside the container
        "runtime_configs": {
            "network_disabled": True,
            "network_mode": "none",
            "runtime": runtime,
            "labels": labels,
            "init": True,
            "command": ["sleep", "infinity"],
        },
    }


def _register_python3_handler() -> None:
    """The image has ``python3`` only; llm-sandbox runs ``python {file}``. Its handler factory is the public
    extension point for this: register a Python handler whose command is ``python3 {file}``."""
    from llm_sandbox.language_handlers.factory import LanguageHandlerFactory  # noqa: PLC0415
    from llm_sandbox.language_handlers.python_handler import PythonHandler  # noqa: PLC0415

    class Python3Handler(PythonHandler):  # type: ignore[misc]
        def __init__(self, logger: logging.Logger | None = None) -> None:
            super().__init__(logger)
            self.config.execution_commands = ["python3 {file}"]

    LanguageHandlerFactory.register_handler("python", Python3Handler)


def _llm_sandbox(
    image: str, runtime: str, labels: dict[str, str], *, reused: bool
) -> tuple[Callable[[], str], Callable[[], None]]:
    from llm_sandbox import SandboxSession  # noqa: PLC0415

    _register_python3_handler()
    config = _llm_sandbox_config(image, runtime, labels)
    if reused:
        # One session (one container) for every call: llm-sandbox's fastest mode, and the unsafe one: files,
        # processes and environment of one call are there for the next.
        session = SandboxSession(**config)
        session.open()

        def run_reused() -> str:
            return str(session.run(CODE).stdout)

        return run_reused, session.close

    def run_fresh() -> str:
        # The documented shape: one session per piece of code, closed (container stopped and removed) on exit.
        with SandboxSession(**config) as session:
            return str(session.run(CODE).stdout)

    return run_fresh, lambda: None


# --- epicbox --------------------------------------------------------------------------------------------


def _epicbox(image: str, runtime: str, labels: dict[str, str]) -> tuple[Callable[[], str], Callable[[], None]]:
    """epicbox 1.1.0: a profile for the local image (``containers.create`` never pulls), the image's non-root
    user, read-only root, ``network_disabled=True`` (its default), limits raised from its defaults (64 MB,
    1 s CPU) to the gateway's 256 MB. It has no runtime setting and no labels: one wrapper around docker-py's
    ``ContainerCollection.create`` adds ``runtime=`` and the benchmark's label and changes nothing else."""
    import docker.models.containers  # noqa: PLC0415
    import epicbox  # noqa: PLC0415

    logging.disable(logging.CRITICAL)  # epicbox logs every step through structlog
    original = docker.models.containers.ContainerCollection.create

    def create(self: Any, image: Any, command: Any = None, **kwargs: Any) -> Any:
        kwargs["runtime"] = runtime
        kwargs["labels"] = {**labels, **(kwargs.get("labels") or {})}
        return original(self, image, command, **kwargs)

    docker.models.containers.ContainerCollection.create = create  # type: ignore[method-assign]
    epicbox.configure(
        profiles=[epicbox.Profile("python", image, user="65534:65534", read_only=True, network_disabled=True)]
    )
    limits = {"cputime": 10, "realtime": 20, "memory": 256, "processes": 64}

    def run() -> str:
        result = epicbox.run("python", f"python3 -c '{CODE}'", limits=limits)
        return bytes(result["stdout"]).decode(errors="replace")

    return run, lambda: None


PEERS: dict[str, tuple[str, ...]] = {
    "llm_sandbox": ("llm-sandbox", "docker"),
    "llm_sandbox_reused": ("llm-sandbox", "docker"),
    "epicbox": ("epicbox", "docker", "urllib3"),
}


def _setup(peer: str, image: str, runtime: str, labels: dict[str, str]) -> tuple[Callable[[], str], Callable[[], None]]:
    if peer == "epicbox":
        return _epicbox(image, runtime, labels)
    return _llm_sandbox(image, runtime, labels, reused=peer == "llm_sandbox_reused")


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
    try:
        run, close = _setup(args.peer, args.image, args.runtime, {key: value})
    except Exception as exc:  # noqa: BLE001 - reported to the benchmark, which records it for this case
        _reply({"ready": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]})
        return 1
    _reply({"ready": True, "versions": _versions(*PEERS[args.peer])})
    try:
        for line in sys.stdin:
            if line.strip() != "run":
                break
            try:
                out = run()
            except Exception as exc:  # noqa: BLE001 - one failed call is reported, not fatal to the worker
                _reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                continue
            _reply({"ok": True} if out == EXPECTED else {"ok": False, "error": f"stdout was {out[:300]!r}"})
    finally:
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
