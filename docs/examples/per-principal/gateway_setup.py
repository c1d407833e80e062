"""One gateway, one policy per principal: the CI bots under gVisor, the analytics agents under their
team's policy, every other principal (and a request that names none) under the shipped default."""

from pathlib import Path

from gateway import Gateway, PolicySet, load_policy
from gateway.audit.jsonl import JsonlAuditTrail
from gateway.runner.docker.runner import DockerRunner

EXAMPLES = Path(__file__).resolve().parent.parent
POLICIES = EXAMPLES.parent.parent / "policies"

policies = PolicySet.of(
    load_policy(POLICIES / "default.yaml"),
    {
        "ci-bot": load_policy(EXAMPLES / "gvisor-ci" / "ci-bots.yaml"),
        "analytics-agent": load_policy(EXAMPLES / "writing" / "analytics.yaml"),
    },
)


def make_gateway() -> Gateway:
    """A Gateway over the policy set, the trail from GATEWAY_AUDIT_DIR (or ./audit), Docker from DOCKER_HOST."""
    return Gateway(policies, runner=DockerRunner(), audit=JsonlAuditTrail.from_env())
