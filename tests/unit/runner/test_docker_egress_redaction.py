"""The values of a run's secrets are erased from its stdout, stderr and returned files, and each erasure listed."""

from __future__ import annotations

import base64

from gateway.egress import EgressReport
from gateway.egress.secrets import Redaction, redact
from gateway.runner.docker.egress import OutputRedactor, redact_outcome
from gateway.runner.fake import make_outcome

VALUE = "s3cr3t-0123456789abcdef?>"
VALUES = {"mirror-token": VALUE}
REPORT = EgressReport(records=(), connections=1, denied=0, bytes_out=1, bytes_in=1)


def test_every_form_of_the_value_is_replaced_by_the_secrets_name() -> None:
    raw = VALUE.encode()
    text = b"a " + raw + b" b " + base64.b64encode(raw) + b" c " + base64.urlsafe_b64encode(raw).rstrip(b"=")
    clean, counts = redact(text, VALUES)
    assert clean == b"a [secret:mirror-token] b [secret:mirror-token] c [secret:mirror-token]"
    assert counts == {"mirror-token": 3}
    assert redact(b"nothing here", VALUES) == (b"nothing here", {})


def test_the_outcome_is_redacted_where_the_value_was_found_and_says_where() -> None:
    outcome = make_outcome(
        stdout=f"token={VALUE}\n{VALUE}\n".encode(),
        stderr=b"clean\n",
        files={"echo.json": f'{{"auth": "Bearer {VALUE}"}}'.encode(), "other.txt": b"x"},
        egress=REPORT,
    )
    redacted = redact_outcome(outcome, VALUES)
    assert redacted.stdout == b"token=[secret:mirror-token]\n[secret:mirror-token]\n"
    assert redacted.stdout_bytes == len(redacted.stdout)
    assert redacted.stderr == b"clean\n"
    assert redacted.files == {"echo.json": b'{"auth": "Bearer [secret:mirror-token]"}', "other.txt": b"x"}
    assert redacted.egress is not None
    assert redacted.egress.redactions == (
        Redaction("mirror-token", "stdout", 2),
        Redaction("mirror-token", "file:echo.json", 1),
    )
    assert VALUE not in repr(redacted)


def test_an_outcome_without_the_value_or_without_secrets_is_unchanged() -> None:
    outcome = make_outcome(stdout=b"ok\n", egress=REPORT)
    assert redact_outcome(outcome, VALUES) is outcome
    echoed = make_outcome(stdout=VALUE.encode(), egress=REPORT)
    assert redact_outcome(echoed, {}) is echoed


def test_live_chunks_never_carry_a_value_split_across_them() -> None:
    got: list[tuple[str, bytes]] = []
    redactor = OutputRedactor(lambda stream, data: got.append((stream, data)), VALUES)
    raw = f"before {VALUE} between ".encode() + base64.b64encode(VALUE.encode()) + b" after"
    for index in range(0, len(raw), 5):  # every value is split across chunks
        redactor("stdout", raw[index : index + 5])
    redactor("stderr", VALUE.encode()[:3])
    streamed = b"".join(data for stream, data in got if stream == "stdout")
    assert VALUE.encode()[:8] not in streamed  # not even a prefix went out before the rest arrived
    redactor.flush()
    stdout = b"".join(data for stream, data in got if stream == "stdout")
    # (a base64 form's padding may arrive after its unpadded part was erased: it stays, and reveals nothing)
    assert stdout.replace(b"=", b"") == b"before [secret:mirror-token] between [secret:mirror-token] after"
    assert b"".join(data for stream, data in got if stream == "stderr") == VALUE.encode()[:3]
