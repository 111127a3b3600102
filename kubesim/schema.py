"""Structural-schema validation and pruning of custom resources (a subset of kube-apiserver's).

Checks `type`, `nullable`, `required`, `enum`, `properties`, `additionalProperties`, `items`,
`minLength`/`maxLength`, `pattern`, `minimum`/`maximum`, `minItems`/`maxItems`,
`x-kubernetes-int-or-string` and `x-kubernetes-preserve-unknown-fields`, producing
field errors worded like the real apiserver's, e.g.
`status.conditions: Invalid value: "null": status.conditions in body must be of type array: "null"`.
Unknown fields are pruned as the apiserver does for structural schemas.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kubesim.status import FieldError

_ROOT_KEEP = {"apiVersion", "kind", "metadata"}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _matches_type(value: Any, wanted: str) -> bool:
    actual = _type_name(value)
    if wanted == "number":
        return actual in ("integer", "number")
    if wanted == "integer" and isinstance(value, float) and value.is_integer():
        return True
    return actual == wanted


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "FieldValueInvalid", f"Invalid value: {_show(value)}: {detail}")


def validate(value: Any, schema: dict[str, Any] | None, path: str = "") -> list[FieldError]:
    if not schema:
        return []
    errors: list[FieldError] = []
    wanted = schema.get("type")
    if value is None:
        if schema.get("nullable") or not wanted:
            return []
        return [_invalid(path, "null", f'{path} in body must be of type {wanted}: "null"')]
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str) or isinstance(value, bool):
            errors.append(
                _invalid(
                    path,
                    _type_name(value),
                    f'{path} in body must be of type integer,string: "{_type_name(value)}"',
                )
            )
        return errors
    if wanted and not _matches_type(value, wanted):
        actual = _type_name(value)
        return [_invalid(path, actual, f'{path} in body must be of type {wanted}: "{actual}"')]
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_show(v) for v in schema["enum"])
        errors.append(
            FieldError(
                path,
                "FieldValueNotSupported",
                f"Unsupported value: {_show(value)}: supported values: {supported}",
            )
        )
    if isinstance(value, str):
        errors.extend(_string_checks(value, schema, path))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(
                _invalid(
                    path,
                    value,
                    f"{path} in body should be greater than or equal to {schema['minimum']}",
                )
            )
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(
                _invalid(
                    path,
                    value,
                    f"{path} in body should be less than or equal to {schema['maximum']}",
                )
            )
    if isinstance(value, dict):
        errors.extend(_object_checks(value, schema, path))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(
                _invalid(
                    path,
                    len(value),
                    f"{path} in body should have at least {schema['minItems']} items",
                )
            )
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(
                FieldError(
                    path,
                    "FieldValueTooMany",
                    f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
                )
            )
        for i, item in enumerate(value):
            errors.extend(validate(item, schema.get("items"), f"{path}[{i}]"))
    return errors


def _string_checks(value: str, schema: dict[str, Any], path: str) -> list[FieldError]:
    errors = []
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(
            _invalid(
                path, value, f"{path} in body should be at least {schema['minLength']} chars long"
            )
        )
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(
            FieldError(
                path,
                "FieldValueTooLong",
                f"Too long: may not be more than {schema['maxLength']} bytes",
            )
        )
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(_invalid(path, value, f"{path} in body should match '{schema['pattern']}'"))
    return errors


def _object_checks(value: dict[str, Any], schema: dict[str, Any], path: str) -> list[FieldError]:
    errors = []
    prefix = f"{path}." if path else ""
    for key in schema.get("required") or []:
        if key not in value:
            errors.append(FieldError(f"{prefix}{key}", "FieldValueRequired", "Required value"))
    props = schema.get("properties") or {}
    extra_schema = schema.get("additionalProperties")
    for key, item in value.items():
        if not path and key in _ROOT_KEEP:
            continue
        if key in props:
            errors.extend(validate(item, props[key], f"{prefix}{key}"))
        elif isinstance(extra_schema, dict):
            errors.extend(validate(item, extra_schema, f"{prefix}{key}"))
    return errors


def prune(
    value: Any,
    schema: dict[str, Any] | None,
    root: bool = True,
    removed: list[str] | None = None,
    path: str = "",
) -> Any:
    """Drop fields the schema does not know (in place), as structural pruning does.

    The paths of dropped fields are appended to `removed` (for `fieldValidation=Strict`).
    """
    if not schema or schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    prefix = f"{path}." if path else ""
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key in list(value):
            if root and key in _ROOT_KEEP:
                continue
            if props is not None and key in props:
                prune(value[key], props[key], False, removed, f"{prefix}{key}")
            elif isinstance(extra, dict):
                prune(value[key], extra, False, removed, f"{prefix}{key}")
            elif props is not None or extra is False:
                del value[key]
                if removed is not None:
                    removed.append(f"{prefix}{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            prune(item, schema.get("items"), False, removed, f"{path}[{i}]")
    return value
