"""Label and field selectors with the syntax of k8s.io/apimachinery/pkg/labels and fields.

Label: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, comma-separated (AND).
Field: `metadata.name=x`, `metadata.namespace!=y` (the fields every resource supports).
A malformed selector raises ValueError; the caller turns it into 400 BadRequest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, str]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_CMP_RE = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|=|!=)\s*([^,=!()]*?)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside `( )`."""
    terms, depth, current = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


def _label_term(term: str) -> Predicate:
    m = _CMP_RE.match(term)
    if m:
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    m = _SET_RE.match(term)
    if not m:
        raise ValueError(f"unable to parse requirement: {term.strip()!r}")
    bang, key, op, values = m.groups()
    if op:
        if bang:
            raise ValueError(f"unable to parse requirement: {term.strip()!r}")
        options = {v.strip() for v in values.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in options
        return lambda labels: labels.get(key) not in options
    if bang:
        return lambda labels: key not in labels
    return lambda labels: key in labels


def parse_label_selector(selector: str | None) -> Predicate:
    if not selector:
        return lambda labels: True
    preds = [_label_term(t) for t in _split_terms(selector)]
    return lambda labels: all(p(labels) for p in preds)


_FIELDS = {"metadata.name", "metadata.namespace"}
# Extra field labels kube-apiserver supports per resource (group, plural).
EXTRA_FIELDS: dict[tuple[str, str], set[str]] = {
    ("", "events"): {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
    ("", "pods"): {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    ("", "secrets"): {"type"},
    ("", "namespaces"): {"status.phase"},
}


def _field_value(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def parse_field_selector(
    selector: str | None, extra: set[str] | frozenset[str] = frozenset()
) -> Callable[[dict[str, Any]], bool]:
    if not selector:
        return lambda obj: True
    preds = []
    for term in _split_terms(selector):
        m = _CMP_RE.match(term)
        if not m:
            raise ValueError(f"invalid selector: '{selector}'; can't understand '{term.strip()}'")
        path, op, value = m.groups()
        if path not in _FIELDS and path not in extra:
            raise ValueError(f"field label not supported: {path}")

        def pred(obj: dict[str, Any], path: str = path, op: str = op, value: str = value) -> bool:
            actual = _field_value(obj, path)
            return actual != value if op == "!=" else actual == value

        preds.append(pred)
    return lambda obj: all(p(obj) for p in preds)
