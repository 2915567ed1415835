// swamp's web pages: keep the page's main part live. The server sends an event on the
// page's topics (data-live) when something it shows changed, at most twice a second; this
// fetches the main part again (?part=main) and swaps it in. No inline script anywhere: the
// Content-Security-Policy allows only this file.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var state = document.getElementById("live-state");
  if (!main || !main.dataset.live || !window.EventSource || !window.fetch) {
    return;
  }
  var busy = false;
  var again = false;
  var broken = false;

  function typing() {
    var active = document.activeElement;
    return active && main.contains(active) && active.tagName === "INPUT";
  }

  function refresh() {
    if (busy || typing()) {
      again = true;
      return;
    }
    busy = true;
    var url = new URL(window.location.href);
    url.searchParams.set("part", "main");
    fetch(url.toString(), { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.status === 401) {
          window.location.reload(); // the session ended: the login page says what to do
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html !== null) {
          main.innerHTML = html; // server-rendered, every peer text escaped
          main.dataset.updated = String(Date.now());
        }
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          refresh();
        }
      });
  }

  function show(text, on) {
    if (state) {
      state.textContent = text;
      state.className = "live-state " + (on ? "on" : "off");
    }
  }

  main.addEventListener("focusout", function () {
    if (again) {
      again = false;
      refresh();
    }
  });
  var source = new EventSource("/ui/events?topics=" + encodeURIComponent(main.dataset.live));
  source.addEventListener("changed", refresh);
  source.addEventListener("open", function () {
    show("live", true);
    if (broken) {
      broken = false;
      refresh(); // what changed while the stream was down
    }
  });
  source.addEventListener("error", function () {
    broken = true;
    show("reconnecting…", false);
    if (source.readyState === EventSource.CLOSED) {
      // refused: the session ended (the refresh meets the login page) or too many pages
      show("not live: reload the page", false);
      refresh();
    }
  });
})();
