"""Deterministic YAML text for generated files: key order kept, multi-line strings as blocks.

Generated files are committed and diffed by ``warden generate --check``, so the same input must
always give byte-identical output, and PromQL spread over lines should stay readable.
"""

from __future__ import annotations

from typing import Any

import yaml


class _BlockDumper(yaml.SafeDumper):
    """SafeDumper that indents lists under their key and writes multi-line strings as ``|``."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_BlockDumper.add_representer(str, _represent_str)


def dump_yaml(data: Any, header: str = "") -> str:
    """YAML text for ``data``, preceded by ``header`` lines turned into comments."""
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    body = yaml.dump(
        data,
        Dumper=_BlockDumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=4096,
    )
    return comments + body
