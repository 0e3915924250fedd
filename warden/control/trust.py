"""Whose word counts for a request's priority: the trust rule behind shedding.

Shedding refuses requests whose priority number is above a threshold, so a priority chosen by
the client would let every client exempt itself. A priority is believed only from a trusted
source: a client address in the configured networks (the gateway that sets the header and
strips it from what clients send), or a bearer API key whose SHA-256 digest is configured (no
key is ever stored). Everything else gets the configured default. Pure: the middleware passes
the request's address and headers in.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re

from warden.control.config import PrioritySettings

_PRIORITY = re.compile(r"[+-]?[0-9]{1,10}")


def _from_trusted_network(client_host: str | None, settings: PrioritySettings) -> bool:
    if not client_host or not settings.trusted_networks:
        return False
    try:
        address = ipaddress.ip_address(client_host)
    except ValueError:
        return False  # a unix socket or a name: not an address anyone configured
    return any(address in network for network in settings.trusted_networks)


def api_key_sha256(authorization: str | None) -> str | None:
    """The SHA-256 hex digest of a ``Bearer`` credential, or None when there is none."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return hashlib.sha256(credentials.strip().encode("utf-8", "surrogateescape")).hexdigest()


def _with_trusted_key(authorization: str | None, settings: PrioritySettings) -> bool:
    digest = api_key_sha256(authorization)
    if digest is None:
        return False
    # Compare every configured digest (constant time each, no early exit on a match).
    matched = False
    for trusted in settings.trusted_api_key_sha256:
        matched |= hmac.compare_digest(digest, trusted)
    return matched


def trusted(client_host: str | None, authorization: str | None, settings: PrioritySettings) -> bool:
    """Whether this request's own priority may be believed."""
    return _from_trusted_network(client_host, settings) or _with_trusted_key(
        authorization, settings
    )


def request_priority(
    header_value: str | None,
    client_host: str | None,
    authorization: str | None,
    settings: PrioritySettings,
) -> int:
    """The priority admission uses: the header's from a trusted source, else the default.

    A trusted source sending a malformed header gets the default too (never an error: the
    header is advice to warden, not part of the request vLLM runs).
    """
    if header_value is None or not trusted(client_host, authorization, settings):
        return settings.default
    text = header_value.strip()
    if not _PRIORITY.fullmatch(text):
        return settings.default
    return int(text)
