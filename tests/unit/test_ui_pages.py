"""The web pages in-process: routing, login links, sessions, CSRF, the origin check, escaping
and the security headers — every part from the composition root on a real repo, requests
handed to the app as Hypercorn would (ASGI), a login link asked for over an admin socket."""

from __future__ import annotations

import math
import re
from urllib.parse import urlencode

import pytest
import trio
import trio.testing

from swamp.bookkeeping.server_tokens import ServerTokenBook
from swamp.domain.scopes import Scope
from swamp.errors import UserError
from swamp.orchestrator.pool import Member
from swamp.ui.html import text
from tests.harness.orchestrator import orchestrator

LOCAL = "local." + "ab" * 32
HOST = "127.0.0.1:7420"
ORIGIN = f"http://{HOST}"


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def text(self) -> str:
        return self.body.decode()

    def cookie(self) -> str:
        match = re.match(
            r"(?:__Host-)?swamp_ui_[0-9a-f]+=([^;]*)", self.headers.get("set-cookie", "")
        )
        assert match, self.headers
        return match.group(1)


async def call(
    app, method: str, path: str, *, headers: dict[str, str] | None = None, body: bytes = b""
) -> Response:
    """One request through the app (the request policy first, as in serve)."""
    raw_path, _, query = path.partition("?")
    sent = {"host": HOST, **(headers or {})}
    scope = {
        "type": "http",
        "method": method,
        "path": raw_path,
        "query_string": query.encode(),
        "scheme": "http",
        "headers": [(k.encode(), v.encode()) for k, v in sent.items()],
        "client": ("127.0.0.1", 5000),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    started: dict = {}
    chunks: list[bytes] = []

    async def receive():
        if messages:
            return messages.pop(0)
        await trio.sleep_forever()

    async def send(message):
        if message["type"] == "http.response.start":
            started.update(message)
        else:
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    headers_out = {k.decode().lower(): v.decode() for k, v in started["headers"]}
    return Response(started["status"], headers_out, b"".join(chunks))


@pytest.fixture
async def harness(tmp_path):
    async with orchestrator(tmp_path, local_credential=LOCAL) as h:
        yield h


async def login_link(harness) -> str:
    client, _ = await harness.connect(f"Bearer {LOCAL}")
    answer = await client.call("ui.login", {}, timeout=5)
    assert answer["path"].startswith("/ui/login?code=")
    return answer["path"]


async def follow_link(harness, link: str, headers: dict[str, str] | None = None) -> Response:
    """Open a login link as a browser does: its page, then its button (a POST of the code
    from the pages' origin)."""
    app = harness.parts.app
    shown = await call(app, "GET", link, headers=headers)
    assert shown.status == 200 and 'id="log-in"' in shown.text, shown.text
    code = re.search(r'name="code" value="([^"]+)"', shown.text)
    assert code, shown.text
    form = {"origin": ORIGIN, "content-type": "application/x-www-form-urlencoded"}
    return await call(
        app,
        "POST",
        "/ui/login",
        headers={**form, **(headers or {})},
        body=urlencode({"code": code.group(1)}).encode(),
    )


async def logged_in(harness) -> str:
    """A session cookie, from a login link."""
    response = await follow_link(harness, await login_link(harness))
    assert response.status == 303, response.text
    return response.cookie()


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page
    return match.group(1)


# -- without a session ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/ui/", "/ui/queue", "/ui/runs", "/ui/workers/w1", "/ui/events"])
async def test_every_page_without_a_session_is_401_and_says_to_run_swamp_ui(harness, path):
    response = await call(harness.parts.app, "GET", path)
    assert response.status == 401
    assert "swamp ui" in response.text
    assert 'action="/ui/login"' in response.text  # the server-token form


async def test_every_response_carries_the_security_headers(harness):
    for path in ("/ui/", "/ui/static/ui.css", "/ui/static/ui.js"):
        response = await call(harness.parts.app, "GET", path)
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "style-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "referrer-policy" in response.headers
    page = await call(harness.parts.app, "GET", "/ui/")
    assert page.headers["cache-control"] == "no-store"
    assert "<script>" not in page.text and "style=" not in page.text  # nothing inline


async def test_the_bare_prefix_goes_to_the_fleet(harness):
    response = await call(harness.parts.app, "GET", "/ui")
    assert response.status == 303 and response.headers["location"] == "/ui/"


# -- login links ------------------------------------------------------------------------------


async def test_a_login_link_opens_a_session_once(harness):
    app = harness.parts.app
    link = await login_link(harness)
    opened = await follow_link(harness, link)
    assert opened.status == 303 and opened.headers["location"] == "/ui/"
    cookie = opened.headers["set-cookie"]
    assert cookie.startswith(harness.parts.pages.cookie + "=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui/" in cookie
    assert "Secure" not in cookie  # plain http here (serve --tls: Secure)
    jar = {"cookie": f"{harness.parts.pages.cookie}={opened.cookie()}"}
    page = await call(app, "GET", "/ui/", headers=jar)
    assert page.status == 200 and "Fleet" in page.text
    again = await call(app, "GET", link)
    assert again.status == 401 and "not valid" in again.text


async def test_a_login_link_alone_changes_nothing(harness):
    """Login CSRF: a link (or an image, or a redirect) from another site GETs the link with
    the browser's cookies. That shows a page and opens no session, replaces none; the code
    stays good for the one who asked for it, and its button's POST is refused from another
    origin."""
    app = harness.parts.app
    mine = await logged_in(harness)
    jar = {"cookie": f"{harness.parts.pages.cookie}={mine}"}
    link = await login_link(harness)  # someone else's link, sent to this browser
    shown = await call(app, "GET", link, headers=jar)
    assert shown.status == 200 and "set-cookie" not in shown.headers
    assert "logs this browser in as <b>local</b>" in shown.text
    assert "logged in as <b>local</b> now" in shown.text  # it says what it would replace
    assert (await call(app, "GET", "/ui/", headers=jar)).status == 200  # mine still open
    code = link.partition("code=")[2]
    posted = await call(
        app,
        "POST",
        "/ui/login",
        headers={"origin": "https://evil.example", **jar},
        body=urlencode({"code": code}).encode(),
    )
    assert posted.status == 403 and "set-cookie" not in posted.headers
    assert (await follow_link(harness, link)).status == 303  # still good, once


async def test_a_logged_in_browser_asking_for_the_login_page_goes_to_the_fleet(harness):
    jar = {"cookie": f"{harness.parts.pages.cookie}={await logged_in(harness)}"}
    response = await call(harness.parts.app, "GET", "/ui/login", headers=jar)
    assert response.status == 303 and response.headers["location"] == "/ui/"
    assert (await call(harness.parts.app, "GET", "/ui/login")).status == 401


async def test_the_cookie_is_the_orchestrators_own_and_the_first_open_one_counts(harness):
    """Cookies are per host, not per port: two orchestrators on one machine must not share a
    name (each would overwrite the other's session), and a browser that sends the name twice
    is served by the one that is an open session, whichever comes first."""
    from swamp.ui.routes import _cookies, cookie_name

    name = harness.parts.pages.cookie
    assert name == cookie_name(str(harness.repo.db_path.resolve()), secure=False)
    assert cookie_name("/srv/a/.swamp/swamp.db", secure=False) != cookie_name(
        "/srv/b/.swamp/swamp.db", secure=False
    )
    assert cookie_name("/srv/a", secure=True).startswith("__Host-swamp_ui_")
    mine = await logged_in(harness)
    app = harness.parts.app
    for header in (
        f"{name}=stale-or-foreign; {name}={mine}",
        f"{name}={mine}; {name}=stale-or-foreign",
        f"other=1; swamp_ui={mine}x; {name}={mine}",
    ):
        page = await call(app, "GET", "/ui/", headers={"cookie": header})
        assert page.status == 200, header
    assert (await call(app, "GET", "/ui/", headers={"cookie": f"{name}=nope"})).status == 401
    # several Cookie headers (HTTP/2 sends one per cookie): every one is read
    scope = {
        "headers": [(b"cookie", f"{name}=nope".encode()), (b"Cookie", f"{name}={mine}".encode())]
    }
    assert _cookies(scope, name) == ["nope", mine]


async def test_a_wrong_code_is_refused(harness):
    response = await call(harness.parts.app, "GET", "/ui/login?code=nope")
    assert response.status == 401 and "not valid" in response.text


async def test_a_code_past_its_minute_is_refused(harness):
    logins = harness.parts.pages.logins
    now = [1000.0]
    logins.clock = lambda: now[0]
    code = logins.issue("local", Scope.ADMIN)
    now[0] += 61
    response = await call(harness.parts.app, "GET", "/ui/login?code=" + code)
    assert response.status == 401


async def test_the_code_and_the_session_id_are_kept_only_as_hashes(harness):
    logins = harness.parts.pages.logins
    code = logins.issue("local", Scope.ADMIN)
    session_id, _ = logins.redeem(code)
    held = repr(vars(logins))
    assert code not in held and session_id not in held


async def test_a_metrics_token_cannot_ask_for_a_link(harness):
    _, secret = await ServerTokenBook(harness.parts.db).create("scraper", Scope.METRICS)
    client, _ = await harness.connect(f"Bearer {secret}")
    from swamp.errors import ScopeTooNarrow

    with pytest.raises(ScopeTooNarrow):
        await client.call("ui.login", {}, timeout=5)


# -- the login form --------------------------------------------------------------------------


async def test_the_login_form_takes_a_read_or_admin_token_but_not_a_metrics_one(harness):
    book = ServerTokenBook(harness.parts.db)
    _, reader = await book.create("reader", Scope.READ)
    _, scraper = await book.create("scraper", Scope.METRICS)
    app = harness.parts.app
    form = {"origin": ORIGIN, "content-type": "application/x-www-form-urlencoded"}
    ok = await call(
        app, "POST", "/ui/login", headers=form, body=urlencode({"token": reader}).encode()
    )
    assert ok.status == 303
    page = await call(
        app, "GET", "/ui/", headers={"cookie": f"{harness.parts.pages.cookie}={ok.cookie()}"}
    )
    assert "reader" in page.text and "(read)" in page.text
    refused = await call(
        app, "POST", "/ui/login", headers=form, body=urlencode({"token": scraper}).encode()
    )
    assert refused.status == 401 and "set-cookie" not in refused.headers
    wrong = await call(app, "POST", "/ui/login", headers=form, body=b"token=reader.nope")
    assert wrong.status == 401


async def test_the_login_form_refuses_another_origin(harness):
    book = ServerTokenBook(harness.parts.db)
    _, reader = await book.create("reader", Scope.READ)
    body = urlencode({"token": reader}).encode()
    foreign = await call(
        harness.parts.app,
        "POST",
        "/ui/login",
        headers={"origin": "https://evil.example"},
        body=body,
    )
    assert foreign.status == 403 and "set-cookie" not in foreign.headers
    no_origin = await call(harness.parts.app, "POST", "/ui/login", body=body)
    assert no_origin.status == 403


# -- actions: CSRF, origin, scope -----------------------------------------------------------


async def test_a_post_needs_the_csrf_token_and_the_pages_origin(harness):
    app = harness.parts.app
    cookie = {"cookie": f"{harness.parts.pages.cookie}={await logged_in(harness)}"}
    csrf = csrf_of((await call(app, "GET", "/ui/", headers=cookie)).text)
    path = "/ui/runs/0123456789abcdef/cancel"
    missing = await call(app, "POST", path, headers={**cookie, "origin": ORIGIN}, body=b"")
    assert missing.status == 403 and "CSRF" in missing.text
    wrong = await call(app, "POST", path, headers={**cookie, "origin": ORIGIN}, body=b"csrf=x")
    assert wrong.status == 403
    body = f"csrf={csrf}".encode()
    foreign = await call(
        app, "POST", path, headers={**cookie, "origin": "http://evil.example"}, body=body
    )
    assert foreign.status == 403
    no_origin = await call(app, "POST", path, headers=cookie, body=body)
    assert no_origin.status == 403
    referer = await call(
        app, "POST", path, headers={**cookie, "referer": f"{ORIGIN}/ui/runs"}, body=body
    )
    assert referer.status == 404  # past every check: the admin API says there is no such run
    ok = await call(app, "POST", path, headers={**cookie, "origin": ORIGIN}, body=body)
    assert ok.status == 404 and "no workflow run" in ok.text


async def test_a_read_session_sees_no_actions_and_gets_403(harness):
    logins = harness.parts.pages.logins
    session_id, session = logins.open("server token 'reader'", Scope.READ)
    cookie = {"cookie": f"{harness.parts.pages.cookie}={session_id}", "origin": ORIGIN}
    response = await call(
        harness.parts.app,
        "POST",
        "/ui/runs/0123456789abcdef/cancel",
        headers=cookie,
        body=f"csrf={session.csrf}".encode(),
    )
    assert response.status == 403 and "read scope" in response.text


async def test_logging_out_ends_the_session(harness):
    app = harness.parts.app
    cookie = {"cookie": f"{harness.parts.pages.cookie}={await logged_in(harness)}"}
    csrf = csrf_of((await call(app, "GET", "/ui/", headers=cookie)).text)
    out = await call(
        app,
        "POST",
        "/ui/logout",
        headers={**cookie, "origin": ORIGIN},
        body=f"csrf={csrf}".encode(),
    )
    assert out.status == 303 and "Max-Age=0" in out.headers["set-cookie"]
    assert (await call(app, "GET", "/ui/", headers=cookie)).status == 401


async def test_logging_out_ends_the_event_streams_of_the_sessions_open_pages(harness):
    """An open page's stream belongs to its session: logged out (or its token revoked), the
    stream ends at once rather than telling the browser what changes for hours."""
    app, pages = harness.parts.app, harness.parts.pages
    cookie = {"cookie": f"{pages.cookie}={await logged_in(harness)}"}
    other = {"cookie": f"{pages.cookie}={await logged_in(harness)}"}
    csrf = csrf_of((await call(app, "GET", "/ui/", headers=cookie)).text)
    ended: list[int] = []
    one_ended = trio.Event()

    async def watch(jar) -> None:
        ended.append((await call(app, "GET", "/ui/events?topics=fleet", headers=jar)).status)
        one_ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, cookie)
        nursery.start_soon(watch, other)
        await trio.testing.wait_all_tasks_blocked()
        assert pages.live.viewers == 2
        await call(
            app,
            "POST",
            "/ui/logout",
            headers={**cookie, "origin": ORIGIN},
            body=f"csrf={csrf}".encode(),
        )
        with trio.fail_after(10):
            await one_ended.wait()
        assert ended == [200] and pages.live.viewers == 1  # the other session's page goes on
        nursery.cancel_scope.cancel()


# -- routing beside the data plane -------------------------------------------------------


async def test_a_page_asked_for_from_another_origin_is_refused(harness):
    cookie = {"cookie": f"{harness.parts.pages.cookie}={await logged_in(harness)}"}
    foreign = await call(
        harness.parts.app, "GET", "/ui/", headers={**cookie, "origin": "https://evil.example"}
    )
    assert foreign.status == 403
    own = await call(harness.parts.app, "GET", "/ui/", headers={**cookie, "origin": ORIGIN})
    assert own.status == 200


async def test_the_rest_of_the_port_still_refuses_browsers(harness):
    response = await call(harness.parts.app, "GET", "/health", headers={"origin": ORIGIN})
    assert response.status == 403  # browsers are not clients of anything but the pages
    rebinding = await call(harness.parts.app, "GET", "/ui/", headers={"host": "evil.example"})
    assert rebinding.status == 403  # the Host check holds for the pages too


# -- escaping ---------------------------------------------------------------------------------


def test_peer_text_is_inert():
    assert text("<script>alert(1)</script>") == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert text("a\"b'c") == "a&quot;b&#x27;c"
    shown = text("\x1b[2J\x07line\u202eevil", keep_tab=True)
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "\\x1b[2J" in shown


async def test_a_worker_label_like_a_script_renders_inert(harness):
    pool = harness.parts.pool
    pool.put(
        Member(
            name="w1",
            instance_id="i-1",
            machine_id="m-1",
            token_name="fleet-a",
            labels={"role": "<script>alert(1)</script>"},
            platform="linux\x1b[2J",
            arch="x86_64",
            capacity=2,
            version="<b>9</b>",
            channel=None,
        )
    )
    cookie = {"cookie": f"{harness.parts.pages.cookie}={await logged_in(harness)}"}
    page = await call(harness.parts.app, "GET", "/ui/", headers=cookie)
    assert page.status == 200
    assert "<script>alert" not in page.text and "&lt;script&gt;alert(1)" in page.text
    assert "\x1b" not in page.text and "<b>9" not in page.text
    part = await call(harness.parts.app, "GET", "/ui/?part=main", headers=cookie)
    assert part.text.startswith("<h1>Fleet") and "<html" not in part.text


async def test_a_line_of_output_with_controls_and_markup_renders_inert(harness):
    from swamp.protocol.messages import LogChunkItem, LogsPage
    from swamp.ui import views

    line = "\x1b[2J\x1b[31mred</pre><script>alert(1)</script>\x07\u202eevil"

    class Api:
        async def logs_read(self, request):
            chunk = LogChunkItem(id=1, log="d1", first=0, first_byte=0, size=1, streams="oe",
                                 lines=[line, "\tindented"])  # fmt: skip
            return LogsPage(kind="dispatch", id="d1", cursor=1, more=False, live=True,
                            cap_bytes=1024, chunks=[chunk])  # fmt: skip

    sources = views.Sources(harness.parts.pool, harness.parts.dispatch, Api())  # type: ignore[arg-type]
    shown = await views.tail(sources, "d1", "d1")
    assert "<script>" not in shown and "</pre><script>" not in shown
    assert "&lt;script&gt;" in shown and "\\x1b[2J" in shown
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "\tindented" in shown  # a tab is kept


def member(name: str, token: str, **labels: str) -> Member:
    return Member(
        name=name,
        instance_id=f"i-{name}",
        machine_id=f"m-{name}",
        token_name=token,
        labels=dict(labels),
        platform="linux",
        arch="x86_64",
        capacity=4,
        version="1",
        channel=None,
    )


async def test_the_fleet_page_is_bounded_grouped_and_filtered(harness):
    from swamp.ui import views

    pool = harness.parts.pool
    for i in range(250):
        pool.put(member(f"w{i:03d}", "gpu" if i % 5 == 0 else "cpu", zone="a" if i % 2 else "b"))
    sources = views.Sources(pool, harness.parts.dispatch, harness.parts.admin.api)
    first = views.fleet(sources, [])
    assert "250 workers" in first and "page 1 of 3" in first
    assert first.count("/ui/workers/") == views.PAGE_ROWS
    assert '<a href="/ui/?fleet=cpu">cpu</a>' in first  # a line per fleet, linking to it
    assert "disconnected</span>&nbsp;200" in first  # statuses counted per fleet
    last = views.fleet(sources, [], page_number=3)
    assert last.count("/ui/workers/") == 50 and "page 3 of 3" in last
    zone = views.fleet(sources, ["zone=a"])
    assert "125 workers" in zone and "matching zone=a" in zone
    one = views.fleet(sources, [], only="gpu")
    assert "50 workers" in one and "w005" in one and "w001" not in one
    assert "No worker matches" in views.fleet(sources, ["zone=c"])
    with pytest.raises(UserError):
        views.fleet(sources, ["zone"])


# -- rendering once, reading off the loop ----------------------------------------------------


async def test_a_page_is_rendered_once_for_every_viewer_of_it(harness):
    """Sixty-four viewers of one page cost one render while nothing it shows changes; other
    parameters are a page of their own; a change to its topics renders it again, once."""
    app, pages = harness.parts.app, harness.parts.pages
    pages.rendered.max_age = math.inf  # the verdict must not depend on the machine's speed
    for i in range(150):
        harness.parts.pool.put(member(f"w{i:03d}", "cpu"))
    jar = {"cookie": f"{pages.cookie}={await logged_in(harness)}"}
    bodies: list[str] = []

    async def view(path: str) -> None:
        response = await call(app, "GET", path, headers=jar)
        assert response.status == 200
        bodies.append(response.text)

    before = pages.rendered.renders
    async with trio.open_nursery() as nursery:
        for _ in range(64):
            nursery.start_soon(view, "/ui/?part=main")
    assert pages.rendered.renders == before + 1 and len(set(bodies)) == 1
    await view("/ui/")  # the whole page wraps the same main part
    await view("/ui/?page=2&part=main")
    assert pages.rendered.renders == before + 2
    pages.live.changed("queue")  # not what the fleet page shows
    await view("/ui/?part=main")
    assert pages.rendered.renders == before + 2
    pages.live.changed("fleet")
    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(view, "/ui/?part=main")
    assert pages.rendered.renders == before + 3


async def test_a_page_with_buttons_is_never_shared_between_sessions(harness):
    """A worker's page carries its viewer's CSRF token in its forms: each session renders its
    own, and a read session's has no buttons at all."""
    app, pages = harness.parts.app, harness.parts.pages
    pages.rendered.max_age = math.inf
    client, _ = await harness.connect(f"Bearer {LOCAL}")  # a connected member: it has a button
    one = member("w1", "cpu")
    one.channel = client
    harness.parts.pool.put(one)
    admins = []
    for _ in range(2):
        cookie = await logged_in(harness)
        page = await call(app, "GET", "/ui/", headers={"cookie": f"{pages.cookie}={cookie}"})
        admins.append((cookie, csrf_of(page.text)))
    reader_id, _ = pages.logins.open("server token 'reader'", Scope.READ)
    seen = []
    for cookie, csrf in admins:
        worker = await call(
            app, "GET", "/ui/workers/w1?part=main", headers={"cookie": f"{pages.cookie}={cookie}"}
        )
        assert csrf_of(worker.text) == csrf  # its own token, never the other session's
        seen.append(csrf)
    assert seen[0] != seen[1]
    read = await call(
        app, "GET", "/ui/workers/w1?part=main", headers={"cookie": f"{pages.cookie}={reader_id}"}
    )
    assert read.status == 200 and 'name="csrf"' not in read.text


async def test_the_runs_page_reads_the_latest_runs_off_the_event_loop(harness, monkeypatch):
    """At a week of runs the runs page once decoded every run header on the loop. It is one
    query on the reader's thread, sorted and cut in SQL: the latest written first."""
    from swamp.bookkeeping.workflow_runs import POLICY, RunBook, key
    from swamp.domain.run_record import RunRecord, header_json
    from swamp.store.datastore import Datastore

    store = harness.parts.store
    with store.transaction():
        for i in range(130):
            run = RunRecord(run_id=f"{i:04d}" + "ab" * 14, workflow="nightly", started_at="t")
            store.write(key("nightly", run.run_id), header_json(run, {}), policy=POLICY)

    def whole(*_args, **_kw):
        raise AssertionError("every run header read on the event loop")

    monkeypatch.setattr(RunBook, "headers", whole)
    monkeypatch.setattr(Datastore, "latest_of_type", whole)
    jar = {"cookie": f"{harness.parts.pages.cookie}={await logged_in(harness)}"}
    queries = harness.parts.reader.queries
    page = await call(harness.parts.app, "GET", "/ui/runs?part=main", headers=jar)
    assert page.status == 200, page.text
    assert harness.parts.reader.queries == queries + 1
    assert "the latest 100" in page.text and page.text.count('href="/ui/runs/') == 100
    assert page.text.index("0129abab") < page.text.index("0128abab")  # the latest first
    assert "0029abab" not in page.text  # the oldest thirty are not read


async def test_one_credential_cannot_take_every_page_stream(harness):
    """One read token opens many sessions (the login form, again and again): its streams
    together are bounded, and an admin's page still gets its stream."""
    app, pages = harness.parts.app, harness.parts.pages
    _, reader = await ServerTokenBook(harness.parts.db).create("reader", Scope.READ)
    form = {"origin": ORIGIN, "content-type": "application/x-www-form-urlencoded"}
    jars = []
    for _ in range(8):
        ok = await call(
            app, "POST", "/ui/login", headers=form, body=urlencode({"token": reader}).encode()
        )
        assert ok.status == 303
        jars.append({"cookie": f"{pages.cookie}={ok.cookie()}"})
    admin = {"cookie": f"{pages.cookie}={await logged_in(harness)}"}
    statuses: list[int] = []

    async def stream(jar) -> None:
        statuses.append((await call(app, "GET", "/ui/events?topics=fleet", headers=jar)).status)

    async with trio.open_nursery() as nursery:
        for jar in jars:
            for _ in range(8):
                nursery.start_soon(stream, jar)
        await trio.testing.wait_all_tasks_blocked()
        assert pages.live.viewers == pages.live.max_per_holder == 16
        assert statuses.count(503) == 64 - 16
        nursery.start_soon(stream, admin)
        await trio.testing.wait_all_tasks_blocked()
        assert pages.live.viewers == 17  # the admin's page is served
        nursery.cancel_scope.cancel()


async def test_logging_in_again_ends_the_browsers_old_session(harness):
    """The login link's page says the browser's session ends: it does, on the server too."""
    pages = harness.parts.pages
    old = await logged_in(harness)
    jar = {"cookie": f"{pages.cookie}={old}"}
    again = await follow_link(harness, await login_link(harness), headers=jar)
    assert again.status == 303 and again.cookie() != old
    assert pages.logins.session(old) is None
    assert pages.logins.session(again.cookie()) is not None
