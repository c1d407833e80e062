"""The principals store: the frozen model, strict loading with file:line errors, tokens, authentication, writes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import stat
import textwrap
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.errors import (
    EXIT_GATEWAY_FAILURE,
    EXIT_USAGE,
    PolicyError,
    PrincipalExistsError,
    PrincipalsError,
    PrincipalsInvalidError,
    PrincipalsNotFoundError,
    UnknownPrincipalError,
    exit_code_for,
)
from gateway.resources import default_policy_path
from gateway.service import principals as mod
from gateway.service.principals import (
    DEFAULT_QUOTAS,
    Principals,
    PrincipalsStore,
    Quotas,
    issue_token,
    load_principals,
    load_principals_text,
    principals_path_from_env,
    token_digest,
)

TOKEN_FORMAT = re.compile(r"agw_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")
DIGEST = "ab" * 32
POLICY = str(default_policy_path().resolve())


def _doc(body: str) -> str:
    head = "apiVersion: gateway.agent-exec/v1\nkind: Principals\n"
    return head + textwrap.dedent(body)


def _problems(text: str) -> list[str]:
    with pytest.raises(PrincipalsInvalidError) as info:
        load_principals_text(text, source="p.yaml")
    return [str(p) for p in info.value.problems]


@pytest.fixture
def store(tmp_path: Path) -> PrincipalsStore:
    return PrincipalsStore(tmp_path / "principals.yaml")


# --- the model ---------------------------------------------------------------------------------------------


def test_a_principal_without_quotas_gets_the_defaults_and_a_partial_quota_keeps_the_rest() -> None:
    text = _doc(f"""\
        principals:
        - name: a
          role: agent
          policy: {POLICY}
          tokens: [{{id: 0000000a, sha256: {DIGEST}, created: "2026-01-02T03:04:05Z"}}]
        - name: ops
          role: operator
          policy: /srv/p.yaml
          quotas: {{rpm: 5}}
          tokens: []
        """)
    loaded = load_principals_text(text, source="p.yaml")
    a, ops = loaded.get("a"), loaded.get("ops")
    assert a.quotas == DEFAULT_QUOTAS == Quotas(max_concurrent=8, rpm=600, queue=32)
    assert ops.quotas == Quotas(max_concurrent=8, rpm=5, queue=32)
    assert (a.role, a.is_operator, ops.is_operator) == ("agent", False, True)
    assert a.policy == Path(POLICY)
    assert a.tokens[0].created == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert [p.name for p in loaded] == ["a", "ops"]
    with pytest.raises(AttributeError):
        a.name = "b"  # type: ignore[misc]
    with pytest.raises(UnknownPrincipalError, match=r"no principal named 'zed'.*principals: a, ops"):
        loaded.get("zed")


def test_schema_errors_name_file_line_and_path() -> None:
    text = _doc("""\
        principals:
        - name: a
          role: admin
          policy: relative/p.yaml
          quotas: {max_concurrent: 0, burst: 3}
          tokens:
          - {id: XYZ, sha256: agw_0000000a_cleartoken, created: yesterday}
        """)
    assert _problems(text) == [
        "p.yaml:5: $.principals[0].role: 'admin' is not one of ['agent', 'operator']",
        "p.yaml:6: $.principals[0].policy: 'relative/p.yaml' is not an absolute path; "
        "`gateway principals add` stores the policy as an absolute path",
        "p.yaml:7: $.principals[0].quotas.burst: unknown field 'burst'; allowed fields here: "
        "all_rpm, max_concurrent, queue, rpm",
        "p.yaml:7: $.principals[0].quotas.max_concurrent: 0 is less than the minimum of 1",
        "p.yaml:9: $.principals[0].tokens[0].created: 'yesterday' is not a 'date-time'",
        "p.yaml:9: $.principals[0].tokens[0].id: 'XYZ' does not match '^[0-9a-f]{8}$'",
        "p.yaml:9: $.principals[0].tokens[0].sha256: 'agw_0000000a_cleartoken' is not a SHA-256 digest (64 lowercase "
        "hex digits); the file stores digests, never a clear token",
    ]


def test_duplicate_names_token_ids_and_yaml_keys_are_refused_with_their_lines() -> None:
    token = f"{{id: 0000000a, sha256: {DIGEST}, created: '2026-01-02T03:04:05Z'}}"
    text = _doc(f"""\
        principals:
        - {{name: a, role: agent, policy: /p.yaml, tokens: [{token}]}}
        - {{name: a, role: agent, policy: /q/../p.yaml, tokens: [{token}]}}
        """)
    assert _problems(text) == [
        "p.yaml:5: $.principals[1].name: duplicate principal name 'a' (first at line 4)",
        "p.yaml:5: $.principals[1].policy: '/q/../p.yaml' is not a normalised path; write '/p.yaml'",
        "p.yaml:5: $.principals[1].tokens[0].id: duplicate token id '0000000a' (first at line 4); token ids are unique",
    ]
    assert _problems(_doc("principals: []\nprincipals: []\n")) == [
        "p.yaml:4: $.principals: duplicate key 'principals' (first defined on line 3); YAML would silently keep "
        "the last one"
    ]
    assert _problems("apiVersion: gateway.agent-exec/v1\nkind: Policy\n") == [
        "p.yaml:1: $: 'principals' is required here but missing",
        "p.yaml:2: $.kind: 'Principals' was expected",
    ]


def test_a_missing_file_and_an_unreadable_one_are_their_own_errors(tmp_path: Path) -> None:
    with pytest.raises(PrincipalsNotFoundError, match="does not exist"):
        load_principals(tmp_path / "nope.yaml")
    with pytest.raises(PrincipalsError, match="cannot be read"):
        load_principals(tmp_path)  # a directory
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (mod.MAX_PRINCIPALS_BYTES + 1))
    with pytest.raises(PrincipalsInvalidError, match="problem"):
        load_principals(big)


def test_exit_codes_follow_the_errors_table() -> None:
    assert exit_code_for(UnknownPrincipalError("x")) == EXIT_USAGE
    assert exit_code_for(PrincipalExistsError("x")) == EXIT_USAGE
    assert exit_code_for(PrincipalsInvalidError("x")) == EXIT_GATEWAY_FAILURE
    assert exit_code_for(PrincipalsNotFoundError("x")) == EXIT_GATEWAY_FAILURE


def test_the_principals_file_comes_from_the_flag_then_the_environment_then_the_working_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATEWAY_PRINCIPALS", raising=False)
    assert principals_path_from_env(None) == Path("principals.yaml")
    monkeypatch.setenv("GATEWAY_PRINCIPALS", "/etc/gw/p.yaml")
    assert principals_path_from_env(None) == Path("/etc/gw/p.yaml")
    assert principals_path_from_env("x.yaml") == Path("x.yaml")


# --- tokens ------------------------------------------------------------------------------------------------


def test_tokens_carry_the_prefix_their_id_and_256_random_bits() -> None:
    tokens = [issue_token(())[0] for _ in range(200)]
    for token in tokens:
        assert TOKEN_FORMAT.fullmatch(token), token
        secret = token.split("_", 2)[2]
        assert len(base64.urlsafe_b64decode(secret + "=")) == 32
    secrets_ = {t.split("_", 2)[2] for t in tokens}
    assert len(secrets_) == 200
    # every bit position varies across 200 secrets (a constant or truncated secret would not)
    as_ints = [int.from_bytes(base64.urlsafe_b64decode(s + "=")) for s in secrets_]
    ones = [sum((n >> bit) & 1 for n in as_ints) for bit in range(256)]
    assert all(0 < count < 200 for count in ones)


def test_a_record_stores_the_sha256_of_the_whole_token_and_its_public_id() -> None:
    token, record = issue_token((), now=datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC))
    assert record.sha256 == hashlib.sha256(token.encode()).hexdigest() == token_digest(token)
    assert token.startswith(f"agw_{record.id}_")
    assert record.created == datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert record.public_dict() == {"id": record.id, "created": "2026-05-06T07:08:09Z"}


def test_a_new_token_id_never_repeats_one_the_file_has(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = iter(["0000000a", "0000000a", "0000000b"])
    monkeypatch.setattr(secrets, "token_hex", lambda _n: next(ids))
    _token, record = issue_token({"0000000a"})
    assert record.id == "0000000b"


# --- authentication ----------------------------------------------------------------------------------------


def test_authenticate_accepts_the_right_token_and_nothing_else(store: PrincipalsStore) -> None:
    alice = store.add("alice", policy=POLICY)
    bob = store.add("bob", policy=POLICY, role="operator")
    loaded = store.load()
    principal, token_id = loaded.authenticate(alice) or (None, None)
    assert principal is not None
    assert (principal.name, token_id) == ("alice", loaded.get("alice").tokens[0].id)
    found = loaded.authenticate(bob)
    assert found is not None
    assert found[0].name == "bob"  # another principal's token is that principal, never alice
    alice_id = alice.split("_")[1]
    bob_secret = bob.split("_", 2)[2]
    wrong = [
        f"agw_{alice_id}_{bob_secret}",  # a real id with another token's secret
        alice[:-1] + ("A" if alice[-1] != "A" else "B"),  # one character off
        alice + "x",
        alice + "\n",
        " " + alice,
        alice.upper(),
        "",
        "agw_",
        "Bearer " + alice,
        alice.replace("agw_", "agx_"),
        "agw_ffffffff_" + bob_secret,  # an id nobody has
        "x" * 100_000,
        "agw_\udcff" + alice[5:],  # not encodable as UTF-8 without surrogatepass
    ]
    for token in wrong:
        assert loaded.authenticate(token) is None, token
    assert loaded.authenticate(None) is None  # type: ignore[arg-type]


def test_rotated_and_revoked_tokens_fail(store: PrincipalsStore) -> None:
    first = store.add("alice", policy=POLICY)
    second = store.rotate("alice")
    assert second != first
    loaded = store.load()
    assert loaded.authenticate(first) is None
    assert loaded.authenticate(second) is not None
    assert len(loaded.get("alice").tokens) == 1
    store.revoke("alice")
    revoked = store.load()
    assert revoked.authenticate(second) is None
    assert revoked.get("alice").tokens == ()
    third = store.rotate("alice")  # a revoked principal comes back only with a new token
    assert store.load().authenticate(third) is not None
    store.revoke("alice", remove=True)
    assert "alice" not in store.load()
    with pytest.raises(UnknownPrincipalError):
        store.revoke("alice")
    with pytest.raises(UnknownPrincipalError):
        store.rotate("alice")


def test_every_authentication_compares_digests_in_constant_time(
    store: PrincipalsStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spy on hmac.compare_digest: it runs once for every attempt, also for malformed tokens and unknown ids,
    so no answer comes back early and timing cannot tell which principals exist."""
    token = store.add("alice", policy=POLICY)
    loaded = store.load()
    calls: list[tuple[object, object]] = []
    real = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    attempts = [token, "agw_ffffffff_" + "A" * 43, "garbage", "", token[:-1] + "?"]
    results = [loaded.authenticate(t) for t in attempts]
    assert [r is not None for r in results] == [True, False, False, False, False]
    assert len(calls) == len(attempts)
    assert all(len(a) == len(b) == 64 for a, b in calls)  # always digest against digest, never the raw token


