"""Hubbub: a real-time chat service (FastAPI WebSockets, bounded outboxes, pluggable broker)."""

__version__ = "0.1.0"
