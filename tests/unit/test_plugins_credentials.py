import os
import sys

import pytest

from swamp.errors import SwampError, UserError
from swamp.hooks import hookimpl
from swamp.models import Arg, Method, ModelType, ResourceSpec
from swamp.orchestrator.credentials import Credentials
from swamp.plugins import ModelRegistry, plugin_manager


async def _greet(ctx, args):
    return {"who": args["who"]}


class HelloPlugin:
    @hookimpl
    def swamp_model_types(self):
        return [
            ModelType(
                "hello/greeter",
                methods=(Method("greet", _greet, args=(Arg("who", required=True),)),),
                resources=(ResourceSpec("greeting"),),
            )
        ]


def test_a_third_party_plugin_contributes_a_model_type_beside_the_builtins():
    pm = plugin_manager(load_entry_points=False)
    pm.register(HelloPlugin())
    registry = ModelRegistry.from_plugins(pm)
    assert registry.runnable("hello/greeter").method("greet").validate({"who": "x"}) == {"who": "x"}
    assert registry.runnable("command/shell")


def test_a_type_registered_twice_is_an_error():
    pm = plugin_manager(load_entry_points=False)
    pm.register(HelloPlugin())
    pm.register(HelloPlugin(), name="again")
    with pytest.raises(SwampError, match="registered twice"):
        ModelRegistry.from_plugins(pm)


def test_swamp_plugins_env_loads_modules(monkeypatch):
    monkeypatch.setenv("SWAMP_PLUGINS", "swamp.models.builtin")  # already registered: no-op
    ModelRegistry.from_plugins(plugin_manager(load_entry_points=False))
    monkeypatch.setenv("SWAMP_PLUGINS", "no_such_module_anywhere")
    with pytest.raises(SwampError, match="SWAMP_PLUGINS"):
        plugin_manager(load_entry_points=False)


def test_plugin_dirs_beside_the_pyz_only_when_private(monkeypatch, tmp_path, caplog):
    from swamp.plugins import plugin_dirs

    (tmp_path / "swamp.pyz").write_bytes(b"")
    beside = tmp_path / "plugins"
    beside.mkdir(mode=0o755)
    beside.chmod(0o755)
    extra = tmp_path / "extra"
    monkeypatch.setenv("SWAMP_PYZ", str(tmp_path / "swamp.pyz"))
    monkeypatch.setenv("SWAMP_PLUGIN_PATH", f"{extra}{os.pathsep}")
    assert plugin_dirs() == [str(beside)]  # a directory that does not exist is left out
    beside.chmod(0o775)  # a group could drop code into it: not taken, and said why
    assert plugin_dirs() == []
    assert f"{beside} is writable by its group" in caplog.text
    beside.chmod(0o755)
    extra.mkdir()
    (extra / "swamp_here_plugin.py").write_text("X = 1\n")
    monkeypatch.setenv("SWAMP_PLUGINS", "swamp_here_plugin")
    monkeypatch.setattr(sys, "path", list(sys.path))
    pm = plugin_manager(load_entry_points=False)  # found on SWAMP_PLUGIN_PATH, appended
    assert pm.has_plugin("swamp_here_plugin") and str(extra) in sys.path[-2:]


@pytest.mark.parametrize(
    "loosen,why",
    [
        (lambda d: (d / "pkg" / "mod.py").chmod(0o666), "pkg/mod.py is writable by its group"),
        (lambda d: (d / "pkg").chmod(0o757), "pkg is writable by every user"),
        (lambda d: d.parent.chmod(0o777), "is writable by its group and every user"),
        (lambda d: (d / "out.py").symlink_to(d.parent / "nowhere.py"), "which does not exist"),
        (lambda d: (d / "ln").symlink_to(d.parent / "open"), "open/evil.py is writable by"),
    ],
)
def test_every_file_of_a_plugin_directory_is_checked(monkeypatch, tmp_path, loosen, why):
    from swamp.plugins import plugin_dirs, untrusted

    top = tmp_path / "above" / "plugins"
    (top / "pkg").mkdir(parents=True)
    (top / "pkg" / "mod.py").write_text("X = 1\n")
    (tmp_path / "above" / "open").mkdir()
    (tmp_path / "above" / "open" / "evil.py").write_text("X = 1\n")
    (tmp_path / "above" / "open" / "evil.py").chmod(0o646)
    for path in (tmp_path / "above", top, top / "pkg"):
        path.chmod(0o755)
    assert untrusted(str(top)) is None
    loosen(top)
    assert why in untrusted(str(top))
    monkeypatch.setenv("SWAMP_PLUGIN_PATH", str(top))
    with pytest.raises(UserError, match="SWAMP_PLUGIN_PATH names .*another user could"):
        plugin_dirs()


def test_credentials_expire_slide_and_revoke():
    now = [1000.0]
    creds = Credentials(ttl=60, clock=lambda: now[0])
    lapsing = creds.issue_dispatch("w1", "d0")
    dispatch = creds.issue_dispatch("w1", "d1")
    other = creds.issue_dispatch("w2", "d2")
    assert creds.verify(lapsing).expires == 1060
    assert creds.verify(dispatch).dispatch_id == "d1"
    assert creds.verify("forged") is None
    now[0] += 50
    creds.extend(dispatch)  # a running dispatch keeps its access
    creds.extend(other)
    now[0] += 20
    assert creds.verify(lapsing) is None  # not extended: lapsed
    assert creds.verify(dispatch) is not None
    creds.revoke_worker("w1")
    assert creds.verify(dispatch) is None and creds.verify(other) is not None
    creds.revoke(other)
    assert creds.verify(other) is None


def test_ids_and_secrets_are_hex_and_never_repeat_across_blocks():
    from swamp import ids

    drawn = [ids.new_id() for _ in range(3 * ids.BLOCK // 16 + 7)]  # several blocks' worth
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in drawn)
    assert len(set(drawn)) == len(drawn)
    from swamp.orchestrator.credentials import Credentials

    secret = Credentials().issue_dispatch("w1", "d1")  # a credential: from ``secrets``
    assert len(secret) == 64 and int(secret, 16) >= 0 and secret not in "".join(drawn)


def test_a_forked_child_draws_from_a_block_of_its_own():
    import os

    from swamp import ids

    ids.new_id()  # a block is in use
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id must not be the parent's next id
        os.write(write, ids.new_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert len(child) == 32 and child != ids.new_id()


def test_ordered_ids_sort_as_they_were_made():
    from swamp import ids

    made = [ids.ordered_id() for _ in range(2000)]
    stamps = [i[:16] for i in made]  # two in the same nanosecond sort by their random part
    assert sorted(stamps) == stamps and len(set(made)) == len(made)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in made)
