"""The rules of the domain as plain synchronous Python: no I/O, no trio, no clock of its own.

Every function here takes values (the time, random bytes, the pool) and returns values or
decisions; the shells in ``swamp.orchestrator`` and ``swamp.worker`` perform the I/O.
"""
