"""Deciding: the closed loop from alerts and the local reflex to what the engine admits.

alertmanager (payload) -> leases -> policy (effective) -> admission (per request);
reflex (per step) -> leases. Measuring lives in ``exporter``; nothing here reads a device.
"""
