"""Deciding: the closed loop from alerts and the local reflex to what the engine admits.

alertmanager (payload) -> leases -> policy (effective) -> admission (per request);
reflex (per step) -> leases. The deciding is pure (``core``, ``policy``, ``admission``, one
module per action in ``actions``); ``controller`` is the adapter that does the I/O. Measuring
lives in ``exporter``; nothing here reads a device. docs/architecture.md has the whole path.
"""
