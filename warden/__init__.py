"""vLLM Warden: the command line, the tiny test model and the stack around the exporter."""
