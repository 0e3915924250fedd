"""Code vLLM loads into its API server (and workers): admission middleware, the Alertmanager
webhook and override routes, health endpoints, the endpoint plugin that wires the local reflex,
and the worker extension. ``launch`` names these hooks for the command that starts vLLM."""
