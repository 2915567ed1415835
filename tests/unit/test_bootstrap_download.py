"""The bootstrap's download (swamp/bootstrap.py) against a server that misbehaves: a body cut
short, a peer that does not speak HTTP, a trickle — each is a failed attempt, asked again,
never a build checked or a traceback."""

import socket
import threading
import time

import pytest

from swamp import bootstrap

GOOD = b"the build" * 100


def _serve(answers):
    """An HTTP server that gives each connection the next of ``answers`` (bytes, or a
    function of the socket)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run():
        for answer in answers:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                if callable(answer):
                    answer(conn)
                else:
                    conn.sendall(answer)
        listener.close()

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/swamp.pyz"


def _trickle(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(GOOD))
    try:
        for _ in range(40):
            conn.sendall(b"t")
            time.sleep(0.1)
    except OSError:
        pass


def test_a_short_body_a_stranger_and_a_trickle_are_asked_again(monkeypatch, capsys):
    monkeypatch.setattr(bootstrap, "FIRST_PAUSE", 0.01)
    monkeypatch.setattr(bootstrap, "ATTEMPT_SECONDS", 1)
    url = _serve([
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\nthe bu" % len(GOOD),  # closed early
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",  # not HTTP
        _trickle,  # never done
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(GOOD) + GOOD,
    ])  # fmt: skip
    assert bootstrap.fetch(url, None) == GOOD
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert "ended after 6 of 900 bytes" in lines[0]
    assert "download 2/5" in lines[1] and "SSH-2.0" in lines[1]
    assert "not complete after 1 s" in lines[2]


def test_after_the_last_attempt_one_line_and_exit_1(monkeypatch, capsys):
    monkeypatch.setattr(bootstrap, "FIRST_PAUSE", 0.01)
    monkeypatch.setattr(bootstrap, "ATTEMPTS", 2)
    url = _serve([b"SSH-2.0-OpenSSH_9.6\r\n\r\n"] * 2)
    with pytest.raises(SystemExit) as info:
        bootstrap.fetch(url, None)
    assert info.value.code == 1
    assert (
        capsys.readouterr().err.splitlines()[-1].startswith("swamp bootstrap: could not download")
    )
