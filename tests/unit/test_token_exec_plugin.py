"""The example plugin ``plugins/swamp-token-exec``: a command's stdout as the token, bounded in
time and size, and failures that never show what the command printed."""

import sys
import time

import pytest

from swamp.errors import TokenSourceFailed
from swamp.plugins import plugin_manager
from swamp.worker.token_sources import collect
from tests.integration.conftest import ROOT

SECRET = "7e" * 32
TOKEN = f"pool.{SECRET}"
PY = sys.executable


@pytest.fixture
def plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "plugins" / "swamp-token-exec"))
    import swamp_token_exec

    return swamp_token_exec


def run(plugin, command, timeout=10.0):
    return plugin.run_command(command, timeout=timeout)


def failure(plugin, command, timeout=10.0) -> str:
    with pytest.raises(TokenSourceFailed) as info:
        run(plugin, command, timeout)
    message = info.value.message
    assert "\n" not in message and SECRET not in message, message
    return message


def test_its_stdout_trimmed_is_the_token_and_no_shell_runs(plugin, tmp_path):
    assert run(plugin, f"{PY} -c 'print(\"  {TOKEN} \")'") == TOKEN
    # no shell: a ';' is an argument like any other
    assert run(plugin, f"{PY} -c 'import sys; print(sys.argv[1:])' a;b $HOME") == (
        "['a;b', '$HOME']"
    )


def test_a_command_that_fails_names_the_program_and_its_stderr_with_the_secret_blanked(plugin):
    script = (
        f"import sys; print('{TOKEN}'); "
        f"print('vault: permission denied for {TOKEN}', file=sys.stderr); sys.exit(3)"
    )
    message = failure(plugin, f'{PY} -c "{script}" --password {SECRET}')
    assert message == f"{PY} exited with status 3: vault: permission denied for ***"


def test_a_secret_only_on_stderr_is_blanked_too(plugin):
    message = failure(plugin, f"{PY} -c \"import sys; sys.exit('token {TOKEN} rejected')\"")
    assert message == f"{PY} exited with status 1: token pool.*** rejected"


def test_a_command_that_hangs_is_stopped_at_its_timeout(plugin):
    started = time.monotonic()
    message = failure(plugin, f"{PY} -c 'import time; time.sleep(60)'", timeout=0.5)
    assert message == f"{PY} gave no answer within 0.5s and was stopped"
    assert time.monotonic() - started < 10


def test_output_is_bounded(plugin):
    message = failure(plugin, f"{PY} -c 'print(\"x\" * 100000)'")
    assert message == f"{PY} printed more than 4096 bytes"
    # endless output is read and dropped until the timeout stops it
    message = failure(plugin, f"{PY} -c 'while True: print(\"{SECRET}\")'", timeout=0.5)
    assert message.startswith(f"{PY} gave no answer within 0.5s")


@pytest.mark.parametrize(
    "command,why",
    [
        ("", "the command is empty"),
        ("'unbalanced", "the command does not parse: No closing quotation"),
        ("/nonexistent/vault read x", "/nonexistent/vault: no such program"),
        (f"{PY} -c 'pass'", f"{PY} printed nothing on stdout"),
        (f"{PY} -c 'import sys; sys.stdout.buffer.write(bytes([255]))'", "not UTF-8 text"),
        (f"{PY} -c 'import os; os.kill(os.getpid(), 9)'", "was killed by SIGKILL"),
    ],
)
def test_every_failure_is_one_line(plugin, command, why):
    assert why in failure(plugin, command)


def test_the_timeout_comes_from_the_environment_within_bounds(plugin, monkeypatch):
    monkeypatch.setenv("SWAMP_TOKEN_EXEC_TIMEOUT", "0.5")
    with pytest.raises(TokenSourceFailed, match="within 0.5s"):
        plugin.from_command(f"{PY} -c 'import time; time.sleep(60)'")
    for bad in ("soon", "0", "1000"):
        monkeypatch.setenv("SWAMP_TOKEN_EXEC_TIMEOUT", bad)
        with pytest.raises(TokenSourceFailed, match="SWAMP_TOKEN_EXEC_TIMEOUT"):
            plugin.from_command("true")


def test_it_registers_the_exec_scheme(plugin):
    pm = plugin_manager(load_entry_points=False)
    pm.register(plugin)
    assert collect(pm.hook.swamp_token_sources())["exec"].resolve is plugin.from_command
