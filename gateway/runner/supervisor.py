"""The in-sandbox supervisor, the same for every backend: the fixed program a sandbox runs as its command, the
payload the host hands it, and the workspace it runs the program in.

Why a supervisor: the program's code must reach the container without shell quoting, and the runner must be
able to tell the program's output and exit status from anything the program could forge. So the container's
command is a fixed program (``SUPERVISOR``, run as ``python3 -I -S -c SUPERVISOR /workspace``; no caller
content on the command line) that:

1. is the container's PID 1 (no ``docker-init``): the kernel delivers to a namespace's init only the signals it
   handles, so the program (same uid) can neither kill nor stop it, and it ignores ``SIGINT`` (Python's
   default handler would raise); it reaps every orphan itself;
   first thing, before any payload exists, it forks the program's process (``prefork``): a child in its own
   session, stdin ``/dev/null``, stdout / stderr pipes, that loads ``site`` and waits on a pipe for the
   request's environment. So a run starts one interpreter, not two (each start is tens of milliseconds in a
   fresh gVisor sandbox, which reads the interpreter's files through its gofer), and a warm pool's container
   has the program's process ready when the request arrives;
2. reads one payload from stdin (exactly, by its length; no reliance on EOF): ``MAGIC``, a 4-byte
   big-endian length, then a ``marshal``-encoded dict ``{"key": bytes, "code": str, "files": {relpath:
   bytes}, "files_cap": int, "files_max": int, "env": {name: value}, "timeout_s": float}``. ``marshal``, not
   JSON, because the supervisor's start-up is on every cold run's path and ``json`` (with ``re``, ``enum``,
   ...) is most of its imports; the payload comes only from the host, which is trusted, and the supervisor's
   frames to the host stay JSON (the host never unmarshals anything from a sandbox);
3. writes the files and ``main.py`` into the workspace (refusing path escapes again: ``O_NOFOLLOW``,
   ``O_EXCL``, no ``..``), creates ``out/``;
4. makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``), so the program, which runs as the same uid,
   cannot trace it or read its memory (the per-run key) or file descriptors through ``/proc``. The policy's
   environment travels in the payload and is given to the program's process only: the supervisor's own
   environment (which gVisor shows the program whatever the dumpable flag) holds nothing of the request;
5. starts the program: sends the forked child the environment, and the child runs ``main.py`` in its
   ``__main__`` as ``python3 main.py`` would (the script's directory first on ``sys.path``, site-packages,
   its own globals, tracebacks without the supervisor's frames, the interpreter's own exit). A request whose
   environment the interpreter reads while it starts (``PYTHON*``, ``LC_*``, ``LANG``, ``LANGUAGE``, ``HOME``,
   ``TZ``), or an image whose environment has a ``PYTHON*`` variable, gets a fresh ``python3 main.py`` with
   that environment instead. It relays what the program writes as frames on the container's stdout. It
   enforces the deadline itself (``timeout_s`` after the payload arrived: kill every process, exit 124) and
   watches its stdin, which the host keeps open for the whole run: EOF there means the gateway went away
   (killed, or its engine connection lost), so it kills every process and exits 137 at once. Either way the
   container ends, and the engine removes it (``AutoRemove``), with no client and no reaper;
6. when the child exits, kills every other process (``kill(-1)``), says whether the memory cgroup's OOM killer
   struck (``FRAME_META``), sends the files under ``out/`` (at most ``files_max`` of them, and ``files_cap``
   bytes counting contents and the names of every entry walked) and a final frame with the exit status (a
   signal ``n`` is ``128 + n``), waits (at most 10 s) for the host to close its stdin, and exits with that
   status.

What it sends are authenticated frames: their format, and the host's end that verifies them, are in
``gateway.runner.frames``.
"""

from __future__ import annotations

import marshal
import secrets
import struct
from collections.abc import Mapping

__all__ = ["MAGIC", "SUPERVISOR", "WORKSPACE", "encode_payload", "new_key", "supervisor_command"]

WORKSPACE = "/workspace"
"""The sandbox's working directory, a tmpfs of its own: the supervisor writes the program and its files there
and returns what the program leaves under ``out/``. Every backend mounts it and starts the supervisor in it."""
MAGIC = b"GWP1"
PAYLOAD_MARSHAL_VERSION = 4
"""The payload's body is ``marshal`` data of this version (Python 3.4 and later read it; only dicts, str, bytes,
int and float are in it)."""

