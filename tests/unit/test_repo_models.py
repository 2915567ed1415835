"""Model instances from ``models/*.toml``: a long-lived process reads them again only when the
directory's listing changed, and sees every change that matters."""

import os

import pytest

from swamp.errors import UserError
from swamp.repo import Repo


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "models").mkdir()
    return Repo(tmp_path)


def write(repo, name: str, text: str) -> None:
    (repo.root / "models" / f"{name}.toml").write_text(text)


def reads_counted(monkeypatch) -> list:
    """Count the parses of model files."""
    import swamp.repo as module

    parsed = []
    real = module.tomllib.loads

    def loads(text):
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(module.tomllib, "loads", loads)
    return parsed


def test_unchanged_files_are_not_read_again(repo, monkeypatch):
    write(repo, "a", 'type = "command/shell"\n')
    write(repo, "b", 'type = "swamp/echo"\n')
    parsed = reads_counted(monkeypatch)
    first = repo.model_instances()
    assert sorted(first) == ["a", "b"] and len(parsed) == 2
    for _ in range(5):
        assert repo.model_instances() == first
    assert len(parsed) == 2
    first.clear()  # what a caller does with its copy changes nothing kept
    assert sorted(repo.model_instances()) == ["a", "b"]


def test_an_added_removed_or_rewritten_file_is_seen_at_once(repo):
    write(repo, "a", 'type = "command/shell"\n')
    assert repo.model_instances()["a"].type == "command/shell"
    write(repo, "b", 'type = "swamp/echo"\n')
    assert sorted(repo.model_instances()) == ["a", "b"]
    path = repo.root / "models" / "a.toml"
    stat = path.stat()
    path.write_text('type = "swamp/echo"\n')  # rewritten in place: another size, same mtime
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert repo.model_instances()["a"].type == "swamp/echo"
    path.write_text('type = "test/echo"\n')  # the same size, a later mtime
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert repo.model_instances()["a"].type == "test/echo"
    (repo.root / "models" / "b.toml").unlink()
    assert sorted(repo.model_instances()) == ["a"]


def test_a_broken_file_is_an_error_every_time_until_fixed(repo):
    write(repo, "a", 'type = "command/shell"\n')
    repo.model_instances()
    write(repo, "a", "type = \n")
    for _ in range(2):
        with pytest.raises(UserError, match="not valid TOML"):
            repo.model_instances()
    write(repo, "a", 'type = "swamp/echo"\n')
    assert repo.model_instances()["a"].type == "swamp/echo"


@pytest.mark.parametrize(
    ("url", "same"),
    [
        ("ws://127.0.0.1:7420", True),
        ("ws://127.0.0.1:7420/", True),
        ("ws://[::1]:7420", False),  # another user may listen there
        ("ws://localhost:7420", False),  # may resolve to [::1], or be answered by anyone
        ("ws://127.0.0.2:7420", False),
        ("ws://127.0.0.1:7421", False),
        ("wss://127.0.0.1:7420", False),
        ("ws://127.0.0.1", False),
        ("ws://127.0.0.1:notaport", False),
    ],
)
def test_the_local_credential_is_for_the_announced_address_only(url, same):
    from swamp.repo import same_server

    assert same_server("ws://127.0.0.1:7420", url) is same
    assert same_server("ws://[::1]:7420", "ws://[0:0::1]:7420")  # one address, two spellings
    assert same_server("ws://Host.Example:7420", "ws://host.example:7420")
    assert not same_server(None, url)


def test_a_serve_file_left_by_a_crash_is_not_taken_for_a_running_server(tmp_path):
    """After a crash the pid in serve.json may belong to another process by now: a server is
    running only while the repo's serve lock is held."""
    repo, _ = Repo.init(tmp_path / "repo")
    repo.write_serve_file("ws://127.0.0.1:7420", "http://127.0.0.1:7420", admin_credential="c")
    assert repo.running_server() is None  # this pid is alive, but it does not serve
    with repo.serve_lock():  # the control: the lock held, the same file names a server
        assert repo.running_server() == "ws://127.0.0.1:7420"
        assert repo.admin_credential_for("ws://127.0.0.1:7420") == "c"
    assert repo.admin_credential_for("ws://127.0.0.1:7420") is None
