"""``swamp ui``'s hand-over to the browser: a file only its user can read, never the link
in the browser's arguments (every user of the machine can read those with ``ps``)."""

from __future__ import annotations

import os
import stat
import time

from swamp.cli import ui_cmd


def test_the_browser_is_given_a_private_file_that_leads_to_the_link(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(ui_cmd, "REDIRECT_KEEP", 600)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    old = tmp_path / "swamp-ui-old.html"
    old.write_text("an expired link")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    recent = tmp_path / "swamp-ui-recent.html"
    recent.write_text("a link still good")
    opened: list[str] = []
    monkeypatch.setenv("BROWSER", "true")
    monkeypatch.setattr("webbrowser.open", lambda target: opened.append(target) or True)
    url = 'http://127.0.0.1:7420/ui/login?code=abc&x="<b>'
    assert ui_cmd._open(url)
    [target] = opened
    assert target.startswith("file://") and "code" not in target
    handed = tmp_path / os.path.basename(target)
    assert stat.S_IMODE(handed.stat().st_mode) == 0o600
    page = handed.read_text()
    assert 'url=http://127.0.0.1:7420/ui/login?code=abc&amp;x=&quot;&lt;b&gt;"' in page
    assert not old.exists() and recent.exists()  # earlier runs' expired files go
