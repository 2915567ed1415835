"""The web pages of the fleet, served by the orchestrator at ``/ui/``.

A browser is hostile ground: the pages answer only a session, which only a one-time login
link (``swamp ui``) or a server token typed into the login form opens; whatever acts is a POST
from the pages' own origin with the session's CSRF token; every response forbids framing,
inline script and caching. Modules: ``sessions`` (login codes and sessions), ``html`` (the
escaping and the layout), ``views`` (each page, from the live pool, queue and records),
``live`` (server-sent events: what changed, at most twice a second), ``routes`` (the ASGI app
the data plane hands ``/ui/`` to), ``static/`` (one CSS file and one script of our own).
"""
