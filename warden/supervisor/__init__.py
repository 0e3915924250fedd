"""``warden serve``'s supervisor process: keeps one vLLM server serving, restarts it when it
fails, drains it before planned restarts, and stops restarting (a circuit) when failures loop."""
