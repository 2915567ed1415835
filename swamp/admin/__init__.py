"""One admin API: everything an operator asks of swamp, on either of two routes.

:class:`~swamp.protocol.admin.AdminApi` (the contract, which lives with the wire) lists the
operations (tokens, workers, data, method runs, verification).
:class:`~swamp.admin.local.RepoAdmin` performs them on a repo — the CLI straight on the repo, and
``swamp serve`` itself, which hands it the live orchestrator. The other route,
:class:`~swamp.admin.remote.RemoteAdmin`, sends each operation over the websocket to a running
``swamp serve``, where the same ``RepoAdmin`` performs it. So there is one implementation of each
operation, and the result, the message and the exit status are the route's only in where the
work happens. :func:`~swamp.admin.routes.open_route` picks the route.
"""
