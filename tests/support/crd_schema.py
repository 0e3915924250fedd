"""Validate a custom resource against the Prometheus Operator's CRD schema, as the API server
does with strict field validation (``kubectl apply --server-side --validate=strict``).

The schemas are the ``openAPIV3Schema`` of the operator's CRDs, vendored as test data
(tests/data/prometheus-operator/README.md says from where and how). The API server prunes
unknown fields silently unless validation is strict; here every object schema that lists its
properties (and does not say ``x-kubernetes-preserve-unknown-fields``) refuses others, so a
misspelt field is an error, not a silently ignored setting.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "data" / "prometheus-operator"
# kind -> the vendored file (the CRD's plural name).
SCHEMA_FILES = {
    "PodMonitor": "podmonitors.json",
    "PrometheusRule": "prometheusrules.json",
    "AlertmanagerConfig": "alertmanagerconfigs.json",
}


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def _validator(kind: str, version: str) -> Draft7Validator:
    crd = json.loads((SCHEMA_DIR / SCHEMA_FILES[kind]).read_text())
    assert crd["kind"] == kind, f"{SCHEMA_FILES[kind]} holds {crd['kind']}"
    return Draft7Validator(_strict(crd["versions"][version]))


def has_schema(doc: dict[str, Any]) -> bool:
    group, _, version = doc["apiVersion"].partition("/")
    if doc["kind"] not in SCHEMA_FILES:
        return False
    crd = json.loads((SCHEMA_DIR / SCHEMA_FILES[doc["kind"]]).read_text())
    return bool(crd["group"] == group and version in crd["versions"])


def crd_errors(doc: dict[str, Any]) -> list[str]:
    """Every schema violation in ``doc``, as ``path: message`` (empty: valid)."""
    version = doc["apiVersion"].partition("/")[2]
    validator = _validator(doc["kind"], version)
    return [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path)))
    ]