# --- storage -----------------------------------------------------------------------------------------------


def test_the_file_stores_only_digests_never_the_token(store: PrincipalsStore) -> None:
    token = store.add("alice", policy=POLICY)
    rotated = store.rotate("alice")
    text = store.path.read_text()
    for clear in (token, rotated):
        assert clear not in text
        assert clear.split("_", 2)[2] not in text  # not even the secret part
    assert token_digest(rotated) in text
    assert token_digest(token) not in text  # a rotated token leaves nothing behind
    assert load_principals(store.path).get("alice").policy == Path(POLICY)


def test_writes_are_atomic_mode_0600_and_leave_no_temporary_files(store: PrincipalsStore) -> None:
    old_umask = os.umask(0)
    try:
        store.add("alice", policy=POLICY)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    store.path.chmod(0o644)
    inode = store.path.stat().st_ino
    store.rotate("alice")
    after = store.path.stat()
    assert stat.S_IMODE(after.st_mode) == 0o600
    assert after.st_ino != inode  # replaced by rename, never rewritten in place
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["principals.yaml", "principals.yaml.lock"]


def test_a_failed_write_leaves_the_old_file_whole(store: PrincipalsStore, monkeypatch: pytest.MonkeyPatch) -> None:
    token = store.add("alice", policy=POLICY)
    before = store.path.read_bytes()

    def broken_fsync(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(PrincipalsError, match="No space left on device; it is unchanged"):
        store.rotate("alice")
    monkeypatch.undo()
    assert store.path.read_bytes() == before
    assert store.load().authenticate(token) is not None
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["principals.yaml", "principals.yaml.lock"]


def test_a_change_that_would_not_load_is_never_written(store: PrincipalsStore) -> None:
    store.add("alice", policy=POLICY)
    before = store.path.read_bytes()
    with pytest.raises(PrincipalsInvalidError, match="'has space' is not a principal name"):
        store.add("has space", policy=POLICY)
    with pytest.raises(PrincipalsInvalidError) as info:  # the check of the rendered file catches the rest
        store.add("q", policy=POLICY, quotas=Quotas(max_concurrent=0))
    assert [p.path for p in info.value.problems] == ["$.principals[1].quotas.max_concurrent"]
    assert store.path.read_bytes() == before


def test_add_refuses_a_duplicate_and_a_policy_that_does_not_load(store: PrincipalsStore, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: gateway.agent-exec/v1\nkind: Policy\nmetadata: {name: x}\nspec: {}\n")
    with pytest.raises(PolicyError):
        store.add("alice", policy=bad)
    with pytest.raises(PolicyError, match="does not exist"):
        store.add("alice", policy=tmp_path / "missing.yaml")
    assert not store.path.exists()
    store.add("alice", policy=POLICY)
    with pytest.raises(PrincipalExistsError, match="already has a principal named 'alice'"):
        store.add("alice", policy=POLICY)
    assert len(store.load()) == 1


def test_concurrent_writers_are_serialised_and_lose_nothing(store: PrincipalsStore) -> None:
    names = [f"agent-{i}" for i in range(12)]
    tokens: dict[str, str] = {}
    errors: list[BaseException] = []

    def add(name: str) -> None:
        try:
            tokens[name] = PrincipalsStore(store.path).add(name, policy=POLICY)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    loaded = store.load()
    assert sorted(p.name for p in loaded) == sorted(names)
    for name, token in tokens.items():
        found = loaded.authenticate(token)
        assert found is not None
        assert found[0].name == name


def test_principals_of_refuses_duplicates_built_in_code() -> None:
    _t, record = issue_token(())
    p = mod.Principal(name="a", role="agent", policy=Path("/p.yaml"), tokens=(record,))
    with pytest.raises(PrincipalsInvalidError, match="2 problem"):
        Principals.of([p, p])
