"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and strategic merge patch.

Strategic merge is approximated: it is a merge patch, except that lists of objects which all
carry a `name` (containers, ports, env, ...) are merged by name, and the `$setElementOrder`,
`$retainKeys`, `$patch` and `$deleteFromPrimitiveList` directives kubectl emits are honoured
or dropped. That is enough for `kubectl apply`/`kubectl patch` on the types kubesim serves.
Errors raise PatchError, which the server answers with kube-apiserver's status for it.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(Exception):
    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _named_list(items: Any) -> bool:
    return (
        isinstance(items, list)
        and bool(items)
        and all(isinstance(i, dict) and "name" in i for i in items)
    )


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    for key, value in patch.items():
        if key.startswith("$"):
            if key.startswith("$deleteFromPrimitiveList/"):
                field = key.split("/", 1)[1]
                result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif (
            isinstance(value, list)
            and (_named_list(value) or _named_list(result.get(key)))
            and isinstance(result.get(key), list)
        ):
            result[key] = _merge_named(result[key], value, orders.get(key))
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    for key, order in orders.items():
        if key not in patch and isinstance(result.get(key), list) and _named_list(order):
            result[key] = _merge_named(result[key], [], order)
    return result


def _merge_named(current: list[Any], patch: list[Any], order: list[Any] | None) -> list[Any]:
    by_name = {i.get("name"): i for i in current if isinstance(i, dict)}
    for item in patch:
        name = item.get("name")
        if item.get("$patch") == "delete":
            by_name.pop(name, None)
        else:
            by_name[name] = strategic_merge_patch(by_name.get(name), item)
    if order:
        names = [o.get("name") for o in order if isinstance(o, dict)]
        return [by_name[n] for n in names if n in by_name] + [
            v for k, v in by_name.items() if k not in names
        ]
    return list(by_name.values())


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer: {path!r}", 400)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        if isinstance(doc, dict):
            if part not in doc:
                raise PatchError(f'doc is missing path: "{path}": missing value')
            doc = doc[part]
        elif isinstance(doc, list):
            try:
                doc = doc[int(part)]
            except (ValueError, IndexError) as exc:
                raise PatchError(f'doc is missing path: "{path}": missing value') from exc
        else:
            raise PatchError(f'doc is missing path: "{path}": missing value')
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch", 400)
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op:
            raise PatchError("Unexpected kind: <nil>", 400)
        kind, path = op["op"], op.get("path", "")
        if kind == "test":
            if _walk(doc, _pointer(path), path) != op.get("value"):
                raise PatchError(f"testing value {path} failed: test failed")
            continue
        if kind in ("move", "copy"):
            src = op.get("from", "")
            value = copy.deepcopy(_walk(doc, _pointer(src), src))
            if kind == "move":
                doc = _remove(doc, src)
            doc = _add(doc, path, value)
        elif kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            doc = _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        else:
            raise PatchError(f"Unexpected kind: {kind}", 400)
    return doc


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                index = int(last)
            except ValueError as exc:
                raise PatchError(
                    f'add operation does not apply: doc is missing path: "{path}"'
                ) from exc
            if not 0 <= index <= len(parent):
                raise PatchError(f'add operation does not apply: doc is missing path: "{path}"')
            parent.insert(index, value)
    else:
        raise PatchError(f'add operation does not apply: doc is missing path: "{path}"')
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return None
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    try:
        if isinstance(parent, dict):
            del parent[last]
        elif isinstance(parent, list):
            del parent[int(last)]
        else:
            raise KeyError(last)
    except (KeyError, ValueError, IndexError) as exc:
        raise PatchError(f'remove operation does not apply: doc is missing path: "{path}"') from exc
    return doc
