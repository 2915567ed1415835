"""The web pages on real processes: ``swamp serve``, a real worker, and a real headless
Chromium (``tests/integration/browser.py``) that logs in with ``swamp ui``'s link, sees the
worker, and — without a reload — sees a step start on it; a screenshot of each page is saved
(the directory is printed: ``$SWAMP_UI_SCREENSHOTS``, else under the test's tmp). The refusals
(no session, no CSRF token, another origin) are plain HTTP requests."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx

from tests.integration.browser import chromium
from tests.integration.conftest import wait_until

COMMAND = "for i in 1 2 3; do echo compiling part $i; done; sleep 60"
WORKFLOW = """\
name = "ui-demo"
description = "a step that prints and takes a while, for the pages to show"

[[jobs]]
name = "build"
labels = {{ role = "builder" }}

[[jobs.steps]]
name = "compile"
task = {{ type = "model_method", modelType = "command/shell", modelName = "ui-compile", \
methodName = "run", inputs = {{ command = "{command}" }} }}
"""


def _screens(tmp_path: Path) -> Path:
    where = Path(os.environ.get("SWAMP_UI_SCREENSHOTS") or tmp_path / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    print(f"screenshots of the web pages: {where}")
    return where


def _login_url(cluster) -> str:
    result = cluster.cli("ui", "--no-browser", "--json")
    assert result.returncode == 0, result.stderr
    url = json.loads(result.stdout)["url"]
    assert url.startswith(cluster.url.replace("ws://", "http://") + "/ui/login?code=")
    return url


async def test_the_pages_in_a_real_browser(cluster, tmp_path):
    screens = _screens(tmp_path)
    cluster.serve()
    worker = cluster.worker(
        cluster.mint("builder"), "--label", "role=builder", "--concurrency", "2"
    )
    name = worker.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    base = cluster.url.replace("ws://", "http://")
    async with chromium() as tab:
        await tab.open(_login_url(cluster))  # the link's page says who it logs in
        await tab.wait_for("document.getElementById('log-in')", what="the login link's page")
        await tab.screenshot(screens / "login.png")
        await tab.submit("#log-in")
        await tab.wait_for(
            f"document.querySelector('table.workers') && "
            f"document.querySelector('table.workers').innerText.includes({json.dumps(name)})",
            what=f"worker {name} on the fleet page",
        )
        await tab.wait_for(
            "document.getElementById('live-state').textContent === 'live'",
            what="the page's event stream open",
        )
        await tab.screenshot(screens / "fleet-idle.png")
        await tab.evaluate("window.swampMarker = 'not reloaded'")
        # a step starts on the worker: the open page shows it, without a reload
        (cluster.repo / "workflows" / "ui-demo.toml").write_text(WORKFLOW.format(command=COMMAND))
        cluster.spawn("workflow", "run", "ui-demo", "--server", cluster.url, "--json")
        await tab.wait_for(
            f"[...document.querySelectorAll('table.workers tbody tr')].some(row => "
            f"row.innerText.includes({json.dumps(name)}) && "
            f"row.querySelector('.running') && "
            f"row.querySelector('.running').textContent.includes('command/shell'))",
            what=f"a step running on {name}",
        )
        assert await tab.evaluate("window.swampMarker") == "not reloaded"
        await tab.screenshot(screens / "fleet.png")
        await tab.screenshot(screens / "fleet-dark.png", dark=True)

        # a step no worker matches waits: the queue page lists it by requirement
        waiting = cluster.spawn(
            "model", "method", "run", "command/shell", "run", "--arg", "command=true",
            "--label", "gpu=true", "--queue-timeout", "2m", "--server", cluster.url, "--json",
        )  # fmt: skip
        waiting.wait_for(lambda e: e.get("event", {}).get("kind") == "queued")
        await tab.open(f"{base}/ui/queue")
        await tab.wait_for(
            "document.querySelector('main').innerText.includes('gpu=true')",
            what="the waiting gpu=true step on the queue page",
        )
        await tab.screenshot(screens / "queue.png")

        await tab.open(f"{base}/ui/workers/{name}")
        await tab.wait_for(
            "document.querySelector('main').innerText.includes('compiling part 3')",
            what="the live tail of the worker's step",
        )
        await tab.screenshot(screens / "worker.png")

        await tab.open(f"{base}/ui/runs")
        await tab.wait_for(
            "document.querySelector('main').innerText.includes('ui-demo')", what="the run listed"
        )
        await tab.screenshot(screens / "runs.png")
        link = await tab.evaluate("document.querySelector('main table a').href")
        await tab.open(link)
        await tab.wait_for(
            f"document.querySelector('table.steps') && "
            f"document.querySelector('table.steps').innerText.includes({json.dumps(name)})",
            what="the run's step on its worker",
        )
        await tab.screenshot(screens / "run.png")
        # the admin session's action: cancel the run from its page (a POST with the CSRF
        # token, from the page's own origin)
        await tab.submit("form.act button")
        await tab.wait_for(
            "document.querySelector('h1 .badge') && "
            "document.querySelector('h1 .badge').textContent === 'cancelled'",
            what="the run cancelled",
        )
        await tab.screenshot(screens / "run-cancelled.png")
    shots = sorted(p.name for p in screens.glob("*.png"))
    assert {"fleet.png", "queue.png", "worker.png", "runs.png", "run.png"} <= set(shots)


def test_the_pages_refuse_without_a_session_a_csrf_token_or_their_origin(cluster):
    cluster.serve()
    base = cluster.url.replace("ws://", "http://")
    with httpx.Client(base_url=base, timeout=30) as http:
        bare = http.get("/ui/")
        assert bare.status_code == 401 and "swamp ui" in bare.text
        url = _login_url(cluster)
        # the link alone opens no session: its page's button does (from the pages' origin)
        shown = http.get(url.removeprefix(base), follow_redirects=False)
        assert shown.status_code == 200 and "set-cookie" not in shown.headers
        login = _redeem(http, base, url)
        assert login.status_code == 303
        _keep_cookie(http, login)
        page = http.get("/ui/")
        assert page.status_code == 200
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found, page.text
        csrf = found.group(1)
        action = "/ui/runs/0123456789abcdef/cancel"
        no_token = http.post(action, headers={"origin": base}, data={})
        assert no_token.status_code == 403 and "CSRF" in no_token.text
        foreign = http.post(action, headers={"origin": "http://evil.example"}, data={"csrf": csrf})
        assert foreign.status_code == 403
        # refused before the pages: still nothing a browser may run, frame or keep
        assert "default-src 'none'" in foreign.headers["content-security-policy"]
        assert foreign.headers["cache-control"] == "no-store"
        # the same POST from the pages themselves gets past both (no such run: 404)
        own = http.post(action, headers={"origin": base}, data={"csrf": csrf})
        assert own.status_code == 404
        # the link was good once
        again = http.get(url.removeprefix(base), follow_redirects=False)
        assert again.status_code == 401


def test_a_web_session_ends_when_the_token_that_opened_it_is_revoked(cluster):
    """A session opened with a server token lived its twelve hours after the token was
    revoked (its admin sockets were closed, its pages still answered): now it ends with it."""
    ops = cluster.cli_json("server", "token", "create", "ops", "--scope", "read")["token"]
    other = cluster.cli_json("server", "token", "create", "other", "--scope", "read")["token"]
    cluster.serve()
    base = cluster.url.replace("ws://", "http://")
    sessions = {}
    for name, token in (("ops", ops), ("other", other)):
        http = httpx.Client(base_url=base, timeout=30)
        opened = http.post(
            "/ui/login", headers={"origin": base}, data={"token": token}, follow_redirects=False
        )
        assert opened.status_code == 303, opened.text
        _keep_cookie(http, opened)
        assert http.get("/ui/").status_code == 200
        sessions[name] = http
    try:
        revoked = cluster.cli("server", "token", "revoke", "ops")
        assert revoked.returncode == 0, revoked.stderr
        wait_until(lambda: sessions["ops"].get("/ui/").status_code == 401, what="the session ended")
        assert sessions["other"].get("/ui/").status_code == 200  # untouched
    finally:
        for http in sessions.values():
            http.close()


def _keep_cookie(http: httpx.Client, response: httpx.Response) -> None:
    """The session cookie a response set (its name is the orchestrator's own), kept."""
    [(name, value)] = response.cookies.items()
    assert name.startswith("swamp_ui_"), name
    http.cookies.set(name, value)


def _redeem(http: httpx.Client, base: str, url: str) -> httpx.Response:
    """Open a login link as a browser does: its page, then its button's POST."""
    shown = http.get(url.removeprefix(base), follow_redirects=False)
    assert shown.status_code == 200, shown.text
    code = re.search(r'name="code" value="([^"]+)"', shown.text)
    assert code, shown.text
    return http.post(
        "/ui/login", headers={"origin": base}, data={"code": code.group(1)}, follow_redirects=False
    )


def _session(base: str, http: httpx.Client, token: str) -> str:
    """Log ``http`` in with a server token; the page's CSRF token."""
    opened = http.post(
        "/ui/login", headers={"origin": base}, data={"token": token}, follow_redirects=False
    )
    assert opened.status_code == 303, opened.text
    _keep_cookie(http, opened)
    found = re.search(r'name="csrf" value="([^"]+)"', http.get("/ui/").text)
    assert found
    return found.group(1)


def test_a_worker_is_drained_from_its_page_by_an_admin_session_only(cluster):
    reader = cluster.cli_json("server", "token", "create", "look", "--scope", "read")["token"]
    admin = cluster.cli_json("server", "token", "create", "ops", "--scope", "admin")["token"]
    cluster.serve()
    drained = cluster.worker(cluster.mint("w1"))
    base = cluster.url.replace("ws://", "http://")
    with (
        httpx.Client(base_url=base, timeout=30) as look,
        httpx.Client(base_url=base, timeout=30) as ops,
    ):
        read_csrf, csrf = _session(base, look, reader), _session(base, ops, admin)
        assert "/ui/workers/w1/drain" not in look.get("/ui/workers/w1").text  # no button
        refused = look.post(
            "/ui/workers/w1/drain", headers={"origin": base}, data={"csrf": read_csrf}
        )
        assert refused.status_code == 403
        assert drained.p.poll() is None  # the read session's POST changed nothing
        assert "/ui/workers/w1/drain" in ops.get("/ui/workers/w1").text
        done = ops.post(
            "/ui/workers/w1/drain",
            headers={"origin": base},
            data={"csrf": csrf},
            follow_redirects=False,
        )
        assert done.status_code == 303, done.text
    assert drained.wait_exit() == 0
    assert any(e.get("event") == "draining" and e["reason"] == "asked" for e in drained.events())


TWO_STEPS = """\
name = "ui-two"
[[jobs]]
name = "main"
[[jobs.steps]]
name = "slow"
task = { type = "model_method", modelType = "command/shell", modelName = "ui-slow", \
methodName = "run", inputs = { command = "echo started; sleep 60" } }
[[jobs.steps]]
name = "after"
dependsOn = [{ step = "slow", condition = { type = "failed" } }]
task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
"""


def test_one_step_is_cancelled_from_its_runs_page(cluster):
    """A running step's button cancels it alone: it ends failed, the step that runs when it
    fails runs, and the run ends."""
    admin = cluster.cli_json("server", "token", "create", "ops", "--scope", "admin")["token"]
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    (cluster.repo / "workflows" / "ui-two.toml").write_text(TWO_STEPS)
    running = cluster.spawn("workflow", "run", "ui-two", "--server", cluster.url, "--json")
    started = running.wait_for(lambda e: e.get("event", {}).get("line") == "started")["event"]
    run_id = started["runId"]
    base = cluster.url.replace("ws://", "http://")
    with httpx.Client(base_url=base, timeout=30) as ops:
        csrf = _session(base, ops, admin)
        wait_until(  # the step's record says running once its batch is written
            lambda: 'name="step" value="main.slow"' in ops.get(f"/ui/runs/{run_id}").text,
            what="the running step's cancel button",
        )
        done = ops.post(
            f"/ui/runs/{run_id}/cancel",
            headers={"origin": base},
            data={"csrf": csrf, "step": "main.slow"},
            follow_redirects=False,
        )
        assert done.status_code == 303, done.text
        assert done.headers["location"] == f"/ui/runs/{run_id}?step=main.slow"
    assert running.wait_exit() == 1
    run = cluster.cli_json("workflow", "history", "get", run_id)["run"]
    steps = {s["name"]: s for s in run["jobs"][0]["steps"]}
    assert steps["slow"]["status"] == "failed"
    assert steps["slow"]["error"] == "cancelled from the web pages by server token 'ops'"
    assert steps["after"]["status"] == "succeeded" and run["status"] == "failed"
