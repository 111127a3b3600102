"""Join tokens and cluster records (pure): what is stored, what a token may do, what is refused."""

from __future__ import annotations

import datetime

import pytest

from gateway.hub.join.records import (
    JOINED,
    PENDING,
    REVOKED,
    ClusterRecord,
    TokenError,
    new_token,
    secret_name,
    token_cluster,
    token_hash,
)

NOW = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC)
HOUR = datetime.timedelta(hours=1)


def test_tokens_are_random_name_their_cluster_and_are_stored_as_a_hash() -> None:
    a, b = new_token("prod.eu"), new_token("prod.eu")
    assert a != b and token_cluster(a) == "prod.eu"
    assert len(a.rsplit(":", 1)[1]) == 43  # 32 random bytes
    record = ClusterRecord("prod.eu", PENDING, token_hash(a), NOW + HOUR)
    stored = "".join(record.to_data().values())
    assert a not in stored and a.rsplit(":", 1)[1] not in stored
    for bad in ("", "hpjoin1:prod", "hpjoin1::x", "other:prod:x", "hpjoin1:Prod:x",
                "hpjoin1:a:" + "x" * 500):
        with pytest.raises(TokenError):
            token_cluster(bad)


def test_a_token_joins_once_before_it_expires() -> None:
    token = new_token("c1")
    record = ClusterRecord("c1", PENDING, token_hash(token), NOW + HOUR)
    assert record.check_token(token, NOW) is None
    assert record.check_token(token, NOW + HOUR) == "the join token has expired"
    assert record.check_token(new_token("c1"), NOW) == "the join token does not match"
    joined = record.joined(NOW, NOW + 7 * 24 * HOUR)
    assert joined.state == JOINED and joined.token_hash == ""
    assert joined.check_token(token, NOW) == "the join token was already used"
    revoked = ClusterRecord("c1", REVOKED)
    assert revoked.check_token(token, NOW) == "the cluster was removed"


def test_which_certificates_a_record_refuses() -> None:
    joined = ClusterRecord("c1", JOINED, accept_from=NOW)
    assert joined.refusal(NOW) is None and joined.refusal(NOW + HOUR) is None
    assert "predates" in (joined.refusal(NOW - HOUR) or "")
    assert "removed" in (ClusterRecord("c1", REVOKED).refusal(NOW) or "")
    assert "not joined" in (ClusterRecord("c1", PENDING).refusal(NOW) or "")


def test_records_round_trip_through_secret_data() -> None:
    record = ClusterRecord("c1", JOINED, "", None, NOW, NOW + HOUR)
    assert ClusterRecord.from_data(record.to_data()) == record
    assert secret_name("c1") == "hubproxy-cluster-c1"
    with pytest.raises(ValueError):
        ClusterRecord.from_data({})
