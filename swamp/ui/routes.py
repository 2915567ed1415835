"""``/ui/``: the ASGI app the data plane hands the web pages to.

Every response carries the same security headers (:data:`SECURITY`); pages are never cached.
Without a session every page answers 401 with a page that says how to get one (``swamp ui``)
and a form for a server token. Whatever changes something is a POST from the pages' own
origin (``RequestPolicy.same_origin``) carrying the session's CSRF token, and needs the admin
scope; it is performed by the admin API, as the CLI's command would be.

Routes (``GET`` unless said)::

    /ui/                      the fleet (?label=k=v, ?page=N)
    /ui/queue                 waiting steps
    /ui/workers/NAME          one worker
    /ui/runs, /ui/runs/ID     workflow runs; one run (?step=JOB.STEP: its output)
    /ui/events?topics=…       the page's event stream (swamp.ui.live)
    /ui/login?code=…          a one-time login link (swamp ui): a page that says whom it logs
                              in, whose button posts the code (a link alone changes nothing)
    POST /ui/login            the code from that page, or a server token (read or admin
                              scope) from the login form: a session, then /ui/
    POST /ui/logout           end the session
    POST /ui/runs/ID/cancel   cancel a run, or one of its steps (``step=JOB.STEP``) (admin)
    POST /ui/workers/NAME/drain  ask a worker to drain (admin)
    /ui/static/ui.css|ui.js   the style and the script

Any page with ``?part=main`` answers its main part alone: what the script swaps in. The main
parts are rendered once for every viewer of the same page (:mod:`swamp.ui.rendered`).

The session cookie's name is the orchestrator's own (:func:`cookie_name`): cookies are kept per
host, not per port, so two orchestrators on one machine would otherwise overwrite each other's.
Under TLS it is a ``__Host-`` cookie (Secure, the whole host's path, no domain). When a browser
sends the name more than once, the first that is an open session counts.
"""

from __future__ import annotations

import hashlib
import logging
from importlib import resources
from urllib.parse import parse_qs

from swamp.domain.request_policy import RequestPolicy
from swamp.domain.scopes import refusal
from swamp.domain.text import printable
from swamp.errors import (
    Busy,
    Conflict,
    Forbidden,
    NotFound,
    ScopeTooNarrow,
    SwampError,
    TooLarge,
    Unauthorized,
    UserError,
)
from swamp.orchestrator.admin_auth import AdminAuth
from swamp.protocol.messages import RunRef, WorkerDrainRequest
from swamp.ui import views
from swamp.ui.html import page, path_part, query, text
from swamp.ui.live import TOPICS, Live
from swamp.ui.rendered import Rendered
from swamp.ui.sessions import Logins, Session

log = logging.getLogger("swamp.ui")

MAX_FORM = 8 * 1024  # a form's body: a token, a CSRF token, a reason
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
#: on every /ui/ response. Referrer-Policy is same-origin, not no-referrer: under no-referrer a
#: browser sends ``Origin: null`` with a form's POST, and the same-origin check needs the origin.
SECURITY = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
NO_STORE = [(b"cache-control", b"no-store")]
STATIC = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}
_STATUS = (
    (Busy, 503),
    (TooLarge, 413),
    (NotFound, 404),
    (Unauthorized, 401),
    (ScopeTooNarrow, 403),
    (Forbidden, 403),
    (UserError, 400),
    (Conflict, 409),
)
#: which topics each page is kept live by
PAGE_TOPICS = {
    "fleet": "fleet",
    "queue": "queue",
    "worker": "fleet logs",
    "runs": "runs",
    "run": "runs logs",
}


def cookie_name(seed: str, *, secure: bool) -> str:
    """The session cookie's name for the orchestrator ``seed`` names (its repo): its own, so
    two on one host do not share one cookie; ``__Host-`` under TLS."""
    tag = hashlib.sha256(seed.encode("utf-8", "replace")).hexdigest()[:10]
    return f"{'__Host-' if secure else ''}swamp_ui_{tag}"


