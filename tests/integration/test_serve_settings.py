"""`swamp serve` reads the repo's swamp.toml [serve] table; the command line and the
environment win over it, and a typo in it is one line, not a silently ignored setting."""

import socket

import pytest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(cluster, serve: str) -> None:
    (cluster.repo / "swamp.toml").write_text(f"[swamp]\nversion = 1\n\n[serve]\n{serve}\n")


def _listening(cluster, *args: str, env: dict | None = None) -> dict:
    proc = cluster.spawn("serve", "--repo-dir", str(cluster.repo), "--json", *args, env=env)
    try:
        return proc.wait_for(lambda e: e.get("event") == "listening")
    finally:
        proc.stop()


def test_serve_takes_its_settings_from_swamp_toml_and_flags_win(cluster):
    # what 'swamp init' writes is what 'swamp serve' uses
    written = (cluster.repo / "swamp.toml").read_text()
    assert 'host = "127.0.0.1"' in written and "port = 7420" in written
    port = _free_port()
    _config(cluster, f'host = "127.0.0.1"\nport = {port}\nqueue-timeout = "7m"')
    seen = _listening(cluster)
    assert seen["url"] == f"ws://127.0.0.1:{port}"
    assert seen["queueTimeoutSeconds"] == 420
    # the command line wins over the file
    seen = _listening(cluster, "--port", "0", "--queue-timeout", "2m")
    assert seen["url"] != f"ws://127.0.0.1:{port}" and seen["queueTimeoutSeconds"] == 120
    # and so does the environment
    seen = _listening(cluster, "--port", "0", env={"SWAMP_QUEUE_TIMEOUT": "3m"})
    assert seen["queueTimeoutSeconds"] == 180


@pytest.mark.parametrize(
    "serve,needle",
    [
        ("prot = 7421", "swamp.toml [serve]: unknown setting 'prot' (known: "),
        ('port = "7421"', "swamp.toml [serve] port: expected a whole number, got '7421'"),
        ('heartbeat = "soon"', "invalid swamp.toml [serve] heartbeat 'soon': a duration is"),
    ],
)
def test_a_bad_setting_in_the_file_is_one_line(cluster, serve, needle):
    _config(cluster, serve)
    result = cluster.cli("serve", "--port", "0", "--repo-dir", str(cluster.repo))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
