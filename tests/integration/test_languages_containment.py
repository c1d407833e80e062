"""Shell and JavaScript contained like Python: the hostile battery's classes per language, on the real engine, under
runc and runsc, cold and pooled (a container made for the language, its interpreter started ahead), through the
same hardened options; and `gateway run --policy FILE --language LANG`."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.errors import UnsafeOptionsError
from gateway.resources import policies_dir
from gateway.runner.docker.options import INTERPRETER_LABEL, profile_part
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Outcome, Payload, RunSpec
from tests.integration.pooled_runner import MODES, runner_for

pytestmark = pytest.mark.integration

Options = Callable[..., dict[str, Any]]
IMAGES = {"shell": "gateway/sandbox-python:3.11-bookworm", "javascript": "gateway/sandbox-node:24-bookworm"}
LANGS = tuple(IMAGES)


@pytest.fixture(params=LANGS)
def lang(request: pytest.FixtureRequest, engine: Any) -> str:
    name: str = request.param
    try:
        engine.images.get(IMAGES[name])
    except Exception:  # noqa: BLE001 - any failure: the image is not here
        pytest.skip(f"{IMAGES[name]} is missing; run scripts/build-image.sh (images/sandbox-node.conf)")
    return name


@pytest.fixture(params=MODES)
def runner(request: pytest.FixtureRequest, engine: Any) -> DockerRunner:
    """Cold and pooled (overrides the package fixture)."""
    return runner_for(request.param, engine)


def options_of(options_for: Options, lang: str) -> dict[str, Any]:
    """The hardened options of a request in ``lang``: its image, and the label naming the interpreter its
    container is made for (as ``profile_options`` of a decision in that language gives)."""
    options = options_for(image=IMAGES[lang])
    options["labels"] = {**options["labels"], INTERPRETER_LABEL: lang}
    return options


def run(
    runner: DockerRunner, options_for: Options, lang: str, code: str, *, timeout_s: float = 20,
    files: dict[str, bytes] | None = None, env: dict[str, str] | None = None, **spec: Any,
) -> Outcome:  # fmt: skip
    spec.setdefault("output_bytes", 1 << 20)
    options = options_of(options_for, lang)
    if env is not None:
        options["environment"] = env
    payload = Payload(textwrap.dedent(code), language=lang, files=files or {})
    return runner.execute(RunSpec(options, timeout_s=timeout_s, **spec), payload)


def assert_gone(engine: Any, container_id: str | None) -> None:
    import docker.errors

    assert container_id is not None
    with pytest.raises(docker.errors.NotFound):
        engine.containers.get(container_id)


HELLO = {
    "shell": "echo $((2+2))\ntr a-z A-Z < in.txt > out/up.txt\n",
    "javascript": "console.log(2+2)\nconst fs = require('fs')\n"
    "fs.writeFileSync('out/up.txt', fs.readFileSync('in.txt', 'utf8').toUpperCase())\n",
}


def test_four_with_files_in_and_out(runner: DockerRunner, options_for: Options, engine: Any, lang: str) -> None:
    outcome = run(runner, options_for, lang, HELLO[lang], files={"in.txt": b"abc"})
    assert (outcome.exit_code, outcome.stdout, outcome.stderr) == (0, b"4\n", b"")
    assert outcome.files == {"up.txt": b"ABC"}
    assert_gone(engine, outcome.container_id)


CMDLINE = {
    "shell": "tr '\\0' ' ' < /proc/$$/cmdline\n",
    "javascript": "console.log(require('fs').readFileSync('/proc/self/cmdline', 'utf8').split('\\0').join(' '))\n",
}
STARTED_AHEAD = {"shell": "/bin/bash --noprofile --norc -c ", "javascript": "/usr/bin/node -e "}
FRESH = {"shell": "/bin/bash --noprofile --norc /workspace/main.sh", "javascript": "/usr/bin/node /workspace/main.js"}


def test_the_program_runs_in_the_interpreter_started_ahead(
    runner: DockerRunner, options_for: Options, lang: str
) -> None:
    # The container is made for the language: its supervisor started the interpreter (with its bootstrap) before
    # the payload, and that process runs main.*; a variable the interpreter reads only at start gets a fresh one.
    ahead = run(runner, options_for, lang, CMDLINE[lang])
    assert ahead.exit_code == 0, ahead.stderr
    assert ahead.stdout.decode().startswith(STARTED_AHEAD[lang]), ahead.stdout
    fresh = run(runner, options_for, lang, CMDLINE[lang], env={"LANG": "C.UTF-8"})
    assert fresh.stdout.decode().strip() == FRESH[lang]


BEHAVES = {
    "shell": """
    . ./lib.sh
    echo "$0 $# $(greet) $GREETING"
    echo "$*" > out/args.txt
    false
    """,
    "javascript": """
    const lib = require('./lib')
    console.log(process.argv.slice(1).join(' '), require.main === module, __filename, lib.greet(), process.env.GREETING)
    console.log(typeof fs, typeof require('fs').readFileSync, process.execArgv.length)
    require('fs').writeFileSync('out/args.txt', process.argv.length + '\\n')
    setTimeout(() => { throw new Error('late boom') }, 10)
    """,
}
LIBS = {"shell": ("lib.sh", b"greet() { echo hi; }\n"), "javascript": ("lib.js", b"exports.greet = () => 'hi'\n")}
BEHAVED = {
    "shell": (1, "/workspace/main.sh 0 hi there\n", {"args.txt": b"\n"}),
    "javascript": (
        1,
        "/workspace/main.js true /workspace/main.js hi there\nundefined function 0\n",
        {"args.txt": b"2\n"},
    ),
}


def test_a_program_behaves_as_its_interpreter_runs_it_alone(
    runner: DockerRunner, options_for: Options, lang: str
) -> None:
    name, lib = LIBS[lang]
    outcome = run(runner, options_for, lang, BEHAVES[lang], files={name: lib}, env={"GREETING": "there"})
    assert (outcome.exit_code, outcome.stdout.decode(), outcome.files) == BEHAVED[lang], outcome.stderr
    if lang == "javascript":  # an uncaught exception: node's report, the program's own frame first
        err = outcome.stderr.decode()
        assert "Error: late boom\n    at Timeout._onTimeout (/workspace/main.js:6:" in err, err


ENDINGS = (
    "console.log('set')\nprocess.exitCode = 3\n",
    "setTimeout(() => console.log('never'), 1e6).unref()\nprocess.on('exit', (c) => console.log('exit', c))\n",
    "let n = 0\nprocess.on('beforeExit', () => { if (n++ < 2) setTimeout(() => console.log('more', n), 1) })\n",
    "Promise.reject(new Error('no'))\n",
    "process.stdout.write('b'.repeat(300000))\nconsole.error('done')\n",
)


@pytest.mark.parametrize("code", ENDINGS, ids=["exit code", "exit listener", "beforeExit", "rejection", "output"])
def test_a_javascript_program_ends_as_a_fresh_node_ends_it(
    runner: DockerRunner, options_for: Options, engine: Any, code: str
) -> None:
    # The node started ahead ends the run at its natural end without node's teardown (``NODE_BOOT``) only when
    # nothing else could run; a fresh node (LANG) ends alone: status, output and the report's first line agree.
    engine.images.get(IMAGES["javascript"])
    ahead = run(runner, options_for, "javascript", code)
    fresh = run(runner, options_for, "javascript", code, env={"LANG": "C.UTF-8"})
    seen = [(o.exit_code, o.stdout, o.stderr.split(b"\n    at ")[0]) for o in (ahead, fresh)]
    assert seen[0] == seen[1]


def test_a_container_made_for_one_language_serves_no_other(
    runner: DockerRunner, options_for: Options, engine: Any, lang: str
) -> None:
    made = options_of(options_for, lang)
    for other in (options_for(), options_of(options_for, "shell" if lang == "javascript" else "javascript")):
        idle = runner.prepare_pooled(profile_part(made), ttl_s=60)
        with pytest.raises(UnsafeOptionsError, match="labels"):
            runner.claim(idle, RunSpec(other, timeout_s=10, output_bytes=1024))
        runner.discard(idle)
        assert_gone(engine, idle.container_id)


FORK_BOMB = {
    "shell": "f() { f | f & }\nf\nwait\n",
    "javascript": "const {spawn} = require('child_process')\n"
    "for (;;) { try { spawn(process.execPath, [__filename], {stdio: 'ignore'}) } catch (e) {} }\n",
}


def test_fork_bomb_is_contained(runner: DockerRunner, options_for: Options, engine: Any, lang: str) -> None:
    outcome = run(runner, options_for, lang, FORK_BOMB[lang], timeout_s=5)
    assert outcome.timed_out or outcome.resource_killed or outcome.exit_code is not None
    assert_gone(engine, outcome.container_id)
    assert run(runner, options_for, lang, HELLO[lang], files={"in.txt": b"x"}).stdout == b"4\n"


MEMORY_BOMB = {
    "shell": "x=aaaaaaaaaaaaaaaa\nwhile :; do x=$x$x; done\n",
    "javascript": "const a = []\nfor (;;) a.push(Buffer.alloc(1 << 24, 1))\n",
}


def test_memory_bomb_ends_the_program(runner: DockerRunner, options_for: Options, engine: Any, lang: str) -> None:
    outcome = run(runner, options_for, lang, MEMORY_BOMB[lang])
    assert not outcome.timed_out
    assert outcome.oom_killed or outcome.resource_killed or outcome.exit_code not in (0, None)
    assert_gone(engine, outcome.container_id)


LOOPS = {
    "shell": ["while :; do :; done", "sleep 1000 &\nwait"],
    "javascript": ["for (;;) {}", "setInterval(() => {}, 1000)"],
}


@pytest.mark.parametrize("which", [0, 1], ids=["busy", "waiting"])
def test_killed_at_deadline(runner: DockerRunner, options_for: Options, engine: Any, lang: str, which: int) -> None:
    deadline = 2.0
    outcome = run(runner, options_for, lang, LOOPS[lang][which], timeout_s=deadline)
    assert outcome.timed_out
    assert outcome.exit_code is None
    assert deadline <= outcome.duration_ms / 1000 < deadline + 2
    assert_gone(engine, outcome.container_id)


LEFT_BEHIND = {
    "shell": "(sleep 1; echo late) &\nsetsid sleep 1000 &\nnohup sleep 1000 >/dev/null 2>&1 &\necho done\n",
    "javascript": "const {spawn} = require('child_process')\n"
    "spawn('sleep', ['1000'], {detached: true, stdio: 'ignore'}).unref()\n"
    "spawn('sh', ['-c', 'sleep 1; echo late'], {detached: true, stdio: ['ignore', 'inherit', 'inherit']}).unref()\n"
    "console.log('done')\n",
}


def test_processes_left_behind_die_with_the_run(
    runner: DockerRunner, options_for: Options, engine: Any, lang: str
) -> None:
    outcome = run(runner, options_for, lang, LEFT_BEHIND[lang], timeout_s=20)
    assert (outcome.exit_code, outcome.stdout) == (0, b"done\n")
    assert not outcome.timed_out  # the run ended with its program, not at the deadline
    assert_gone(engine, outcome.container_id)


FLOOD = {
    "shell": "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n",
    # Writes as fast as the pipe drains (a loop that never yields only fills node's own buffer, until memory
    # ends it: contained too, but no flood reaches the cap).
    "javascript": "const s = 'x'.repeat(65536)\n"
    "function flood() { while (process.stdout.write(s)); process.stdout.once('drain', flood) }\nflood()\n",
}


def test_output_flood_is_capped_and_stopped(runner: DockerRunner, options_for: Options, engine: Any, lang: str) -> None:
    cap = 64 << 10
    outcome = run(runner, options_for, lang, FLOOD[lang], output_bytes=cap)
    assert outcome.stdout_truncated
    assert outcome.output_limit_killed
    assert not outcome.timed_out
    assert len(outcome.stdout) == cap
    assert_gone(engine, outcome.container_id)


PROBE = {
    "shell": """
    for p in /etc/gw-probe /usr/gw-probe /gw-probe /usr/lib/gw-probe; do
        if (echo x > "$p") 2>/dev/null; then echo "written $p"; fi
    done
    echo ok > /workspace/out/w.txt
    echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
    grep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status | tr -d '\\t'
    for n in /sys/class/net/*; do printf '%s ' "${n##*/}"; done; echo
    (exec 3<>/dev/tcp/1.1.1.1/53) 2>/dev/null && echo "connected"
    echo end
    """,
    "javascript": """
    const fs = require('fs')
    for (const p of ['/etc/gw-probe', '/usr/gw-probe', '/gw-probe', '/usr/lib/gw-probe']) {
      try { fs.writeFileSync(p, 'x'); console.log('written ' + p) } catch (e) {}
    }
    fs.writeFileSync('/workspace/out/w.txt', 'ok\\n')
    console.log(`uid=${process.getuid()} gid=${process.getgid()} groups=${process.getgroups().join(' ')}`)
    for (const l of fs.readFileSync('/proc/self/status', 'utf8').split('\\n'))
      if (/^(CapEff|CapPrm|NoNewPrivs):/.test(l)) console.log(l.replace(/\\t/g, ''))
    console.log(fs.readdirSync('/sys/class/net').join(' ') + ' ')
    const s = require('net').connect(53, '1.1.1.1')
    s.on('connect', () => { console.log('connected'); s.destroy() })
    s.on('error', () => console.log('end'))
    """,
}


def test_no_writes_outside_the_workspace_no_privileges_no_network(
    runner: DockerRunner, options_for: Options, lang: str
) -> None:
    outcome = run(runner, options_for, lang, PROBE[lang])
    assert outcome.exit_code == 0, outcome.stderr
    lines = outcome.stdout.decode().splitlines()
    assert not [line for line in lines if line.startswith(("written", "connected"))], lines
    assert outcome.files == {"w.txt": b"ok\n"}
    ids = next(line for line in lines if line.startswith("uid="))
    assert ids == "uid=65534 gid=65534 groups=65534", ids
    status = dict(line.split(":", 1) for line in lines if line.startswith(("Cap", "NoNew")))
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapPrm"], 16) == 0
    assert status.get("NoNewPrivs", "1") == "1"  # absent only under gVisor
    net = next(line for line in lines if line.endswith(" "))
    assert net.split() == ["lo"]
    assert lines[-1] == "end"


@pytest.mark.parametrize(
    "case",
    [
        ("polyglot", "shell", "echo 4"),
        ("polyglot", "javascript", "console.log(2+2)"),
        ("polyglot", "python", "print(2+2)"),
        ("coding-agent", "shell", "echo $((2+2))"),
        ("data-agent", "python", "import numpy; print(int(numpy.array([2, 2]).sum()))"),
    ],
    ids=lambda c: f"{c[0]}-{c[1]}",
)
def test_gateway_run_with_an_example_policy_and_a_language(
    engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: tuple[str, str, str]
) -> None:
    policy, lang, code = case
    image = {"javascript": IMAGES["javascript"], "data-agent": "gateway/sandbox-datascience:3.11-bookworm"}
    needed = image.get(lang) or image.get(policy)
    if needed is not None:
        try:
            engine.images.get(needed)
        except Exception:  # noqa: BLE001 - any failure: the image is not here
            pytest.skip(f"{needed} is missing; run scripts/build-image.sh")
    path = policies_dir() / "examples" / f"{policy}.yaml"
    argv = ["run", "--policy", str(path), "--language", lang, "--code", code, "--audit-dir", str(tmp_path), "--json"]
    status = main(argv)
    result = json.loads(capsys.readouterr().out)
    assert status == 0, result
    assert result["stdout"] == "4\n"


def test_gateway_run_denies_a_language_the_policy_does_not_allow(
    engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--language", "shell", "--code", "echo 4", "--audit-dir", str(tmp_path)]
    assert main(argv) == 77
    assert "language.supported" in capsys.readouterr().err