def _headers(scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope.get("headers") or []:
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def _status(exc: SwampError) -> int:
    return next((status for cls, status in _STATUS if isinstance(exc, cls)), 409)


class Pages:
    def __init__(
        self,
        sources: views.Sources,
        *,
        logins: Logins,
        live: Live,
        auth: AdminAuth,
        policy: RequestPolicy,
        secure: bool = False,
        cookie: str = "swamp_ui",
    ) -> None:
        self.sources = sources
        self.logins = logins
        self.live = live
        self.auth = auth
        self.policy = policy
        self.secure = secure  # the orchestrator serves TLS: the cookie is Secure
        self.cookie = cookie  # its name (cookie_name)
        self.rendered = Rendered(live)
        self._static: dict[str, bytes] = {}

    def __repr__(self) -> str:
        return f"<Pages {self.logins!r} {self.live!r}>"

    async def __call__(self, scope, receive, send) -> None:
        session: Session | None = None
        try:
            session_id, session = self._session(scope)
            await self._route(scope, receive, send, session_id, session)
        except SwampError as exc:
            status = _status(exc)
            if status == 401:
                await self._login_page(send, exc.message)
                return
            main = f'<h1>{status}</h1><p class="error">{text(exc.message)}</p>'
            await self._html(send, status, self._page("Error", "", main, session))

    # -- routing ---------------------------------------------------------------------------

    def _session(self, scope) -> tuple[str | None, Session | None]:
        """The request's session: the first of its cookies of our name that is open."""
        for value in _cookies(scope, self.cookie):
            session = self.logins.session(value)
            if session is not None:
                return value, session
        return None, None

    async def _route(
        self, scope, receive, send, session_id: str | None, session: Session | None
    ) -> None:
        method, path = scope["method"], scope["path"]
        params = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if path == "/ui":
            await self._redirect(send, "/ui/")
            return
        if path.startswith("/ui/static/") and method in ("GET", "HEAD"):
            await self._send_static(send, path.removeprefix("/ui/static/"))
            return
        if path == "/ui/login":
            if method == "GET" and "code" in params:
                await self._confirm_login(send, params["code"][0], session)
                return
            if method == "POST":
                await self._login_form(scope, receive, send)
                return
            if method in ("GET", "HEAD") and session is not None:
                await self._redirect(send, "/ui/")
                return
        if session is None:
            raise Unauthorized("no session: run 'swamp ui' for a login link")
        if method == "POST":
            form = await self._form(scope, receive, session)
            await self._act(path, form, send, session_id, session)
            return
        if method not in ("GET", "HEAD"):
            raise NotFound(f"no route {method} {printable(path[:100])}")
        if path == "/ui/events":
            wanted = {t for v in params.get("topics", []) for t in v.replace(",", " ").split()}
            topics = frozenset(wanted & TOPICS)
            if not topics:
                raise UserError("events need ?topics= of: " + ", ".join(sorted(TOPICS)))
            await self.live.stream(
                topics,
                receive,
                send,
                [*SECURITY, *NO_STORE],
                holder=session.who,  # the credential: one token opens many sessions
                still_open=lambda: self.logins.session(session_id) is not None,
            )
            return
        await self._view(path, params, send, session)

    async def _view(self, path: str, params: dict, send, session: Session) -> None:
        viewer = views.Viewer(session.may_act, session.csrf)
        # ASGI's path is decoded already: a segment is a name as it is
        parts = path.removeprefix("/ui/").split("/") if path != "/ui/" else []
        sources = self.sources
        # what the page shows depends on: its path, its parameters, and (pages with action
        # buttons) the viewer; the same key is the same page for everyone who asks
        asked = tuple(sorted((k, tuple(v)) for k, v in params.items() if k != "part"))
        own: views.Viewer | None = None  # pages with action buttons: each viewer's own
        if not parts:
            labels = [x for v in params.get("label", []) for x in v.split()]
            number = _int(params.get("page", ["1"])[0])
            only = params.get("fleet", [None])[0]

            async def render() -> str:
                return views.fleet(sources, labels, number, only)

            current, title, topics = "fleet", "Fleet", PAGE_TOPICS["fleet"]
        elif parts == ["queue"]:

            async def render() -> str:
                return await views.queue(sources)

            current, title, topics = "queue", "Queue", PAGE_TOPICS["queue"]
        elif parts == ["runs"]:

            async def render() -> str:
                return await views.runs(sources)

            current, title, topics = "runs", "Runs", PAGE_TOPICS["runs"]
        elif len(parts) == 2 and parts[0] == "runs":
            step = params.get("step", [None])[0]

            async def render() -> str:
                return await views.run(sources, parts[1], viewer, step)

            current, title, topics, own = "runs", "Run", PAGE_TOPICS["run"], viewer
        elif len(parts) == 2 and parts[0] == "workers":

            async def render() -> str:
                return await views.worker(sources, parts[1], viewer)

            current, title, topics, own = "fleet", parts[1], PAGE_TOPICS["worker"], viewer
        else:
            raise NotFound(f"no page {printable(path[:100])}")
        main = await self.rendered.get((path, asked, own), topics.split(), render)
        if params.get("part") == ["main"]:
            await self._html(send, 200, main)
            return
        await self._html(send, 200, self._page(title, current, main, session, topics))

    async def _act(
        self, path: str, form: dict[str, str], send, session_id: str | None, session: Session
    ) -> None:
        if path == "/ui/logout":
            # the session ends; its cookie is cleared (the browser forgets it)
            self.logins.end(session_id)
            await self._redirect(send, "/ui/", cookie="")
            return
        parts = path.removeprefix("/ui/").split("/")
        if len(parts) == 3 and parts[0] == "runs" and parts[2] == "cancel":
            self._may(session, "workflow.cancel")
            step = form.get("step") or None
            reason = f"cancelled from the web pages by {session.who}"
            reply = await self.sources.api.workflow_cancel(
                RunRef(parts[1], reason=reason, step=step)
            )
            run_id = str(reply.run.get("runId", ""))
            log.info(
                "workflow run %s%s cancelled from the web pages by %s",
                run_id,
                f" step {printable(step[:200])}" if step else "",
                session.who,
            )
            back = query(step=step) if step else ""
            await self._redirect(send, f"/ui/runs/{path_part(run_id)}{back}")
            return
        if len(parts) == 3 and parts[0] == "workers" and parts[2] == "drain":
            self._may(session, "worker.drain.ask")
            await self.sources.api.worker_drain(WorkerDrainRequest(name=parts[1]))
            log.info(
                "worker %s asked to drain from the web pages by %s",
                printable(parts[1][:100]),
                session.who,
            )
            await self._redirect(send, f"/ui/workers/{path_part(parts[1])}")
            return
        raise NotFound(f"no action {printable(path[:100])}")

    def _may(self, session: Session, verb: str) -> None:
        reason = refusal(verb, session.scope, who=f"this session ({session.who})")
        if reason is not None:
            raise ScopeTooNarrow(reason)

    # -- forms and logins ------------------------------------------------------------------

    async def _body(self, scope, receive) -> dict[str, str]:
        headers = _headers(scope)
        if not self.policy.same_origin(headers):
            raise Forbidden(
                "refused: this request did not come from these pages (its Origin or Referer "
                "is another site's, or missing)"
            )
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise UserError("the client went away mid-request")
            body += message.get("body", b"")
            if len(body) > MAX_FORM:
                raise TooLarge(f"a form may be at most {MAX_FORM} bytes")
            if not message.get("more_body"):
                break
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {k: v[0] for k, v in fields.items()}

    async def _form(self, scope, receive, session: Session) -> dict[str, str]:
        """A POST's fields, once its origin and CSRF token are checked."""
        form = await self._body(scope, receive)
        if not session.csrf_ok(form.get("csrf")):
            raise Forbidden("refused: the form's CSRF token is missing or wrong (reload the page)")
        return form

    async def _confirm_login(self, send, code: str, session: Session | None) -> None:
        """A login link opens this page, not a session: its button posts the code from these
        pages' own origin, so a link on another site cannot log a browser in as someone else
        (nor replace the session it has)."""
        held = self.logins.peek(code)
        if held is None:
            raise Unauthorized(
                "this login link is not valid (used already, expired or wrong): run "
                "'swamp ui' for a new one"
            )
        who, scope = held
        now = (
            f"<p>This browser is logged in as <b>{text(session.who)}</b> now; logging in "
            "ends that session here.</p>"
            if session is not None
            else ""
        )
        main = (
            "<h1>Log in</h1>"
            f"<p>This link logs this browser in as <b>{text(who)}</b> ({text(scope.value)} "
            "scope). Continue only if you ran <code>swamp ui</code> just now.</p>"
            f"{now}"
            '<form method="post" action="/ui/login" class="login">'
            f'<input type="hidden" name="code" value="{text(code)}">'
            '<button type="submit" id="log-in">Log in</button></form>'
        )
        await self._html(send, 200, page(title="Log in", current="", main=main))

    async def _login_form(self, scope, receive, send) -> None:
        form = await self._body(scope, receive)
        if "code" in form:  # the button of a login link's page
            session_id, opened = self.logins.redeem(form["code"])
            replaced, _ = self._session(scope)
            self.logins.end(replaced)  # as its page said: this browser's old session ends
            log.info("a web session opened for %s (login link)", opened.who)
            await self._redirect(send, "/ui/", cookie=session_id)
            return
        token = form.get("token", "").strip()
        identity = await self.auth.identify(f"Bearer {token}" if token else None)
        if isinstance(identity, Unauthorized):
            client = scope.get("client") or ("?", 0)
            log.warning("refused a web login from %s: %s", client[0], identity.message)
            await self._login_page(send, "that token was not accepted", status=401)
            return
        session_id, opened = self.logins.open(identity.describe(), identity.scope, identity)
        replaced, _ = self._session(scope)
        self.logins.end(replaced)  # the cookie is replaced: its old session ends
        log.info("a web session opened for %s (login form)", opened.who)
        await self._redirect(send, "/ui/", cookie=session_id)

    async def _login_page(self, send, message: str, *, status: int = 401) -> None:
        main = (
            "<h1>Log in</h1>"
            f'<p class="error">{text(message)}</p>'
            "<p>Run <code>swamp ui</code> where you run other swamp commands (in the "
            "orchestrator's repo, or with <code>--server URL --server-token …</code>): it opens "
            "a one-time login link here.</p>"
            '<form method="post" action="/ui/login" class="login">'
            "<label>or a server token (read or admin scope) "
            '<input type="password" name="token" autocomplete="off" required></label> '
            '<button type="submit">Log in</button></form>'
        )
        await self._html(send, status, page(title="Log in", current="", main=main))

    # -- responses -------------------------------------------------------------------------

    def _page(
        self, title: str, current: str, main: str, session: Session | None, topics: str = ""
    ) -> str:
        return page(
            title=title,
            current=current,
            main=main,
            topics=topics,
            who=f"{session.who} ({session.scope.value})" if session else "",
            csrf=session.csrf if session else "",
        )

    async def _html(self, send, status: int, body: str) -> None:
        data = body.encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    *SECURITY,
                    *NO_STORE,
                    (b"content-type", b"text/html; charset=utf-8"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})

    async def _redirect(self, send, location: str, *, cookie: str | None = None) -> None:
        headers = [
            *SECURITY,
            *NO_STORE,
            (b"location", location.encode()),
            (b"content-length", b"0"),
        ]
        if cookie is not None:
            headers.append((b"set-cookie", self._cookie_header(cookie).encode()))
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    def _cookie_header(self, value: str) -> str:
        # a __Host- cookie must be Secure, for the path /, with no domain
        where = "Path=/" if self.secure else "Path=/ui/"
        parts = [f"{self.cookie}={value}", "HttpOnly", "SameSite=Strict", where]
        if not value:
            parts.append("Max-Age=0")
        if self.secure:
            parts.append("Secure")
        return "; ".join(parts)

    async def _send_static(self, send, name: str) -> None:
        content_type = STATIC.get(name)
        if content_type is None:
            raise NotFound(f"no static file {printable(name[:60])!r}")
        data = self._static.get(name)
        if data is None:
            data = self._static[name] = (
                resources.files("swamp.ui").joinpath("static").joinpath(name).read_bytes()
            )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    *SECURITY,
                    (b"cache-control", b"no-cache"),
                    (b"content-type", content_type.encode()),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})


def _cookies(scope, name: str) -> list[str]:
    """Every value the request's Cookie headers give ``name``, in order (a browser sends a
    name twice when two paths or hosts set it; a lenient parse: a malformed pair is skipped)."""
    found = []
    for header, value in scope.get("headers") or []:
        if header.lower() != b"cookie":
            continue
        for pair in value.decode("latin-1").split(";"):
            key, eq, val = pair.strip().partition("=")
            if eq and key == name and val:
                found.append(val.strip('"'))
    return found


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 1
