"""The orchestrator's own bookkeeping, kept as data: tokens, workers, leases.

Each book pairs the pure rules of ``swamp.domain`` with the datastore: read the latest record,
let the domain decide, write the decision as a compare-and-swap transition. The CLI (straight to
the repo) and ``swamp serve`` use the same books, so both paths obey the same invariants.
"""
