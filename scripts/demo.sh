#!/usr/bin/env bash
# The README's main command: set everything up (idempotent), then send one sample request through the gateway
# on the embedded defaults (policies/default.yaml, the locally built sandbox image, the trail under audit/)
# and show the decision, the program's output and the audit records it left.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

GW=.venv/bin/gateway
CODE='import platform, os
print("hello from the sandbox:", platform.python_version(), "uid", os.getuid())
print("2 + 2 =", 2 + 2)'
REQUEST=$(printf '{"code": %s, "principal": "demo-agent"}' "$(printf '%s' "$CODE" | .venv/bin/python -c 'import json,sys; print(json.dumps(sys.stdin.read()))')")

echo "== 1. the decision (gateway check: nothing runs) =="
printf '%s' "$REQUEST" | "$GW" check -

echo
echo "== 2. the run (gateway run --json) =="
RESULT=$(printf '%s' "$CODE" | "$GW" run --principal demo-agent --json -) || true
printf '%s\n' "$RESULT" | .venv/bin/python -m json.tool
RID=$(printf '%s' "$RESULT" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["request_id"])')

echo
echo "== 3. a request the policy denies (asks for the host network and too much memory) =="
"$GW" run --network host --memory 64g --code 'print("never runs")' || echo "(exit status $?: denied, nothing ran)"

echo
echo "== 4. the audit records of request $RID =="
"$GW" audit query --request-id "$RID"
echo
echo "-- its execution.outcome record, as stored (hash-chained to the decision record before it) --"
"$GW" audit query --request-id "$RID" --event-type execution.outcome --json | .venv/bin/python -m json.tool

echo
echo "== 5. the audit trail verifies =="
"$GW" audit verify
