"""The in-sandbox supervisor, the same for every backend: the fixed program a sandbox runs as its command, the
payload the host hands it, and the workspace it runs the program in.

Why a supervisor: the program's code must reach the container without shell quoting, and the runner must be
able to tell the program's output and exit status from anything the program could forge. So the container's
command is a fixed program (``SUPERVISOR``, run as ``python3 -I -S -c SUPERVISOR /workspace``; no caller
content on the command line) that:

1. is the container's PID 1 (no ``docker-init``): the kernel delivers to a namespace's init only the signals it
   handles, so the program (same uid) can neither kill nor stop it, and it ignores ``SIGINT`` (Python's
   default handler would raise); it reaps every orphan itself;
   first thing, before any payload exists, it starts the program's process (``prefork``): a child in its own
   session, stdin ``/dev/null``, stdout / stderr pipes, that waits on a pipe for the request's environment.
   Which interpreter is the container's (its second argument, from the runner: the profile's language, never
   the request's data): a forked Python that loads ``site``, or ``node`` / ``bash`` exec'd with a small
   bootstrap (``STARTS``). So a run starts one interpreter, not two (each start is tens of milliseconds in a
   fresh gVisor sandbox, which reads the interpreter's files through its gofer; node 24 takes 80 ms), and
   a warm pool's container has the program's process ready when the request arrives;
2. reads one payload from stdin (exactly, by its length; no reliance on EOF): ``MAGIC``, a 4-byte
   big-endian length, then a ``marshal``-encoded dict ``{"key": bytes, "code": str, "files": {relpath:
   bytes}, "files_cap": int, "files_max": int, "env": {name: value}, "timeout_s": float, "language": str}``
   (and the kernel-mode keys below). ``marshal``, not
   JSON, because the supervisor's start-up is on every cold run's path and ``json`` (with ``re``, ``enum``,
   ...) is most of its imports; the payload comes only from the host, which is trusted, and the supervisor's
   frames to the host stay JSON (the host never unmarshals anything from a sandbox);
3. writes the files and the program file (``main.py``, ``main.sh`` or ``main.js`` by the payload's language)
   into the workspace (refusing path escapes again: no ``..``, each
   directory on the way opened ``O_PATH | O_NOFOLLOW``, the file ``O_NOFOLLOW``: a link an earlier execution
   planted in a session's workspace is never followed), creates ``out/``;
4. makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``), so the program, which runs as the same uid,
   cannot trace it or read its memory (the per-run key) or file descriptors through ``/proc``. The policy's
   environment travels in the payload and is given to the program's process only: the supervisor's own
   environment (which gVisor shows the program whatever the dumpable flag) holds nothing of the request;
5. starts the program: sends the waiting child the environment, and the child runs the program as its
   interpreter alone would: the forked Python runs ``main.py`` in its ``__main__`` as ``python3 main.py``
   would (the script's directory first on ``sys.path``, site-packages, its own globals, tracebacks without the
   supervisor's frames, the interpreter's own exit); node sets ``process.env``, removes what ``-e`` adds and
   runs ``main.js`` as the main module (``require('module').runMain()``: its own ``require``, ``__filename``,
   ``process.argv``, exit code and uncaught-exception report; only node's internal frames below ``runMain``
   in a stack differ); bash exports the variables and sources ``main.sh`` with ``$0`` its path and no
   positional arguments (``$-`` shows ``c``). A request of another language than the container's, or whose
   environment that interpreter reads while it starts (``FRESH``: ``PYTHON*``, ``NODE_*``, ``UV_*``,
   ``LC_*``, ``LANG``, ``HOME``, ``TZ``, bash's own variables, ...), or a Python container whose image
   environment has a ``PYTHON*`` variable, gets a fresh interpreter with that environment instead:
   ``python3 main.py``, ``/bin/bash --noprofile --norc main.sh`` or ``/usr/bin/node main.js``, the file's path
   as the only argument (the code is never on a command line, so never shell-quoted), in the same session,
   with the same pipes, the same environment handling and the same deadline; the waiting process is killed
   unused (before its pipe closes: it never runs anything). What those interpreters read while they start
   from the environment (``BASH_ENV``, ``SHELLOPTS``, ``NODE_OPTIONS``, ...) the policy refuses in a request
   (rule ``env.dangerous``). It relays what the program writes as frames on the container's stdout. It
   enforces the deadline itself (``timeout_s`` after the payload arrived: kill every process, exit 124) and
   watches its stdin, which the host keeps open for the whole run: EOF there means the gateway went away
   (killed, or its engine connection lost), so it kills every process and exits 137 at once. Either way the
   container ends, and the engine removes it (``AutoRemove``), with no client and no reaper. A run with egress
   (payload ``egress_socket``): before the program starts, it listens on ``127.0.0.1:EGRESS_PORT``, and a
   thread of its own relays each connection there to the gateway's proxy on the unix socket the runner bound
   at ``EGRESS_TARGET`` (``bridge``), until the run ends with it. A run with packages (payload ``packages``):
   the program has ``PACKAGES_TARGET`` on ``sys.path`` right after its own directory and first on its
   ``PYTHONPATH``, as ``PYTHONPATH`` would give it, set by the supervisor (so the interpreter started ahead
   serves it: a ``PYTHONPATH`` in the request would cost a fresh interpreter, 150-200 ms under runsc);
6. when the child exits (or node started ahead, at its natural end, says its exit code: its own teardown
   skipped, ``NODE_BOOT``), kills every other process (``kill(-1)``), says whether the memory cgroup's OOM killer
   struck (``FRAME_META``), sends the files under ``out/`` (at most ``files_max`` of them, and ``files_cap``
   bytes counting contents and the names of every entry walked) and a final frame with the exit status (a
   signal ``n`` is ``128 + n``), waits (at most 10 s) for the host to close its stdin, and exits with that
   status.

In kernel mode (``encode_payload(kernel=True)``, for sessions) the payload's ``timeout_s`` is the kernel's
lifetime and the forked child becomes a persistent interpreter instead of running ``main.py``: the supervisor
then reads cells from stdin (``encode_cell``), hands each to the interpreter, relays its output, and after each
cell kills the processes the cell started and sends the files under ``out/`` that changed, the repr of the
cell's last expression (``FRAME_VALUE``) and a ``FRAME_CELL``. At a cell's deadline the interpreter gets SIGINT;
a cell still running ``grace_s`` later, an interpreter that dies or breaks the kernel's pipes, and the end of the
lifetime end the kernel with a final frame that says why (``"killed"``). See the kernel's comments below.

What it sends are authenticated frames: their format, and the host's end that verifies them, are in
``gateway.runner.frames``.
"""

