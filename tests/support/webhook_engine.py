"""Warden's control surface without a model: a stand-in engine for fleet tests that need many.

Serves warden's real webhook routes (``/warden/alertmanager``, ``/warden/state``, overrides)
with the real controller, leases and policy, and ``/metrics`` from the process registry, in a
process of its own (so each has its own controller), without vLLM. Fleet tests that must show
the relay addressing five engines use these; the fleet test with real engines uses vLLM.

    python -m tests.support.webhook_engine --port 8123
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI
from prometheus_client import make_asgi_app

from warden.engine import runtime, webhook


def build_app() -> FastAPI:
    app = FastAPI()
    # This process's runtime, built now: its gauges are on /metrics from the first scrape.
    runtime.install(app, runtime.process_runtime())
    app.include_router(webhook.router)
    app.mount("/metrics", make_asgi_app())
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