# The supervisor runs inside the sandbox image with `python3 -I -S`: only the standard library, no site
# packages, and only built-in modules on the path of a run (`_signal`, `marshal`, `select`, `time`, `_sha256`;
# `_ctypes`, not `ctypes`, for the one `prctl`):
# each imported file costs start-up time on every cold run, most under gVisor, where a fresh sandbox reads it
# through the gofer (`signal` and `json` bring `enum`, `re`, `functools`, ...; `hmac` loads OpenSSL). Measured
# in fresh runsc sandboxes: 100-125 ms with those imports, 51-61 ms without. Keep it small and self-contained.
# The program's process is a fork of this interpreter (``prefork``): one interpreter start per run, not two.
SUPERVISOR = r"""
import os, sys, _signal as signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
W = sys.argv[1]
PY = "/usr/bin/python3"
STARTUP = ("LANG", "LANGUAGE", "HOME", "TZ")
def program():
    # The forked child becomes the program (see ``prefork``). It waits on fd 3 for the request's environment,
    # then runs main.py in ``__main__`` as ``python3 main.py`` would: site-packages on the path (``-S`` kept
    # them off for the supervisor), the script's directory first, its own globals, tracebacks without the
    # supervisor's frames, the interpreter's own exit (atexit, flushed streams, SystemExit's status).
    import site
    site.main()
    def rd(n):
        b = b""
        while len(b) < n:
            c = os.read(3, n - len(b))
            if not c:
                os._exit(125)
            b += c
        return b
    data = rd(int.from_bytes(rd(4), "big"))
    os.close(3)
    for item in data.split(b"\0") if data else ():
        k, _, v = item.partition(b"=")
        os.environ[os.fsdecode(k)] = os.fsdecode(v)
    path = W + "/main.py"
    sys.argv[:] = [path]
    if hasattr(sys, "orig_argv"):  # Python 3.10 and later
        sys.orig_argv[:] = [PY, path]
    sys.path.insert(0, W)
    def hook(t, v, tb, show=sys.excepthook):
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        show(t, v.with_traceback(tb) if v is not None else v, tb)
    sys.excepthook = hook
    leave = sys.exit
    import __main__
    g = __main__.__dict__
    for k in [k for k in g if k not in ("__name__", "__builtins__")]:
        del g[k]
    g.update(__file__=path, __doc__=None, __spec__=None, __loader__=None, __package__=None, __cached__=None)
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    exec(code, g)
    leave()
def fork_child(go=None):
    # A child in its own session: stdin /dev/null, stdout / stderr pipes to the supervisor, fd 3 the go pipe
    # (when given), nothing else open, in the workspace. None in the child, (pid, out_r, err_r) here.
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    null = os.open("/dev/null", os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            if go is not None and go != 3:
                os.dup2(go, 3)
            os.closerange(3 if go is None else 4, 1 << 16)
            os.chdir(W)
        except BaseException:
            os._exit(127)
        return None
    for fd in (out_w, err_w, null):
        os.close(fd)
    return pid, out_r, err_r
def spawn(argv, env):
    child = fork_child()
    if child is None:
        try:
            for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            os.execve(PY, argv, env)
        finally:
            os._exit(127)
    return child
def prefork():
    # The program's process, forked first thing, before the supervisor's own imports and before any payload
    # exists: it holds nothing of a request. One interpreter start per run instead of two (under gVisor each
    # start reads the interpreter's files through the gofer). The supervisor makes itself non-dumpable (below)
    # before the go message, so the program can never trace it or read its key.
    go_r, go_w = os.pipe()
    child = fork_child(go_r)
    if child is None:
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except BaseException:
            os._exit(127)
        return None, None
    os.close(go_r)
    return child, go_w
# The interpreter reads PYTHON* variables only while it starts, and the supervisor's ``-I`` ignores them: with
# any in the image's environment the program gets an interpreter of its own (exec), as it does when the
# request sets one.
forked = go_w = None
if not any(k.startswith("PYTHON") for k in os.environ):
    try:
        forked, go_w = prefork()
    except OSError:
        pass
    else:
        if go_w is None:
            # The forked child. The program runs here, outside every handler of the supervisor's (an error
            # it raises ends it the way the interpreter ends any script).
            program()
import marshal, select, time, _ctypes
try:
    from _sha256 import sha256
except ImportError:
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256
def undumpable():
    # prctl(PR_SET_DUMPABLE, 0) through `_ctypes`, the C half of `ctypes` (the Python half's imports cost
    # 10-30 ms more in a fresh gVisor sandbox), then PR_GET_DUMPABLE: the flag read back is the check.
    prctl = _ctypes.dlsym(_ctypes.dlopen(None), "prctl")
    _ctypes.call_function(prctl, (4, 0, 0, 0, 0))
    if _ctypes.call_function(prctl, (3, 0, 0, 0, 0)) != 0:
        fail("prctl(PR_SET_DUMPABLE, 0) did not take: the program could trace the supervisor")
CHUNK = 65536
def readn(fd, n):
    parts = []
    while n > 0:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            break
        parts.append(b)
        n -= len(b)
    return b"".join(parts)
def put(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
def ooms():
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
    return None
def everyone():
    if os.getpid() != 1:
        return
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
head = readn(0, 8)
if len(head) != 8 or head[:4] != b"GWP1":
    sys.stderr.write("supervisor: malformed payload\n")
    os._exit(125)
size = int.from_bytes(head[4:], "big")
raw = readn(0, size)
if len(raw) != size:
    sys.stderr.write("supervisor: truncated payload\n")
    os._exit(125)
req = marshal.loads(raw)
del raw
END = time.monotonic() + float(req["timeout_s"])
KEY = req["key"].ljust(64, b"\0")
INNER = bytes(b ^ 0x36 for b in KEY)
OUTER = bytes(b ^ 0x5C for b in KEY)
SEQ = [0]
def send(kind, data=b""):
    head = kind + len(data).to_bytes(4, "big")
    # HMAC-SHA256 (RFC 2104; the key is shorter than the block), without the hmac module's imports.
    inner = sha256(INNER + SEQ[0].to_bytes(8, "big") + head + data).digest()
    SEQ[0] += 1
    put(1, head + data + sha256(OUTER + inner).digest()[:16])
def fail(msg):
    import json
    send(b"!", json.dumps({"error": msg}).encode())
    os._exit(125)
def safe(name):
    if not name or name.startswith("/") or "\x00" in name:
        return False
    return all(p not in ("", ".", "..") for p in name.split("/"))
def create(rel, data):
    path = W + "/" + rel
    head = os.path.dirname(path)
    if head != W:
        os.makedirs(head, 0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        put(fd, data)
    finally:
        os.close(fd)
try:
    for name, data in sorted(req["files"].items()):
        if not safe(name) or name == "main.py":
            fail("refused file name %r" % (name,))
        create(name, data)
    create("main.py", req["code"].encode("utf-8", "surrogatepass"))
    os.makedirs(W + "/out", 0o700, exist_ok=True)
    cap = int(req["files_cap"])
    env = dict(os.environ)
    env.update(req["env"])
    most = int(req["files_max"])
    # A request whose environment the interpreter reads while it starts (locale, PYTHON*, HOME, TZ) gets an
    # interpreter of its own, started with that environment, exactly as it would start alone.
    ready = forked is not None and not any(k.startswith(("PYTHON", "LC_")) or k in STARTUP for k in req["env"])
    extra = b"\0".join(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in sorted(req["env"].items()))
    del req
    undumpable()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    signal.set_wakeup_fd(wake_w)
    OOM0 = ooms()
    if ready:
        pid, out_r, err_r = forked
        put(go_w, len(extra).to_bytes(4, "big") + extra)
        os.close(go_w)
    else:
        if forked is not None:  # the forked process cannot serve this request: a fresh interpreter does
            os.close(go_w)
            try:
                os.killpg(forked[0], signal.SIGKILL)
            except OSError:
                pass
            os.close(forked[1])
            os.close(forked[2])
            os.waitpid(forked[0], 0)
        pid, out_r, err_r = spawn([PY, W + "/main.py"], env)
except OSError as exc:
    fail("cannot start the program: %s" % (exc,))
del env, extra
poller = select.poll()
streams = {out_r: b"o", err_r: b"e"}
for fd in (out_r, err_r, wake_r, 0):
    poller.register(fd, select.POLLIN)
def relay(fd):
    try:
        data = os.read(fd, CHUNK)
    except BlockingIOError:
        return False
    if data:
        send(streams[fd], data)
        return True
    poller.unregister(fd)
    del streams[fd]
    os.close(fd)
    return False
def stop():
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    everyone()
status = None
def reap():
    global status
    while True:
        try:
            got, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not got:
            return
        if got == pid:
            status = st
while status is None:
    left = END - time.monotonic()
    if left <= 0:
        stop()
        os._exit(124)
    for fd, _ in poller.poll(max(int(left * 1000), 1)):
        if fd == wake_r:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        elif fd == 0:
            if not os.read(0, 4096):
                stop()
                os._exit(137)
        elif fd in streams:
            relay(fd)
    reap()
stop()
for fd in list(streams):
    os.set_blocking(fd, False)
    while fd in streams and relay(fd):
        pass
    if fd in streams:
        os.close(fd)
code = os.waitstatus_to_exitcode(status)
if code < 0:
    code = 128 - code
oom = ooms()
known = OOM0 is not None and oom is not None
def js(flag):
    return b"true" if flag else b"false"
send(b"m", b'{"oom_killed":%s,"oom_known":%s}' % (js(known and oom > OOM0), js(known)))
truncated = stop = False
total = 0
count = 0
root = W + "/out"
# Every entry walked costs its name's bytes against the byte cap (a file: its whole relative path, which the
# host charges too), and at most `most` files are sent: many empty files or directories are not free. The walk
# stops at the first cap it meets, so its own work is bounded as well.
for top, dirs, names in os.walk(root):
    dirs.sort()
    rel_top = top[len(root) + 1:]
    for name in dirs:
        total += len(os.fsencode(name))
    if total > cap:
        truncated = True
        break
    for name in sorted(names):
        rel = os.fsencode(rel_top + "/" + name if rel_top else name)
        if total + len(rel) > cap:
            truncated = stop = True
            break
        total += len(rel)
        try:
            fd = os.open(top + "/" + name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not (info.st_mode & 0o170000 == 0o100000):
                continue
            if count >= most:
                truncated = stop = True
                break
            if total + info.st_size > cap:
                truncated = True
                continue
            total += info.st_size
            count += 1
            send(b"n", rel)
            left = info.st_size
            while left > 0:
                data = os.read(fd, min(CHUNK, left))
                if not data:
                    break
                left -= len(data)
                send(b"f", data)
        finally:
            os.close(fd)
    if stop:
        break
send(b"x", b'{"status":%d,"files_truncated":%s}' % (code, js(truncated)))
try:
    select.select([0], [], [], 10)
except OSError:
    pass
os._exit(code)
"""