from __future__ import annotations

import marshal
import secrets
import struct
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "CELL_MAGIC",
    "EGRESS_ENVIRONMENT",
    "EGRESS_PORT",
    "EGRESS_PROXY_URL",
    "EGRESS_SOCKET",
    "EGRESS_TARGET",
    "INTERPRETERS",
    "MAGIC",
    "PACKAGES_TARGET",
    "STARTUP_ENV",
    "STARTUP_ENV_PREFIXES",
    "SUPERVISOR",
    "WORKSPACE",
    "encode_cell",
    "encode_payload",
    "new_key",
    "supervisor_command",
]

WORKSPACE = "/workspace"
"""The sandbox's working directory, a tmpfs of its own: the supervisor writes the program and its files there
and returns what the program leaves under ``out/``. Every backend mounts it and starts the supervisor in it."""
MAGIC = b"GWP1"
CELL_MAGIC = b"GWC1"
"""Opens each cell the host sends a kernel-mode supervisor after its payload."""
STARTUP_ENV = ("LANG", "LANGUAGE", "HOME", "TZ")
PACKAGES_TARGET = "/opt/gateway-packages"
"""Where a run with packages has its installed tree (bound read-only by ``gateway.packages``): the supervisor puts
it on the program's ``sys.path`` (``encode_payload(packages=True)``; the supervisor's ``PKG``)."""
STARTUP_ENV_PREFIXES = ("PYTHON", "LC_")
"""The variables the interpreter reads only while it starts (the supervisor's ``STARTUP`` and its prefixes): a
run setting one gets an interpreter of its own, a kernel cannot be given one after its interpreter started."""
PAYLOAD_MARSHAL_VERSION = 4
"""The payload's body is ``marshal`` data of this version (Python 3.4 and later read it; only dicts, str, bytes,
int and float are in it)."""

