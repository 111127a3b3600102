"""Which requests leave a Kubernetes audit event, and at which level (pure).

The policy file has kube-apiserver's shape (``--audit-policy-file``), reduced to what the gateway
can judge before it has read any body::

    apiVersion: audit.k8s.io/v1
    kind: Policy
    rules:
      - level: None
        users: ["system:serviceaccount:argocd:argocd-application-controller"]
        verbs: ["watch"]
      - level: None
        clusters: ["lab1", "lab2"]   # hubproxy's own field
      - level: Metadata

A request is matched against the rules in order and the first rule that matches decides its
level, as in kube-apiserver; a request that matches no rule is not audited (``None``). A rule
matches when each of its lists is empty or contains the request's value: ``users`` the hub
user name, ``userGroups`` any of the user's hub groups, ``clusters`` the cluster's name,
``verbs`` the Kubernetes verb (``get``, ``list``, ``watch``, ``create``, ...; for non-resource
paths the lower-cased HTTP method). Names are compared exactly, as kube-apiserver does.

Refused when loaded (:class:`PolicyError`, the gateway does not start): levels other than
``None`` and ``Metadata`` (``Request`` and ``RequestResponse`` would record bodies, which the
gateway never does), and any field this subset does not implement (``resources``,
``namespaces``, ``nonResourceURLs``, ``omitStages``, ...): silently ignoring one would audit
other requests than the operator wrote down. Without a policy file every request is audited
at ``Metadata``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

NONE = "None"
METADATA = "Metadata"
LEVELS = (NONE, METADATA)
_LISTS = ("users", "userGroups", "clusters", "verbs")
_RULE_FIELDS = frozenset({"level", *_LISTS})
_TOP_FIELDS = frozenset({"apiVersion", "kind", "metadata", "rules"})


class PolicyError(ValueError):
    """The policy cannot be used; the message names the rule and field."""


@dataclass(frozen=True, slots=True)
class Rule:
    level: str
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    clusters: frozenset[str] = frozenset()
    verbs: frozenset[str] = frozenset()

    def matches(self, user: str, groups: Sequence[str], cluster: str, verb: str) -> bool:
        if self.users and user not in self.users:
            return False
        if self.groups and not any(group in self.groups for group in groups):
            return False
        if self.clusters and cluster not in self.clusters:
            return False
        return not self.verbs or verb in self.verbs


@dataclass(frozen=True, slots=True)
class Policy:
    rules: tuple[Rule, ...]

    def level(self, user: str, groups: Sequence[str], cluster: str, verb: str) -> str:
        """The level of the first rule that matches; ``None`` when none does."""
        for rule in self.rules:
            if rule.matches(user, groups, cluster, verb):
                return rule.level
        return NONE


AUDIT_EVERYTHING = Policy((Rule(METADATA),))


def _strings(value: Any, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{where}: expected a list of strings")
    return frozenset(value)


def policy_from(document: Any) -> Policy:
    """A :class:`Policy` from a decoded YAML/JSON document; raises :class:`PolicyError`."""
    if not isinstance(document, dict):
        raise PolicyError("expected a Policy object")
    unknown = sorted(set(document) - _TOP_FIELDS)
    if unknown:
        raise PolicyError(f"field {unknown[0]!r} is not supported (supported: rules)")
    if document.get("kind", "Policy") != "Policy":
        raise PolicyError(f"kind {document.get('kind')!r}: expected Policy")
    rules_in = document.get("rules")
    if not isinstance(rules_in, list) or not rules_in:
        raise PolicyError("rules: expected a non-empty list")
    rules: list[Rule] = []
    for i, raw in enumerate(rules_in):
        where = f"rules[{i}]"
        if not isinstance(raw, dict):
            raise PolicyError(f"{where}: expected a rule object")
        unknown = sorted(set(raw) - _RULE_FIELDS)
        if unknown:
            raise PolicyError(f"{where}: field {unknown[0]!r} is not supported (supported: "
                              f"level, {', '.join(_LISTS)})")
        level = raw.get("level")
        if level not in LEVELS:
            raise PolicyError(f"{where}: level {level!r} is not supported: None or Metadata "
                              "(the gateway never records request or response bodies)")
        rules.append(Rule(level, *(_strings(raw.get(name), f"{where}.{name}")
                                   for name in _LISTS)))
    return Policy(tuple(rules))


def load_policy(path: str) -> Policy:
    """The policy in the YAML (or JSON) file ``path``; raises :class:`PolicyError`."""
    try:
        with open(path, encoding="utf-8") as file:
            document = yaml.safe_load(file)
    except OSError as exc:
        raise PolicyError(f"cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"not YAML: {str(exc).splitlines()[0]}") from None
    return policy_from(document)
