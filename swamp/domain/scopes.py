"""What an admin credential may do: its *scope*, and the scope each admin verb needs.

A server token carries one of three scopes, each covering the ones before it:

- ``metrics`` — ``GET /metrics`` and nothing else: what a Prometheus scraper needs.
- ``read`` — also everything that only looks: the lists (workers, the queue, worker tokens,
  workflows and their runs), ``data query``, ``swamp logs``, workflow ``show`` and
  ``validate``, ``/health``'s details and the build when downloads are private.
- ``admin`` — also everything that changes something or runs something: minting and revoking
  worker tokens, running a method or a workflow, cancelling a run, ``worker verify``, which
  dispatches a probe to every worker it selects, and ``worker drain``.

The local credential (``.swamp/serve.json``) and ``--auth none`` are ``admin``, and so is a
token stored before scopes existed. A stored scope this version does not know counts as the
narrowest (``metrics``): a credential fails closed.

:data:`VERBS` is the one table of who may call what; a verb missing from it needs ``admin``
(the orchestrator also refuses to start with an admin frame that is not in it, and a unit test
compares it with the wire's list). :func:`refusal` is the one message, whichever route asked.
"""

from __future__ import annotations

from enum import Enum

from swamp.errors import UserError


class Scope(Enum):
    METRICS = "metrics"
    READ = "read"
    ADMIN = "admin"

    def covers(self, needed: Scope) -> bool:
        return _RANK[self] >= _RANK[needed]


_RANK = {Scope.METRICS: 0, Scope.READ: 1, Scope.ADMIN: 2}
DEFAULT = Scope.ADMIN
NAMES = tuple(scope.value for scope in Scope)

#: Every admin verb — the websocket's admin frames and the HTTP routes an admin credential
#: opens — and the scope it needs.
VERBS: dict[str, Scope] = {
    # HTTP
    "GET /metrics": Scope.METRICS,
    "GET /health (details)": Scope.READ,
    "GET /swamp.pyz (private downloads)": Scope.READ,
    # admin frames that only look
    "server.info": Scope.READ,
    "ui.login": Scope.READ,  # a login link for the web pages, with the caller's own scope
    "worker.list": Scope.READ,
    "worker.queue.list": Scope.READ,
    "worker.token.list": Scope.READ,
    "workflow.list": Scope.READ,
    "workflow.show": Scope.READ,
    "workflow.validate": Scope.READ,
    "workflow.history": Scope.READ,
    "workflow.history.get": Scope.READ,
    "data.query": Scope.READ,
    "logs.read": Scope.READ,  # what steps printed: as data.query reads what they wrote
    "model.method.follow": Scope.READ,  # a step's outcome, by its id: as logs.read reads it
    # admin frames that change or run something
    "worker.token.create": Scope.ADMIN,
    "worker.token.revoke": Scope.ADMIN,
    "worker.verify": Scope.ADMIN,  # dispatches a probe to each selected worker
    "worker.drain.ask": Scope.ADMIN,  # a worker stops taking steps and leaves
    "model.method.run": Scope.ADMIN,
    "workflow.run": Scope.ADMIN,
    "workflow.cancel": Scope.ADMIN,
    # the orchestrator's own machine only (its local credential), whatever the scope
    "server.token.create": Scope.ADMIN,
    "server.token.list": Scope.READ,
    "server.token.revoke": Scope.ADMIN,
}


def needed(verb: str) -> Scope:
    """The scope ``verb`` needs; a verb nobody listed needs ``admin`` (fail closed)."""
    return VERBS.get(verb, Scope.ADMIN)


def parse_scope(text: object, *, what: str = "--scope") -> Scope:
    """A scope the operator typed (``swamp server token create --scope``)."""
    for scope in Scope:
        if text == scope.value:
            return scope
    shown = text[:40] if isinstance(text, str) else text
    raise UserError(f"invalid {what} {shown!r}: expected one of {', '.join(NAMES)}")


def stored_scope(attributes: dict) -> Scope:
    """The scope of a stored server token: absent (minted before scopes) is ``admin``; a value
    this version does not know is the narrowest."""
    value = attributes.get("scope")
    if value is None:
        return Scope.ADMIN
    return next((scope for scope in Scope if scope.value == value), Scope.METRICS)


def refusal(verb: str, held: Scope, *, who: str) -> str | None:
    """Why ``who`` (holding ``held``) may not call ``verb``, or ``None`` if it may."""
    need = needed(verb)
    if held.covers(need):
        return None
    return (
        f"{who} has the {held.value} scope, and {verb} needs {need.value}: ask for a token "
        f"of that scope ('swamp server token create NAME --scope {need.value}')"
    )
