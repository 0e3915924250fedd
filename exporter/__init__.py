"""In-engine exporter: collectors that run inside vLLM's processes and publish warden metrics."""

__version__ = "0.1.0"