# The supervisor runs inside the sandbox image with `python3 -I -S`: only the standard library, no site
# packages, and only built-in modules on the path of a run (`_signal`, `marshal`, `select`, `time`, `_sha256`;
# `_ctypes`, not `ctypes`, for the one `prctl`):
# each imported file costs start-up time on every cold run, most under gVisor, where a fresh sandbox reads it
# through the gofer (`signal` and `json` bring `enum`, `re`, `functools`, ...; `hmac` loads OpenSSL). Measured
# in fresh runsc sandboxes: 100-125 ms with those imports, 51-61 ms without. Keep it small and self-contained.
# The program's process is a fork of this interpreter, or node / bash exec'd from that fork (``prefork``): one
# interpreter start per run, not two.
SUPERVISOR = r"""
import os, sys, _signal as signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
W = sys.argv[1]
# The interpreter this container is made for (its profile's, from the runner; never the request's): started
# ahead, before any payload, and used when the request's language is the same.
AHEAD = sys.argv[2] if len(sys.argv) > 2 else "python"
PY = "/usr/bin/python3"
STARTUP = ("LANG", "LANGUAGE", "HOME", "TZ")
# A run with packages (payload "packages", set by the runner: never guessed from a path) has the gateway's sealed
# tree bound here (``PACKAGES_TARGET``).
PKG = "/opt/gateway-packages"
# Each language: the workspace file its code is written to, and the interpreter that runs that file fresh (never
# the code itself on a command line).
PROGRAMS = {
    "python": ("main.py", [PY]),
    "shell": ("main.sh", ["/bin/bash", "--noprofile", "--norc"]),
    "javascript": ("main.js", ["/usr/bin/node"]),
}
# Node and bash started ahead (``prefork``) wait on fd 3 for the go message, then run the program as
# ``node main.js`` / ``bash --noprofile --norc main.sh`` would. Node's: opens stdout / stderr, loads the empty
# module /dev/null (uncached again) and formats a few values as console.log does (output to nothing) ahead, so
# the module loader's and the formatter's code are compiled before the program (2-4 ms less per run under
# runc with Debian's node 18, which has no code cache); then, given the same length-prefixed block as the
# Python child's, it sets process.env (a run with packages, mode "p": NODE_PATH, read again by
# ``Module._initPaths``), closes fds 3 and 4, takes off what ``-e`` adds (the builtin modules as
# globals: their setter is ``setReal``; only builtin modules' names are looked at, since reading the descriptor
# of one of node 24's lazy web globals loads it: 30-80 ms; ``require``, ``module``, ...; ``execArgv``, which
# ``child_process.fork`` would pass on), all its own names in a closure, and runs main.js (its path is
# ``process.argv[1]``) as the main module.
# Its end: node's own teardown after a natural end costs about 10 ms under gVisor, and nothing of it reaches the
# program or its output. So when node emits ``beforeExit`` (its event loop is empty: every write to stdout and
# stderr is done; node's own emit, with no JavaScript caller below it, not a program's ``process.emit``) and
# nothing else can run (no ``beforeExit`` or ``exit`` listener, node's own included; no ``worker_threads``
# loaded; no native addon, whose clean-up hooks run at exit; an exit code of 0-255), the bootstrap writes "x"
# and the exit code on fd 4 (reopened close-on-exec: no child inherits it) and waits; the supervisor takes that
# as node's exit status and kills it (``FAST``). Anything else ends as node ends alone. What the program can see
# of it: ``process.emit`` is an own property of ``process`` (a wrapper calling EventEmitter's), one more
# descriptor in /proc/self/fd (the reopened pipe: what the program writes there can end its run), and at that
# last ``beforeExit`` ``Error.stackTraceLimit`` and ``Error.prepareStackTrace`` set and restored.
# Bash's: "r", then each variable NUL-terminated; ``$0`` is main.sh's path, no positional arguments, and it
# sources main.sh (no second exec).
NODE_BOOT = r'''(() => { const fs = require("fs"), M = require("module"), emitted = process.emit;
process.stdout; process.stderr; require("/dev/null"); delete require.cache["/dev/null"];
require("util").format("%s %d %j", "", 0, {}, [0]);
const rd = (n) => { const b = Buffer.alloc(n); let o = 0; while (o < n) { const k = fs.readSync(3, b, o, n - o, null);
  if (k === 0) process.exit(125); o += k; } return b; };
const d = rd(rd(4).readUInt32BE(0)), back = fs.openSync("/proc/self/fd/4", "w"), pipe = fs.fstatSync(back).ino;
fs.closeSync(3); fs.closeSync(4);
if (d.length > 1) for (const e of d.toString("utf8", 1).split("\0")) { const i = e.indexOf("=");
  process.env[e.slice(0, i)] = e.slice(i + 1); }
if (d[0] === 112) M._initPaths();
for (const n of Object.getOwnPropertyNames(globalThis)) { if (!M.isBuiltin(n)) continue;
  const p = Object.getOwnPropertyDescriptor(globalThis, n);
  if (p.set && p.set.name === "setReal") delete globalThis[n]; }
for (const n of ["require", "module", "exports", "__filename", "__dirname"]) delete globalThis[n];
process.execArgv.length = 0;
const callers = (f) => { const l = Error.stackTraceLimit, p = Error.prepareStackTrace, o = {};
  try { Error.stackTraceLimit = 1; Error.prepareStackTrace = (e, s) => s.length; Error.captureStackTrace(o, f);
    return o.stack; } finally { Error.stackTraceLimit = l; Error.prepareStackTrace = p; } };
const over = (c) => process.listenerCount("beforeExit") + process.listenerCount("exit") === 0
  && (c === undefined || Number.isInteger(c) && c >= 0 && c < 256) && fs.fstatSync(back).ino === pipe
  && !process.moduleLoadList.includes("NativeModule worker_threads")
  && !Object.keys(M._cache).some((f) => f.endsWith(".node"));
Object.defineProperty(process, "emit", { value: function emit(name, ...args) {
  if (name === "beforeExit" && this === process) { const c = process.exitCode;
    try { if (callers(emit) === 0 && over(c)) { fs.writeSync(back, Buffer.from([120, c || 0]));
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0); } } catch {} }
  return emitted.call(this, name, ...args); }, writable: true, configurable: true });
M.runMain(); })();'''
BASH_BOOT = ('read -r -N 1 <&3 && [ "$REPLY" = r ] || exit 125; '
             'while IFS= read -r -d "" <&3; do export "$REPLY"; done; unset REPLY BASH_EXECUTION_STRING; '
             'exec 3<&- 4>&-; . "$0"')
STARTS = {
    "javascript": ["/usr/bin/node", "-e", NODE_BOOT, W + "/main.js"],
    "shell": ["/bin/bash", "--noprofile", "--norc", "-c", BASH_BOOT, W + "/main.sh"],
}
# What each interpreter reads from the environment only while it starts (or, for bash, what its own
# variables are): a request setting one gets a fresh interpreter, exactly as it would start alone.
FRESH = {
    "python": (("PYTHON", "LC_"), STARTUP),
    "javascript": (("NODE_", "UV_", "LC_", "LD_", "MALLOC_", "OPENSSL_", "SSL_"), STARTUP + ("ICU_DATA",)),
    "shell": (("BASH", "LC_", "LD_", "MALLOC_", "HIST", "COMP_"), STARTUP + (
        "ENV", "SHELLOPTS", "PS0", "PS1", "PS2", "PS4", "IFS", "PATH", "SHLVL", "PWD", "OLDPWD", "SHELL",
        "POSIXLY_CORRECT", "TERM", "REPLY", "UID", "EUID", "PPID", "GROUPS", "HOSTNAME", "HOSTTYPE", "OSTYPE",
        "MACHTYPE", "CDPATH", "GLOBIGNORE", "TMOUT", "OPTIND", "OPTARG", "OPTERR", "LINENO", "RANDOM",
        "SRANDOM", "SECONDS", "EPOCHSECONDS", "EPOCHREALTIME", "FUNCNAME", "DIRSTACK", "PROMPT_COMMAND",
        "MAIL", "MAILPATH", "MAILCHECK", "TIMEFORMAT", "FIGNORE", "EXECIGNORE", "INPUTRC", "COLUMNS", "LINES")),
}
def fresh(language, names):
    prefixes, exact = FRESH[language]
    return any(k.startswith(prefixes) or k in exact or (language == "shell" and not (k.isascii() and
               k.isidentifier())) for k in names)
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
    mode, data = data[:1], data[1:]
    if mode != b"k":  # a kernel keeps both: cells arrive on fd 3, results leave on fd 4
        os.close(3)
        os.close(4)
    for item in data.split(b"\0") if data else ():
        k, _, v = item.partition(b"=")
        os.environ[os.fsdecode(k)] = os.fsdecode(v)
    path = W + "/main.py"
    sys.argv[:] = [path]
    if hasattr(sys, "orig_argv"):  # Python 3.10 and later
        sys.orig_argv[:] = [PY, path]
    if mode == b"p":  # the packages tree where PYTHONPATH puts it: after the script's directory, before site-packages
        sys.path.insert(0, PKG)
    sys.path.insert(0, W)
    if mode == b"k":
        kernel()
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
def kernel():
    # Kernel mode, in the forked child: a persistent interpreter. Cells arrive on fd 3 (a 4-byte length, then
    # marshal data ``{"seq", "code", "cap", "env"}`` from the supervisor); each runs in ``__main__``'s namespace
    # with its ``env`` set in os.environ for the cell only (then each of those names is restored: removed if it
    # was not there, its old value otherwise), the repr of a last expression statement is kept (at most ``cap``
    # bytes), an exception's traceback goes to stderr; then the child reports on its result pipe (fd 4): a
    # 4-byte length, the cell's 8-byte ``seq``, one flag byte (1: a value, 2: value truncated, 4: the cell
    # raised) and the value's bytes. SIGINT (the
    # supervisor's interrupt at a cell's deadline) raises KeyboardInterrupt while a cell runs and is ignored
    # between cells, so a late one is dropped, not kept for the next cell.
    # Everything it uses is bound here: the cells' namespace is ``__main__``'s, this script's globals.
    import ast, linecache, marshal, os, sys, traceback, __main__, _signal as signal
    def rd(n):
        b = b""
        while len(b) < n:
            c = os.read(3, n - len(b))
            if not c:
                os._exit(0)
            b += c
        return b
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    g = __main__.__dict__
    for k in [k for k in g if k not in ("__name__", "__builtins__")]:
        del g[k]
    g.update(__doc__=None, __spec__=None, __loader__=None, __package__=None)
    sys.argv[:] = [""]
    me = os.getpid()
    def report(seq, flags, value):
        msg = seq.to_bytes(8, "big") + bytes((flags,)) + value
        view = memoryview(len(msg).to_bytes(4, "big") + msg)
        while view:
            view = view[os.write(4, view):]
    def cell(seq, code, cap, env):
        name = "<cell %d>" % seq
        flags, value = 0, b""
        saved = [(k, os.environ.get(k)) for k in env]
        try:
            os.environ.update(env)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                linecache.cache[name] = (len(code), None, code.splitlines(True), name)
                tree = ast.parse(code, name, "exec")
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                exec(compile(tree, name, "exec"), g)
                if last is not None:
                    got = eval(compile(last, name, "eval"), g)
                    if got is not None:
                        text = repr(got).encode("utf-8", "backslashreplace")
                        flags, value = 1 | (2 if len(text) > cap else 0), text[:cap]
            finally:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the kernel goes on
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            flags, value = 4, b""
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
                tb = tb.tb_next
            try:
                sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))
            except BaseException:
                pass
        for k, v in saved:  # SIGINT is ignored again here: the restore is never cut short
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        return flags, value
    report(0, 0, b"")
    while True:
        msg = marshal.loads(rd(int.from_bytes(rd(4), "big")))
        flags, value = cell(msg["seq"], msg["code"], msg["cap"], msg["env"])
        if os.getpid() != me:  # a fork the cell made finished it too: only the kernel reports
            os._exit(0)
        report(msg["seq"], flags, value)
def fork_child(go=None, back=None):
    # A child in its own session: stdin /dev/null, stdout / stderr pipes to the supervisor, fd 3 the go pipe
    # and fd 4 the result pipe (when given), nothing else open, in the workspace. None in the child,
    # (pid, out_r, err_r) here.
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
            if back is not None and back != 4:  # back > go >= 3: the copy of go at 3 is safe
                os.dup2(back, 4)
            os.closerange(3 if go is None else 5, 1 << 16)
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
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    return child
def prefork():
    # The program's process, forked first thing, before the supervisor's own imports and before any payload
    # exists: it holds nothing of a request (node and bash get the image's environment, their bootstrap and the
    # program file's path). One interpreter start per run instead of two (under gVisor each start reads the
    # interpreter's files through the gofer). The supervisor makes itself non-dumpable (below) before the go
    # message, so the program can never trace it or read its key.
    go_r, go_w = os.pipe()
    back_r, back_w = os.pipe()
    child = fork_child(go_r, back_w)
    if child is None:
        try:
            if AHEAD in STARTS:  # node or bash, with the supervisor's environment (the image's) only
                for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                for fd in (3, 4):  # a pipe created at 3 or 4 was not dup'ed there: still close-on-exec
                    os.set_inheritable(fd, True)
                os.execv(STARTS[AHEAD][0], STARTS[AHEAD])
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except BaseException:
            os._exit(127)
        return None, None, None
    os.close(go_r)
    os.close(back_w)
    return child, go_w, back_r
# The interpreter reads PYTHON* variables only while it starts, and the supervisor's ``-I`` ignores them: with
# any in the image's environment the program gets an interpreter of its own (exec), as it does when the
# request sets one.
forked = go_w = back_r = None
if AHEAD not in PROGRAMS:
    sys.stderr.write("supervisor: unknown interpreter %r to start ahead\n" % (AHEAD,))
    os._exit(125)
if AHEAD != "python" or not any(k.startswith("PYTHON") for k in os.environ):
    try:
        forked, go_w, back_r = prefork()
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
def bridge_listen(path, port):
    # Egress (a run the policy allows named hosts): the program reaches the gateway's proxy, listening on the
    # unix socket bound at ``path``, through 127.0.0.1:port (HTTP_PROXY, ...; the sandbox has no other route).
    # Bound here, before the program starts, so that the port is the supervisor's alone.
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    s.setblocking(False)
    return s, path
def bridge(lst, path):
    # One thread of the supervisor (PID 1: it ends with the run) relays every connection both ways between
    # 127.0.0.1 and the proxy's socket, each connected anew; the proxy checks everything. One thread, polling,
    # so that connections do not spend the program's pids limit. conns: fd -> [socket, peer fd, bytes waiting
    # to be written to it, still read from].
    import socket
    IN, OUT, BAD = select.POLLIN, select.POLLOUT, select.POLLERR | select.POLLNVAL
    pl = select.poll()
    pl.register(lst, IN)
    conns = {}
    def drop(fd):
        for f in (fd, conns[fd][1]):
            c = conns.pop(f, None)
            if c is not None:
                pl.unregister(f)
                c[0].close()
    def watch(fd):
        c = conns[fd]
        pl.modify(fd, (IN if c[3] and not conns[c[1]][2] else 0) | (OUT if c[2] else 0))
    def accept():
        try:
            a = lst.accept()[0]
        except BlockingIOError:
            return
        except OSError:  # out of descriptors: the program holds too many; wait rather than spin
            time.sleep(0.05)
            return
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            u.settimeout(10)
            u.connect(path)
        except OSError:
            a.close()
            u.close()
            return
        a.setblocking(False)
        u.setblocking(False)
        conns[a.fileno()] = [a, u.fileno(), b"", True]
        conns[u.fileno()] = [u, a.fileno(), b"", True]
        pl.register(a, IN)
        pl.register(u, IN)
    def step(fd, ev):
        c = conns[fd]
        p = conns[c[1]]
        if ev & BAD or (ev & select.POLLHUP and not c[3]):
            return drop(fd)
        if ev & OUT and c[2]:
            c[2] = c[2][c[0].send(c[2]):]
            if not c[2] and not p[3]:
                c[0].shutdown(socket.SHUT_WR)
        if ev & (IN | select.POLLHUP) and c[3] and not p[2]:
            data = c[0].recv(65536)
            if data:
                try:
                    data = data[p[0].send(data):]
                except BlockingIOError:
                    pass
                p[2] = data
            else:
                c[3] = False
                if not p[2]:
                    p[0].shutdown(socket.SHUT_WR)
        if not (c[3] or p[3] or c[2] or p[2]):
            return drop(fd)
        watch(fd)
        watch(c[1])
    try:
        while True:
            for fd, ev in pl.poll():
                if fd == lst.fileno():
                    accept()
                elif fd in conns:
                    try:
                        step(fd, ev)
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        drop(fd)
    except BaseException:
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
KERNEL = bool(req.get("kernel"))
LANGUAGE = req.get("language", "python")
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
def place(files):
    # Request files (a run's, a kernel cell's), written over what is there, through no symlink and into no
    # non-directory (an execution before may have planted either in a session's workspace): each component is
    # opened O_PATH | O_NOFOLLOW below the last and must be a directory (gVisor follows a symlink opened
    # O_DIRECTORY | O_NOFOLLOW; O_PATH gets the link itself). None when all were written, else JSON naming the
    # file refused and the errno (the files before it stay written).
    for rel, data in sorted(files.items()):
        fd = -1
        try:
            if not safe(rel):
                raise OSError(22, "refused file name")
            parts = rel.split("/")
            d = os.open(W, os.O_PATH | os.O_DIRECTORY)
            try:
                for part in parts[:-1]:
                    try:
                        os.mkdir(part, 0o700, dir_fd=d)
                    except FileExistsError:
                        pass
                    n = os.open(part, os.O_PATH | os.O_NOFOLLOW, dir_fd=d)
                    os.close(d)
                    d = n
                    kind = os.fstat(d).st_mode & 0o170000
                    if kind != 0o040000:
                        raise OSError(40 if kind == 0o120000 else 20, "not a directory")  # ELOOP, ENOTDIR
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600, dir_fd=d)
            finally:
                os.close(d)
            if os.fstat(fd).st_mode & 0o170000 != 0o100000:
                raise OSError(6, "not a regular file")  # ENXIO, as the workspace's file helpers say
            os.ftruncate(fd, 0)
            try:
                put(fd, data)
            except OSError:
                os.ftruncate(fd, 0)  # a full workspace keeps no half file
                raise
        except OSError as exc:
            import json
            return json.dumps({"name": rel, "errno": exc.errno or 0, "strerror": exc.strerror or str(exc)}).encode()
        finally:
            if fd >= 0:
                os.close(fd)
    return None
try:
    if LANGUAGE not in PROGRAMS or (KERNEL and LANGUAGE != "python"):
        fail("cannot run language %r%s; the sandbox runs %s" % (
            LANGUAGE, " in kernel mode" if KERNEL else "", "python" if KERNEL else ", ".join(PROGRAMS)))
    MAIN, INTERPRETER = PROGRAMS[LANGUAGE]
    for name in req["files"]:
        if not safe(name) or name.split("/")[0] in ("main.py", "main.sh", "main.js"):
            fail("refused file name %r" % (name,))
    refused = place(req["files"])
    if refused is not None:
        fail("a request file could not be written (no symlink is followed, no non-directory entered): "
             + refused.decode())
    if not KERNEL:
        try:  # a session's workspace may hold an earlier program file (a link is removed, never followed)
            os.unlink(W + "/" + MAIN)
        except FileNotFoundError:
            pass
        fd = os.open(W + "/" + MAIN, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            put(fd, req["code"].encode("utf-8", "surrogatepass"))
        finally:
            os.close(fd)
    os.makedirs(W + "/out", 0o700, exist_ok=True)
    cap = int(req["files_cap"])
    env = dict(os.environ)
    env.update(req["env"])
    given = dict(req["env"])
    PACKAGES = bool(req.get("packages"))
    if PACKAGES:
        if KERNEL:
            fail("a kernel cannot have packages: they are installed before a run's sandbox is made")
        # The program's PYTHONPATH names the tree first (a fresh interpreter reads it; the forked one was told by
        # its mode "p" and keeps it for the processes it starts), yet the request set no PYTHON* variable, so the
        # interpreter started ahead still serves it.
        if LANGUAGE == "javascript":  # node's NODE_PATH the same way (mode "p": the node started ahead reads it again)
            MODS = PKG + "/node_modules"
            env["NODE_PATH"] = given["NODE_PATH"] = MODS + (":" + env["NODE_PATH"] if env.get("NODE_PATH") else "")
        else:
            env["PYTHONPATH"] = given["PYTHONPATH"] = PKG + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    most = int(req["files_max"])
    # The interpreter started ahead runs the program when it is the request's language and the request sets
    # nothing that interpreter reads only while it starts (``FRESH``); otherwise a fresh one, started with the
    # request's environment, exactly as it would start alone.
    ready = forked is not None and LANGUAGE == AHEAD and not fresh(AHEAD, req["env"])
    if KERNEL and not ready:
        fail("kernel mode needs the pre-started interpreter: no PYTHON*, LC_*, LANG, LANGUAGE, HOME or TZ in "
             "the request's environment and no PYTHON* in the image's")
    GRACE = float(req.get("grace_s", 0))
    VCAP = int(req.get("value_cap", 0))
    extra = b"\0".join(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in sorted(given.items()))
    if AHEAD == "shell":  # bash reads NUL-terminated entries up to EOF, no length
        extra = b"r" + b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in sorted(given.items()))
    else:
        extra = (b"k" if KERNEL else b"p" if PACKAGES else b"r") + extra
    BRIDGE = None
    if req.get("egress_socket"):
        try:
            BRIDGE = bridge_listen(req["egress_socket"], int(req["egress_port"]))
        except OSError as exc:
            fail("cannot listen on 127.0.0.1:%d for the egress proxy: %s" % (req["egress_port"], exc))
    del req
    undumpable()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    signal.set_wakeup_fd(wake_w)
    OOM0 = ooms()
    FAST = None
    if ready:
        pid, out_r, err_r = forked
        put(go_w, extra if AHEAD == "shell" else len(extra).to_bytes(4, "big") + extra)
        if not KERNEL:
            os.close(go_w)
            if AHEAD == "javascript":  # node's bootstrap says "x" and its exit code here at its end (``NODE_BOOT``)
                FAST = back_r
            else:
                os.close(back_r)
    else:
        if forked is not None:  # the forked process cannot serve this request: a fresh interpreter does
            try:  # killed before its go pipe closes: it never runs anything
                os.killpg(forked[0], signal.SIGKILL)
            except OSError:
                pass
            os.close(go_w)
            os.close(back_r)
            os.close(forked[1])
            os.close(forked[2])
            os.waitpid(forked[0], 0)
        pid, out_r, err_r = spawn(INTERPRETER + [W + "/" + MAIN], env)
except OSError as exc:
    fail("cannot start the program: %s" % (exc,))
del env, extra, given
if BRIDGE is not None:
    import _thread
    _thread.start_new_thread(bridge, BRIDGE)
def js(flag):
    return b"true" if flag else b"false"
poller = select.poll()
streams = {out_r: b"o", err_r: b"e"}
for fd in (out_r, err_r, wake_r, 0) if FAST is None else (out_r, err_r, wake_r, 0, FAST):
    poller.register(fd, select.POLLIN)
SENT = {out_r: 0, err_r: 0}
def relay(fd):
    try:
        data = os.read(fd, CHUNK)
    except BlockingIOError:
        return False
    if data:
        if KERNEL:
            # A cell's stream past the cap: one byte more tells the host, the rest is dropped here and the
            # cell interrupted (``wait_cell``), so the kernel lives on.
            before = SENT[fd]
            SENT[fd] = before + len(data)
            data = data[:max(VCAP + 1 - before, 0)]
            if not data:
                return True
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
def drain():
    for fd in list(streams):
        os.set_blocking(fd, False)
        while fd in streams and relay(fd):
            pass
def meta():
    oom = ooms()
    known = OOM0 is not None and oom is not None
    send(b"m", b'{"oom_killed":%s,"oom_known":%s}' % (js(known and oom > OOM0), js(known)))
def exit_status(st):
    code = os.waitstatus_to_exitcode(st)
    return 128 - code if code < 0 else code
root = W + "/out"
WALK = 4096
def send_files(cap, most, seen=None):
    # Every entry walked costs its name's bytes against the byte cap (a file: its whole relative path, which the
    # host charges too), and at most `most` files are sent: many empty files or directories are not free. The
    # walk stops at the first cap it meets, so its own work is bounded as well. A kernel's cell (`seen`: the
    # marks of the files found after the cell before) sends only the files that changed, charges only theirs,
    # and walks at most WALK entries. Returns (truncated, the marks of the files sent or unchanged).
    truncated = stop = False
    total = count = walked = 0
    marks = {}
    for top, dirs, names in os.walk(root):
        dirs.sort()
        rel_top = top[len(root) + 1:]
        if seen is None:
            for name in dirs:
                total += len(os.fsencode(name))
            if total > cap:
                truncated = True
                break
        else:
            walked += len(dirs)
            if walked > WALK:
                truncated = True
                break
        for name in sorted(names):
            rel = os.fsencode(rel_top + "/" + name if rel_top else name)
            walked += 1
            if seen is None:
                if total + len(rel) > cap:
                    truncated = stop = True
                    break
                total += len(rel)
            elif walked > WALK:
                truncated = stop = True
                break
            try:
                fd = os.open(top + "/" + name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                info = os.fstat(fd)
                if not (info.st_mode & 0o170000 == 0o100000):
                    continue
                mark = (info.st_mtime_ns, info.st_size, info.st_ino)
                if seen is not None:
                    if seen.get(rel) == mark:
                        marks[rel] = mark
                        continue
                    if total + len(rel) > cap:
                        truncated = stop = True
                        break
                    total += len(rel)
                if count >= most:
                    truncated = stop = True
                    break
                if total + info.st_size > cap:
                    truncated = True
                    continue
                total += info.st_size
                count += 1
                marks[rel] = mark
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
    return truncated, marks
def finish(code, extra=b""):
    # The final frame, then wait for the host to close stdin (or send anything), and exit: at most 10 s, or
    # for a kernel until its lifetime ends, since a kernel that died between cells is read at the next cell.
    send(b"x", b'{"status":%d%s}' % (code, extra))
    try:
        select.select([0], [], [], max(10, END - time.monotonic()) if KERNEL else 10)
    except OSError:
        pass
    os._exit(code)
if KERNEL:
    # Kernel mode: the child is a persistent interpreter (``kernel``). Cells come from the host on stdin
    # (MAGIC "GWC1", a 4-byte length, marshal data {"code", "timeout_s", "files", "env"}); each one's files are
    # written into the workspace first (``place``: one that cannot be written gets a cell frame saying
    # "refused", and the cell does not run), then it is handed to the child on its go pipe with its env, its
    # output relayed, and its report (on the result pipe) ends it: the processes the cell started
    # are killed, then come the files under out/ that changed, a value frame (the child's flags and repr) and
    # a cell frame {"seq", "interrupted", "files_truncated"}. At a cell's deadline, or once its stdout or
    # stderr passed the cap (the value cap, which is the run's output cap), the child gets SIGINT;
    # GRACE s later, or when the child dies, breaks the protocol or the kernel's lifetime (the payload's
    # timeout_s) ends, every process is killed and a final frame says why ("killed"). Between cells the
    # child's output is not read: a program flooding from a background thread blocks itself, not the
    # supervisor.
    for fd in (out_r, err_r, back_r):
        os.set_blocking(fd, False)
    poller.register(back_r, select.POLLIN)
    idle = select.poll()
    for fd in (wake_r, 0):
        idle.register(fd, select.POLLIN)
    rbuf = bytearray()
    def gone(reason, code):
        # A pipe that closes may be the child ending: give its status a moment to arrive, and say so then.
        give_up = time.monotonic() + 0.5
        while reason == b"protocol" and status is None and time.monotonic() < give_up:
            select.select([wake_r], [], [], 0.05)
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
            reap()
        if reason == b"protocol" and status is not None:
            reason, code = b"exited", exit_status(status)
        stop()
        drain()
        meta()
        finish(code, b',"files_truncated":false,"killed":"%s"' % reason)
    def take_result():
        try:
            data = os.read(back_r, CHUNK + VCAP)
        except BlockingIOError:
            data = None
        if data == b"":
            gone(b"protocol", 125)  # the child closed its result pipe: it can no longer report
        if data:
            rbuf.extend(data)
        if len(rbuf) < 4:
            return None
        n = int.from_bytes(rbuf[:4], "big")
        if not 9 <= n <= 9 + VCAP:
            gone(b"protocol", 125)
        if len(rbuf) < 4 + n:
            return None
        msg = bytes(rbuf[4:4 + n])
        del rbuf[:4 + n]
        return int.from_bytes(msg[:8], "big"), msg[8], msg[9:]
    def strays():
        # A cell's processes end with it: every process but this one and the kernel's is killed (as PID 1
        # only: run locally, /proc is the host's).
        if os.getpid() != 1:
            return
        for _ in range(8):
            found = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, pid)]
            if not found:
                return
            for p in found:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            reap()
    def wait_cell(seq, limit):
        interrupted = False
        while True:
            now = time.monotonic()
            if now >= END:
                gone(b"expired", 124)
            if not interrupted and max(SENT.values()) > VCAP:
                limit = now  # an output flood: interrupted at once
            if limit is not None and now >= limit:
                if interrupted:
                    gone(b"interrupt_ignored", 137)
                try:
                    os.kill(pid, signal.SIGINT)
                except OSError:
                    pass
                interrupted = True
                limit = now + GRACE
            until = END if limit is None else min(END, limit)
            for fd, _ in poller.poll(max(int((until - now) * 1000) + 1, 1)):
                if fd == wake_r:
                    try:
                        os.read(wake_r, 512)
                    except BlockingIOError:
                        pass
                elif fd == 0:
                    if not os.read(0, 4096):
                        stop()
                        os._exit(137)
                    gone(b"protocol", 125)  # the host sends nothing while a cell runs
                elif fd == back_r:
                    got = take_result()
                    if got is not None:
                        if got[0] != seq:
                            gone(b"protocol", 125)
                        return interrupted, got[1], got[2]
                elif fd in streams and not relay(fd) and fd not in streams:
                    gone(b"protocol", 125)  # the child closed its stdout or stderr
            reap()
            if status is not None:
                gone(b"exited", exit_status(status))
    wait_cell(0, None)
    send(b"c", b'{"seq":0,"interrupted":false,"files_truncated":false}')
    seen = {}
    seq = 0
    while True:
        now = time.monotonic()
        if now >= END:
            gone(b"expired", 124)
        ready_in = False
        for fd, _ in idle.poll(max(int((END - now) * 1000) + 1, 1)):
            if fd == wake_r:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
            else:
                ready_in = True
        reap()
        if status is not None:
            gone(b"exited", exit_status(status))
        if not ready_in:
            continue
        head = readn(0, 8)
        if not head:
            stop()
            os._exit(137)
        body = readn(0, int.from_bytes(head[4:], "big")) if len(head) == 8 and head[:4] == b"GWC1" else b""
        if not body or len(body) != int.from_bytes(head[4:], "big"):
            gone(b"protocol", 125)
        cell = marshal.loads(body)
        del body
        seq += 1
        refused = place(cell["files"])
        if refused is not None:  # the cell does not run; the kernel goes on
            send(b"c", b'{"seq":%d,"interrupted":false,"files_truncated":false,"refused":%s}' % (seq, refused))
            continue
        limit = time.monotonic() + float(cell["timeout_s"])
        OOM0 = ooms()
        SENT = {out_r: 0, err_r: 0}
        msg = marshal.dumps({"seq": seq, "code": cell["code"], "cap": VCAP, "env": cell["env"]}, 4)
        del cell
        put(go_w, len(msg).to_bytes(4, "big") + msg)
        del msg
        interrupted, flags, value = wait_cell(seq, limit)
        strays()
        for fd in list(streams):
            n = 0
            while n < 16 and fd in streams and relay(fd):
                n += 1
        if len(streams) < 2:
            gone(b"protocol", 125)
        meta()
        truncated, seen = send_files(cap, most, seen)
        send(b"v", bytes((flags,)) + value)
        send(b"c", b'{"seq":%d,"interrupted":%s,"files_truncated":%s}' % (seq, js(interrupted), js(truncated)))
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
        elif fd == FAST:
            # Node's bootstrap at node's natural end, waiting: its output is all in the pipes, and its exit code
            # is this. Its teardown would change nothing the program or the host sees (``NODE_BOOT``).
            said = os.read(FAST, 2)
            poller.unregister(FAST)
            if len(said) == 2 and said[0] == 120:
                status = said[1] << 8
    if status is None:
        reap()
stop()
drain()
for fd in list(streams):
    os.close(fd)
code = exit_status(status)
meta()
truncated, _ = send_files(cap, most)
finish(code, b',"files_truncated":%s' % js(truncated))
"""


