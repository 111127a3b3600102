"""The managed apiserver's own audit log: who made each request, and whom it impersonated.

Every request that reached the managed cluster through hubproxy was made by the agent's
ServiceAccount impersonating a prefixed hub identity; the agent's credential was never used
bare (except for the SelfSubjectAccessReviews in which it asks about itself at start); and
no token appears in the audit log or in the gateway's and agent's output.
"""

from __future__ import annotations

import json
import time

from tests.realkube.conftest import AGENT_SA, CLUSTER, PREFIX, Fleet
from tests.realkube.test_agent_profiles import AGENT_USER as READ_ONLY_AGENT_USER

AGENT_USER = "system:serviceaccount:{}:{}".format(*AGENT_SA)


def test_every_agent_request_impersonates_the_mapped_hub_user(fleet: Fleet) -> None:
    code, _ = fleet.gateway.curl(
        f"/{CLUSTER}/api/v1/namespaces/team/configmaps/audit-marker", fleet.alice)
    assert code == 404  # a real answer from the managed apiserver, as alice's mapped identity

    events = fleet.managed.audit_events()
    marker = [e for e in events if e["requestURI"].endswith("/configmaps/audit-marker")]
    assert len(marker) == 1, marker
    assert marker[0]["user"]["username"] == AGENT_USER
    assert marker[0]["impersonatedUser"]["username"] == f"{PREFIX}system:serviceaccount:fleet:alice"
    assert marker[0]["impersonatedUser"]["uid"] == fleet.alice_uid
    assert marker[0]["responseStatus"]["code"] == 404

    # (A request refused before authentication has no user in its event.)
    by_agent = [e for e in events if e.get("user", {}).get("username") == AGENT_USER]
    # The one exception, by design: at start the agent asks which impersonation profile its
    # own credential holds (SelfSubjectAccessReviews: a question about itself, no action).
    asked_about_itself = [e for e in by_agent if e["verb"] == "create" and e["requestURI"]
                          == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"]
    assert asked_about_itself and all("impersonatedUser" not in e for e in asked_about_itself)
    by_agent = [e for e in by_agent if e not in asked_about_itself]
    # And, for an agent that joined with `hubproxy cluster add` (test_join.py), reading and
    # updating its own credentials Secret, the one object its Role names (resourceNames).
    own_secret = [e for e in by_agent if e["requestURI"] ==
                  "/api/v1/namespaces/hubproxy-agent/secrets/hubproxy-agent-credentials"]
    assert all(e["verb"] in ("get", "update") and "impersonatedUser" not in e
               for e in own_secret)
    by_agent = [e for e in by_agent if e not in own_secret]
    bare = [e["requestURI"] for e in by_agent if "impersonatedUser" not in e]
    assert bare == [], "the agent's credential was used without impersonation"
    assert all(e["impersonatedUser"]["username"].startswith(PREFIX) for e in by_agent)
    # Every request that acted as a hub identity came through an agent: this one, or the
    # read-only profile's agent of test_agent_profiles.py when that ran first (same apiserver).
    as_hub = [e for e in events
              if e.get("impersonatedUser", {}).get("username", "").startswith(PREFIX)]
    assert AGENT_USER in {e["user"]["username"] for e in as_hub}
    assert {e["user"]["username"] for e in as_hub} <= {AGENT_USER, READ_ONLY_AGENT_USER}
    # And those requests were the tier's traffic (tests in this directory ran before), not one.
    assert len(by_agent) > 1


def test_no_token_in_audit_logs_or_process_output(fleet: Fleet) -> None:
    text = (fleet.managed.audit_log.read_text() + fleet.hub.audit_log.read_text()
            + fleet.gateway.logs())
    leaked = [i for i, token in enumerate(fleet.tokens) if token in text]
    assert leaked == []
    # The gateway's audit lines are there and name the hub user, not the credential.
    lines = [json.loads(line) for line in fleet.gateway.process.output.splitlines()
             if line.startswith('{"event":"request"')]
    assert any(line.get("user") == "system:serviceaccount:fleet:alice" for line in lines)


def test_one_id_per_request_from_the_gateway_audit_line_to_the_managed_audit_event(
        fleet: Fleet) -> None:
    """Issue 24: the managed apiserver's event of each request joins the gateway's audit line.
    Several requests of one user (the agent's identity cache at work), over HTTP/1.1 and
    HTTP/2, each with an Audit-ID of the client's own: for every one, the event's ``auditID``,
    its ``hubproxy.dev/request-id`` extra and the ``Audit-Id`` the client got back are the
    gateway's ``request_id``, and no two requests share it. (The agent cached the extra with the
    user: 49 of 53 requests of one run carried the first request's id, and no Audit-ID was
    set, so the apiserver made up its own.)"""
    answered: dict[str, str] = {}  # marker -> the Audit-Id the client got
    for i in range(6):
        marker = f"audit-id-probe-{i}"
        head_file = fleet.root / f"{marker}.head"
        code, _ = fleet.gateway.curl(
            f"/{CLUSTER}/api/v1/namespaces/team/configmaps/{marker}", fleet.alice,
            "--http2" if i % 2 else "--http1.1", "-D", str(head_file),
            "-H", f"Audit-ID: chosen-by-the-client-{i}")
        assert code == 404  # answered by the managed apiserver, as alice's mapped identity
        fields = [line.partition(":") for line in head_file.read_text().splitlines()]
        answered[marker] = next(v.strip() for k, _, v in fields if k.lower() == "audit-id")

    lines: dict[str, str] = {}
    deadline = time.monotonic() + 10
    while len(lines) < len(answered) and time.monotonic() < deadline:
        lines = {line["path"].rpartition("/")[2]: line["request_id"]
                 for line in (json.loads(text) for text in fleet.gateway.process.lines
                              if text.startswith('{"event":"request"'))
                 if "/configmaps/audit-id-probe-" in line.get("path", "")}
        time.sleep(0.1)
    events = {e["requestURI"].rpartition("/")[2]: e for e in fleet.managed.audit_events()
              if "/configmaps/audit-id-probe-" in e["requestURI"]}
    assert set(lines) == set(events) == set(answered)
    for marker, request_id in lines.items():
        event = events[marker]
        assert event["auditID"] == request_id, (marker, event["auditID"], request_id)
        assert event["impersonatedUser"]["extra"]["hubproxy.dev/request-id"] == [request_id]
        assert answered[marker] == request_id
    assert len(set(lines.values())) == len(lines)
