"""The agent's impersonation profile from SelfSubjectAccessReview answers (issue 14 item 9).

The answers themselves come from the real apiserver in tests/realkube/test_agent_profiles.py;
here the pure classification and what reaches the log.
"""

from __future__ import annotations

import json

from gateway.agent.impersonation import CONSTRAINED, LEGACY, classify, review_body


def test_legacy_verb_wins_over_constrained_rules() -> None:
    # The apiserver falls back to the legacy verb: constrained rules restrict nothing then.
    assert classify(legacy=True, constrained=True, everywhere=("get",)).name == "legacy"
    assert classify(legacy=True, constrained=False).name == "legacy"


def test_constrained_reports_the_verbs_granted_everywhere() -> None:
    profile = classify(legacy=False, constrained=True, everywhere=("get", "list", "watch"))
    assert profile.name == "constrained"
    assert "every resource: get, list, watch;" in profile.describe()


def test_neither_is_none_and_says_requests_will_fail() -> None:
    profile = classify(legacy=False, constrained=False)
    assert profile.name == "none"
    assert "every request will fail" in profile.describe()


def test_reviews_ask_what_the_apiserver_checks_for_impersonate_user() -> None:
    assert json.loads(review_body(LEGACY))["spec"]["resourceAttributes"] == {
        "group": "", "resource": "users", "verb": "impersonate"}
    assert json.loads(review_body(CONSTRAINED))["spec"]["resourceAttributes"] == {
        "group": "authentication.k8s.io", "resource": "users", "verb": "impersonate:user-info"}


def test_the_profile_is_a_metric() -> None:
    from gateway.agent.metrics import AgentMetrics

    metrics = AgentMetrics()
    held = "unknown"
    metrics.impersonation_profile = lambda: held
    text = metrics.render().decode()
    assert 'hubproxy_agent_impersonation_profile{profile="unknown"} 1' in text
    held = "constrained"
    text = metrics.render().decode()
    assert 'hubproxy_agent_impersonation_profile{profile="constrained"} 1' in text
    assert 'hubproxy_agent_impersonation_profile{profile="legacy"} 0' in text
