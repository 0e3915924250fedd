"""Small helpers every room of warden shares: child processes, waiting, ports, metric text,
the Prometheus HTTP API. None of them imports vLLM."""
