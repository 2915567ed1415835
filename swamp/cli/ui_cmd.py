"""``swamp ui``: a one-time login link to the orchestrator's web pages, opened in a browser."""

from __future__ import annotations

from pathlib import Path

import typer

from swamp.cli.common import JSON, ROUTE, Route, command, emit_json, run_async

LOGIN_TIMEOUT = 30
REDIRECT_PREFIX = "swamp-ui-"  # the files that hand the browser its link
REDIRECT_KEEP = 600  # seconds: older ones are removed (their links expired long before)


@command
def ui(
    no_browser: bool = typer.Option(
        False, "--no-browser", help="Print the login link instead of opening a browser."
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Open the web pages of the fleet (GET /ui/ on the orchestrator's port): workers,
    the queue, each worker, workflow runs, live as they change.

    Asks the running orchestrator — the repo's own (found in .swamp/serve.json, with its local
    credential), or the one --server names (with --server-token) — for a login link. The link
    works once, for about a minute; opening it starts a session in that browser with the
    scope of your credential: read sees everything, admin can also cancel runs. The session
    ends after 12 hours, on 'Log out', or when the orchestrator stops. With --no-browser the
    link is printed (open it yourself, soon); with --json it is printed as {"url": …} and no
    browser is opened. The pages also take a server token in their login form.

    Exit status: 0 done; 1 no running orchestrator to ask, or the credential refused (a
    metrics-scope token cannot open the pages).
    """
    url = run_async(_login_url, route)
    if json_output:
        emit_json({"url": url})
        return
    if not no_browser:
        if _open(url):
            print(
                "opened the fleet's pages in your browser (the login link works once); if it "
                "shows no page (a browser with a private /tmp, as snap packages have), run "
                "'swamp ui --no-browser' and open the link it prints"
            )
            return
        print("no graphical browser here: open this link within a minute (it works once):")
    print(url)


def _open(url: str) -> bool:
    """Open ``url`` in a graphical browser (``$BROWSER`` if set). Not on a Linux session
    without a display (ssh): there Python would start a console browser in this terminal,
    which cannot run the pages' script; the link is printed instead.

    The browser is given a file that leads to the link, not the link: a program's arguments
    are visible to every user of the machine (``ps``), a file made for this user only is not.
    Such files left by earlier runs (their links long expired) are removed."""
    import os
    import sys
    import webbrowser

    graphical = sys.platform in ("darwin", "win32") or any(
        os.environ.get(name) for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")
    )
    if not graphical:
        return False
    return webbrowser.open(_redirect_file(url).as_uri())


def _redirect_file(url: str) -> Path:
    """A page, readable by this user only, that sends the browser on to ``url``."""
    import html
    import os
    import tempfile
    import time

    folder = Path(tempfile.gettempdir())
    for old in folder.glob(f"{REDIRECT_PREFIX}*.html"):
        try:
            held = old.stat()
            mine = not hasattr(os, "getuid") or held.st_uid == os.getuid()
            if mine and held.st_mtime < time.time() - REDIRECT_KEEP:
                old.unlink()
        except OSError:
            pass  # another user's, or gone already
    handle, name = tempfile.mkstemp(prefix=REDIRECT_PREFIX, suffix=".html")  # mode 0600
    target = html.escape(url, quote=True)
    with open(handle, "w", encoding="utf-8") as out:
        out.write(
            '<!doctype html><meta charset="utf-8">'
            f'<meta http-equiv="refresh" content="0; url={target}">'
            f'<title>swamp ui</title><p><a href="{target}">Open the fleet\'s pages</a></p>'
        )
    return Path(name)


async def _login_url(route: Route) -> str:
    from swamp.admin.remote import RemoteAdmin
    from swamp.admin.routes import open_route
    from swamp.domain.urls import page_url
    from swamp.errors import MalformedReply, NeedsOrchestrator

    async with open_route(
        repo_dir=route.repo_dir,
        server=route.server,
        server_token=route.server_token,
        ca_cert=route.ca_cert,
        prefer_server=True,
    ) as api:
        if not isinstance(api, RemoteAdmin):
            raise NeedsOrchestrator(
                "the web pages are served by a running orchestrator: start 'swamp serve' in "
                "this repo, or pass --server URL (or set SWAMP_SERVE_URL)"
            )
        answer = await api.channel.call("ui.login", {}, timeout=LOGIN_TIMEOUT)
        path = answer.get("path") if isinstance(answer, dict) else None
        if not isinstance(path, str) or not path.startswith("/ui/login?code="):
            raise MalformedReply(f"the orchestrator at {api.url} sent no usable login link")
        return page_url(api.url, path)