EGRESS_TARGET = "/run/gateway-egress"
"""Where a run with egress has its proxy's directory (read-only): the proxy listens on ``proxy.sock`` in it."""
EGRESS_SOCKET = EGRESS_TARGET + "/proxy.sock"
EGRESS_PORT = 3128
"""The supervisor bridges ``127.0.0.1:EGRESS_PORT`` to ``EGRESS_SOCKET`` for the whole run (``encode_payload``)."""
EGRESS_PROXY_URL = f"http://127.0.0.1:{EGRESS_PORT}"
EGRESS_ENVIRONMENT: Mapping[str, str] = MappingProxyType(
    {
        "HTTP_PROXY": EGRESS_PROXY_URL,
        "HTTPS_PROXY": EGRESS_PROXY_URL,
        "http_proxy": EGRESS_PROXY_URL,
        "https_proxy": EGRESS_PROXY_URL,
        "NO_PROXY": "localhost,127.0.0.1",
        "no_proxy": "localhost,127.0.0.1",
        "npm_config_proxy": EGRESS_PROXY_URL,
        "npm_config_https_proxy": EGRESS_PROXY_URL,
    }
)
"""What a run with egress has in its environment, set over the request's: the proxy for curl, Python (urllib,
requests, pip), npm and whatever reads these; nothing else reaches anywhere (the sandbox has no route)."""

