"""The agent's impersonation profile from SelfSubjectAccessReview answers (issue 14 item 9).

The answers themselves come from the real apiserver in tests/realkube/test_agent_profiles.py;
here the pure classification and what reaches the log.
"""

from __future__ import annotations

import asyncio
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


async def test_asked_until_the_apiserver_answers_and_not_again_after_a_4xx(tmp_path) -> None:
    """A real answer (kubesim: the admin holds system:masters, so legacy); a 500 means "ask
    again"; a 404 (no such API) is a final "unknown", asked once."""
    from aiohttp import web

    from gateway.agent.impersonation import ProfileWatch
    from gateway.agent.kubeapi import KubeAPIAccess, TokenSource
    from kubesim.testing import run_kubesim

    answer = {"status": 500}

    async def review_api(request: web.Request) -> web.StreamResponse | None:
        if request.path.endswith("/selfsubjectaccessreviews") and answer["status"]:
            return web.Response(status=answer["status"], text="no")
        return None

    async with run_kubesim(tmp_path, name="managed") as sim:
        host, port = sim.url.removeprefix("https://").rsplit(":", 1)
        kube = KubeAPIAccess(host=host, port=int(port), ca_file=str(sim.ca_file),
                             token=TokenSource(token=sim.admin_token), source="test")
        undo = sim.intercept(review_api)
        watch = ProfileWatch(kube)
        running = asyncio.ensure_future(watch.run(retry=0.05))
        await asyncio.sleep(0.5)
        assert not running.done() and watch.profile.name == "unknown"  # 500: asking again
        answer["status"] = 0
        await asyncio.wait_for(running, 10)
        assert watch.profile.name == "legacy"

        answer["status"] = 404
        again = ProfileWatch(kube)
        await asyncio.wait_for(again.run(retry=0.05), 10)  # returns at once: final
        assert again.profile.name == "unknown" and again.profile.final
        assert "answered 404" in again.profile.describe()
        undo()
