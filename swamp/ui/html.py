"""HTML for the pages: every text that came from a peer escaped, one layout around them.

Worker names, labels, platforms, step output and workflow names are written by peers (or by
whoever wrote a workflow file): each goes through :func:`text` — the terminal's escaping of
control and bidi characters first (``swamp.domain.text.printable``), then HTML's — so a label
``<script>`` is shown as those characters and a line of output cannot draw anything but
itself. Pages carry no inline script and no inline style (the Content-Security-Policy forbids
both); the one script (``static/ui.js``) reads what it needs from ``data-`` attributes.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from urllib.parse import quote, urlencode

from swamp.domain.text import printable

NAV = (("fleet", "/ui/", "Fleet"), ("queue", "/ui/queue", "Queue"), ("runs", "/ui/runs", "Runs"))


def text(value: object, *, keep_tab: bool = False) -> str:
    """``value`` as HTML text (or an attribute's value): controls shown, markup inert."""
    return html.escape(printable("" if value is None else value, keep_tab=keep_tab), quote=True)


def path_part(value: str) -> str:
    """``value`` as one segment of a URL path (a worker's or run's name in a link)."""
    return quote(value, safe="")


def query(**params: object) -> str:
    """``?a=1&b=2`` of the parameters that are set (lists repeat their key)."""
    pairs: list[tuple[str, str]] = []
    for key, value in params.items():
        if value is None or value == "" or value == []:
            continue
        for one in value if isinstance(value, list) else [value]:
            pairs.append((key, str(one)))
    return "?" + urlencode(pairs) if pairs else ""


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], *, cls: str = "") -> str:
    """A table of cells that are already HTML (built with :func:`text`)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def badge(status: str) -> str:
    return f'<span class="badge s-{text(status)}">{text(status)}</span>'


def page(
    *,
    title: str,
    current: str,
    main: str,
    topics: str = "",
    who: str = "",
    csrf: str = "",
) -> str:
    """A whole page: the nav, the ``main`` part (which the script replaces on a change of
    ``topics``: ``data-live``), and who is logged in."""
    nav = "".join(
        f'<a href="{href}"{" aria-current=page" if key == current else ""}>{label}</a>'
        for key, href, label in NAV
    )
    logout = (
        f'<form method="post" action="/ui/logout" class="logout">'
        f'<input type="hidden" name="csrf" value="{text(csrf)}">'
        f'<span class="who">{text(who)}</span> <button type="submit">Log out</button></form>'
        if who
        else ""
    )
    live = f' data-live="{text(topics)}"' if topics else ""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{text(title)} · swamp</title>"
        '<link rel="stylesheet" href="/ui/static/ui.css">'
        '<script src="/ui/static/ui.js" defer></script></head>'
        f'<body><header><span class="brand">swamp</span><nav>{nav}</nav>'
        f'<span class="live-state" id="live-state"></span>{logout}</header>'
        f'<main id="main"{live}>{main}</main></body></html>'
    )