INTERPRETERS = ("python", "shell", "javascript")
"""What a sandbox can be made for (``SandboxProfile.interpreter``): the interpreter its supervisor starts ahead."""


def supervisor_command(workspace: str = WORKSPACE, interpreter: str = "python") -> list[str]:
    """The container's fixed command: the supervisor, the workspace path and, unless ``python``, the
    interpreter to start ahead (the container's profile's); nothing from the caller.

    The supervisor starts the program's process first thing, before any payload exists (so a warm pool's
    container has it ready, and a cold run starts one interpreter, not two): a forked Python, or ``node`` /
    ``bash`` with a small bootstrap; the process waits for the request's environment, then runs ``main.py``
    (``main.js``, ``main.sh``) as the interpreter would run it alone. A request of another language, or
    setting a variable that interpreter reads while starting (``PYTHON*``, ``NODE_*``, ``LC_*``, ``LANG``,
    ``HOME``, ``TZ``, ...), or a Python container whose image environment has a ``PYTHON*`` one, gets a fresh
    interpreter instead."""
    if interpreter not in INTERPRETERS:
        raise ValueError(f"unknown interpreter {interpreter!r}: expected one of {', '.join(INTERPRETERS)}")
    return ["/usr/bin/python3", "-I", "-S", "-c", SUPERVISOR, workspace] + (
        [] if interpreter == "python" else [interpreter]
    )


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
    kernel: bool = False,
    value_cap: int = 0,
    grace_s: float = 0.0,
    language: str = "python",
    egress: bool = False,
    packages: bool = False,
) -> bytes:
    """The bytes the host writes to the supervisor's stdin (``files_cap``: bytes of returned files, names
    included; ``files_max``: how many files at most; ``timeout_s``: the supervisor's own deadline).

    ``language``: how ``code`` is run (``python3 main.py``, ``bash --noprofile --norc main.sh``, ``node main.js``;
    the supervisor refuses any other, and any but python in kernel mode).
    ``kernel``: start a persistent interpreter instead of running ``code`` (ignored); ``timeout_s`` is then the
    kernel's lifetime, cells follow (:func:`encode_cell`), a cell's value is kept to ``value_cap`` bytes, and a
    cell still running ``grace_s`` after the SIGINT at its deadline gets the kernel killed.
    ``egress``: the supervisor bridges ``127.0.0.1:EGRESS_PORT`` to ``EGRESS_SOCKET`` (bound there by the runner)
    for the whole run; the caller puts ``EGRESS_ENVIRONMENT`` in ``env``.
    ``packages``: the run's installed packages are bound at ``PACKAGES_TARGET``: the program gets that directory
    on ``sys.path`` right after its own (where ``PYTHONPATH`` would put it, before the image's site-packages) and
    first on its ``PYTHONPATH`` (for the processes it starts), and the interpreter started ahead still runs it."""
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
            "kernel": int(kernel),
            "value_cap": int(value_cap),
            "grace_s": float(grace_s),
            "language": str(language),
            "egress_socket": EGRESS_SOCKET if egress else "",
            "egress_port": EGRESS_PORT,
            "packages": int(packages),
        },
        PAYLOAD_MARSHAL_VERSION,
    )
    return MAGIC + struct.pack(">I", len(body)) + body


def encode_cell(
    code: str, timeout_s: float, *, files: Mapping[str, bytes] | None = None, env: Mapping[str, str] | None = None
) -> bytes:
    """One cell for a kernel-mode supervisor: ``files`` are written into the workspace before it runs (over
    what is there, following no symlink), ``env`` is set in the interpreter's ``os.environ`` for this cell only,
    and it is interrupted (SIGINT) ``timeout_s`` seconds after it arrived."""
    body = marshal.dumps(
        {
            "code": str(code),
            "timeout_s": float(timeout_s),
            "files": {str(name): bytes(data) for name, data in (files or {}).items()},
            "env": {str(k): str(v) for k, v in (env or {}).items()},
        },
        PAYLOAD_MARSHAL_VERSION,
    )
    return CELL_MAGIC + struct.pack(">I", len(body)) + body
