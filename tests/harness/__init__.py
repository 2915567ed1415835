"""In-process harnesses: real parts (a real SQLite store, the real services) joined by memory
transports instead of sockets, for tests and for measures such as ``bench/walk.py``."""