def supervisor_command(workspace: str = WORKSPACE) -> list[str]:
    """The container's fixed command: the supervisor and the workspace path, nothing from the caller.

    The supervisor forks the program's process first thing, before any payload exists (so a warm pool's
    container has it ready, and a cold run starts one interpreter, not two); the process waits for the
    request's environment, then runs ``main.py`` in its ``__main__``. A request setting a variable the
    interpreter reads while starting (``PYTHON*``, ``LC_*``, ``LANG``, ``LANGUAGE``, ``HOME``, ``TZ``), or an
    image whose environment has a ``PYTHON*`` one, gets a fresh ``python3 main.py`` instead."""
    return ["/usr/bin/python3", "-I", "-S", "-c", SUPERVISOR, workspace]


def new_key() -> bytes:
    """A fresh per-run frame key."""
    return secrets.token_bytes(32)


def encode_payload(
    key: bytes,
    code: str,
    files: Mapping[str, bytes],
    files_cap: int,
    files_max: int = 256,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 3600.0,
) -> bytes:
    """The bytes the host writes to the supervisor's stdin (``files_cap``: bytes of returned files, names
    included; ``files_max``: how many files at most; ``timeout_s``: the supervisor's own deadline)."""
    if not 0 < len(key) <= 64:  # the supervisor's HMAC takes a key of at most one SHA-256 block as it is
        raise ValueError(f"a frame key is 1 to 64 bytes, got {len(key)}")
    body = marshal.dumps(
        {
            "key": bytes(key),
            "code": str(code),
            "files": {str(name): bytes(data) for name, data in files.items()},
            "files_cap": int(files_cap),
            "env": {str(k): str(v) for k, v in (env or {}).items()},
            "timeout_s": float(timeout_s),
            "files_max": int(files_max),
        },
        PAYLOAD_MARSHAL_VERSION,
    )
    return MAGIC + struct.pack(">I", len(body)) + body
