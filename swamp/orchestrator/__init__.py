"""The orchestrator: one process, one port: websocket control plane + HTTP data plane."""
