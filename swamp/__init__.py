"""swamp: an orchestrator and its worker fleets."""

__version__ = "0.1.0"
