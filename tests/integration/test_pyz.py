"""swamp.pyz: built from the locked versions, pure Python, and enough on its own — with nothing
but python3 and environment variables — for an orchestrator and its workers."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
import yaml

from tests.external import command, require
from tests.integration.conftest import ROOT, build_pyz

pytestmark = pytest.mark.integration
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def _env(**extra) -> dict:
    return {"PATH": "/usr/bin:/bin", **extra}  # env -i: no HOME, no PYTHONPATH, no venv


def _swamp(pyz, *args, cwd, env=None, timeout=60):
    return subprocess.run(
        [PYTHON, "-I", str(pyz), *args],
        cwd=cwd,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_pyz_is_pure_python_small_and_reproducible(pyz, tmp_path):
    assert pyz.stat().st_size < 5 * 1024 * 1024
    with zipfile.ZipFile(pyz) as archive:
        names = archive.namelist()
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dylib"))]
    assert any(n.endswith("swamp/cli/__init__.py") for n in names)
    with zipfile.ZipFile(pyz) as archive:  # the launcher's copy of the trust rule is the rule
        rule = archive.read("_swamp_file_trust.py")
        manifest = json.loads(archive.read("swamp-manifest.json"))
    assert rule == (ROOT / "swamp" / "domain" / "file_trust.py").read_bytes()
    assert not [n for n in manifest["files"] if n.endswith(".pth")]
    assert len(manifest["files"]) == len([n for n in names if n.startswith("site-packages/")])
    again = build_pyz(tmp_path / "again.pyz")  # the shared build is done: none runs beside it
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(pyz.read_bytes()).digest()


# -- the unpack cache: nothing runs from it that another user could have written ---------------


def _unpack(pyz, root):
    """Run the pyz once with ``SHIV_ROOT=root``; the directory it unpacked into."""
    ran = _swamp(pyz, "--version", cwd=root.parent, env=_env(SHIV_ROOT=str(root)))
    assert ran.returncode == 0, ran.stderr
    [base] = root.glob("swamp-*")
    return base


def _poisoned_pth(tree, marker):
    """What a hostile user drops into the tree: a ``.pth`` line ``site`` executes."""
    (tree / "zzz-poison.pth").write_text(
        f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n"
    )


def _poisoned_module(tree, marker):
    """A hostile edit the manifest cannot see: ``swamp/cli/__init__.py`` (what the launcher
    imports) rewritten to the same size, its bytecode removed so Python compiles the new
    source."""
    source = tree / "swamp" / "cli" / "__init__.py"
    code = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n"
    size = source.stat().st_size
    assert len(code) <= size
    source.write_text(code + "#" * (size - len(code) - 1) + "\n")
    for compiled in (tree / "swamp" / "cli" / "__pycache__").glob("__init__.*.pyc"):
        compiled.unlink()


def _controls(tree, marker, how):
    """The control: the same tree used without the launcher's checks runs the poison —
    ``site.addsitedir`` is what shiv's bootstrap did with it (``.pth`` files run), a plain
    import is what any loader does (a module, or its bytecode, runs)."""
    assert not marker.exists()
    code = {
        "site": f"import site; site.addsitedir({str(tree)!r})",
        "import": f"import sys; sys.path.insert(0, {str(tree)!r}); import swamp.cli",
    }[how]
    subprocess.run([PYTHON, "-I", "-c", code], env=_env(), capture_output=True, timeout=60)
    assert marker.read_text() == "ran"
    marker.unlink()


def _refused(ran, marker, *needles):
    assert ran.returncode == 1 and not ran.stdout, (ran.stdout, ran.stderr)
    assert ran.stderr.count("\n") == 1 and ran.stderr.startswith("swamp.pyz: refusing to ")
    for needle in needles:
        assert needle in ran.stderr, ran.stderr
    assert not marker.exists()


def test_a_file_the_build_did_not_put_in_the_cache_is_refused_before_it_runs(pyz, tmp_path):
    root = tmp_path / "cache"
    base = _unpack(pyz, root)
    tree = base / "site-packages"
    marker = tmp_path / "poisoned"
    _poisoned_pth(tree, marker)
    ran = _swamp(pyz, "--version", cwd=tmp_path, env=_env(SHIV_ROOT=str(root)))
    _refused(ran, marker, f"{tree}/zzz-poison.pth was not put there by this build", str(base))
    _controls(tree, marker, "site")
    # what the message says to do works: the build unpacks again, and runs
    shutil.rmtree(base)
    assert _swamp(pyz, "--version", cwd=tmp_path, env=_env(SHIV_ROOT=str(root))).returncode == 0


@pytest.mark.parametrize("place", ["XDG_CACHE_HOME", "HOME", "SHIV_ROOT"])
def test_a_cache_another_user_could_write_to_is_refused(pyz, tmp_path, place):
    """A tree whose every name and size is the build's, but with a module rewritten, in a
    cache that another user could have replaced: only the check of the place catches it."""
    shared = tmp_path / "shared"
    if place == "SHIV_ROOT":
        root, env, writable = shared, {"SHIV_ROOT": str(shared)}, shared  # like /tmp itself
    elif place == "XDG_CACHE_HOME":
        root, env, writable = shared / "swamp", {"XDG_CACHE_HOME": str(shared)}, shared
    else:
        root, env, writable = shared / ".cache" / "swamp", {"HOME": str(shared)}, shared
    good = _unpack(pyz, tmp_path / "good")
    root.mkdir(parents=True, mode=0o700)
    base = root / good.name
    shutil.copytree(good, base)
    marker = tmp_path / "poisoned"
    _poisoned_module(base / "site-packages", marker)
    writable.chmod(0o1777 if place == "SHIV_ROOT" else 0o777)
    ran = _swamp(pyz, "--version", cwd=tmp_path, env=_env(**env))
    _refused(ran, marker, f"{writable} is writable by its group and every user", "SHIV_ROOT")
    _controls(base / "site-packages", marker, "import")


def _poisoned_bytecode(tree, marker):
    """Bytecode of ``swamp/cli/__init__.py`` that Python takes for it (the header names the
    source's size and time), with other code in it: allowed by name, so only its owner and
    mode can give it away."""
    code = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')"
    craft = (
        "import importlib.util, marshal, pathlib, sys\n"
        "source = pathlib.Path(sys.argv[1]) / 'swamp' / 'cli' / '__init__.py'\n"
        "info = source.stat()\n"
        "target = pathlib.Path(importlib.util.cache_from_source(str(source)))\n"
        "target.write_bytes(importlib.util.MAGIC_NUMBER + bytes(4)"
        " + (int(info.st_mtime) & 0xFFFFFFFF).to_bytes(4, 'little')"
        " + (info.st_size & 0xFFFFFFFF).to_bytes(4, 'little')"
        " + marshal.dumps(compile(sys.argv[2], str(source), 'exec')))\n"
        "print(target)\n"
    )
    made = subprocess.run(
        [PYTHON, "-I", "-c", craft, str(tree), code], capture_output=True, text=True, check=True
    )
    return Path(made.stdout.strip())


@pytest.mark.parametrize("whose", ["writable", "another user's"])
def test_bytecode_another_user_could_have_written_is_refused(pyz, tmp_path, whose):
    if whose == "another user's" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    root = tmp_path / "cache"
    tree = _unpack(pyz, root) / "site-packages"
    marker = tmp_path / "poisoned"
    compiled = _poisoned_bytecode(tree, marker)
    if whose == "writable":
        compiled.chmod(0o666)
        why = "is writable by its group and every user"
    else:
        os.chown(compiled, 65534, 65534)
        why = "belongs to another user (uid 65534)"
    ran = _swamp(pyz, "--version", cwd=tmp_path, env=_env(SHIV_ROOT=str(root)))
    _refused(ran, marker, f"{compiled} {why}")
    _controls(tree, marker, "import")


def test_a_loose_umask_unpacks_a_tree_that_is_still_accepted(pyz, tmp_path):
    root = tmp_path / "cache"
    for _ in range(2):  # unpacks, then runs from what it unpacked
        ran = subprocess.run(
            [PYTHON, "-I", str(pyz), "--version"],
            env=_env(SHIV_ROOT=str(root)),
            capture_output=True,
            text=True,
            umask=0o002,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr
    loose = [p for p in root.rglob("*") if p.lstat().st_mode & 0o022]
    assert not loose, loose[:5]


# -- plugins: every file loaded is checked, not only its directory ---------------------------


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    """A cache the pyz unpacks into once for the tests that do not poison it."""
    return tmp_path_factory.mktemp("unpacked") / "root"


def _marker_plugin(directory, marker):
    """A plugin as ``pip install --target`` leaves it: a package that writes ``marker`` when
    it is imported, and its dist-info with the entry point swamp loads."""
    package = directory / "swamp_marker"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('loaded')\n"
    )
    info = directory / "swamp_marker-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: swamp-marker\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[swamp]\nmarker = swamp_marker\n")
    return package


@pytest.mark.parametrize("where", ["beside the pyz", "SWAMP_PLUGIN_PATH"])
def test_a_plugin_file_another_user_could_have_written_is_not_loaded(
    pyz, tmp_path, unpacked, where
):
    machine = tmp_path / "machine"
    machine.mkdir()
    local = machine / "swamp.pyz"
    shutil.copy(pyz, local)
    env = _env(SHIV_ROOT=str(unpacked))
    if where == "beside the pyz":
        plugins = machine / "plugins"
    else:
        plugins = tmp_path / "elsewhere"
        env["SWAMP_PLUGIN_PATH"] = str(plugins)
    marker = tmp_path / "loaded"
    package = _marker_plugin(plugins, marker)
    # the control: as installed, the plugin is loaded (its import writes the marker)
    ran = _swamp(local, "model", "types", "--json", cwd=machine, env=env)
    assert ran.returncode == 0, ran.stderr
    assert marker.read_text() == "loaded"
    marker.unlink()
    # its directory is as private as before, but one file in it is not
    (package / "__init__.py").chmod(0o666)
    ran = _swamp(local, "model", "types", "--json", cwd=machine, env=env)
    assert not marker.exists()
    why = f"{package}/__init__.py is writable by its group and every user"
    if where == "beside the pyz":  # nobody named it: skipped, said why, the rest works
        assert ran.returncode == 0 and json.loads(ran.stdout)
        assert f"ignoring the plugins in {plugins}: {why}" in ran.stderr
    else:  # named: an error, one line, exit 2
        assert ran.returncode == 2
        assert json.loads(ran.stdout)["error"]["code"] == "invalid_input"
        assert ran.stderr.count("\n") == 1 and f"SWAMP_PLUGIN_PATH names {plugins}" in ran.stderr
        assert why in ran.stderr


def _install_beside(machine):
    """``plugins/swamp-diskspace`` laid out as ``pip install --target plugins`` leaves it: the
    package and its dist-info, whose entry point the pyz finds."""
    source = ROOT / "plugins" / "swamp-diskspace"
    target = machine / "plugins"
    shutil.copytree(source / "swamp_diskspace", target / "swamp_diskspace")
    info = target / "swamp_diskspace-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: swamp-diskspace\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[swamp]\ndiskspace = swamp_diskspace\n")
    target.chmod(0o755)


def test_an_orchestrator_and_two_workers_from_the_one_file(pyz, tmp_path):
    machine = tmp_path / "machine"
    machine.mkdir()
    shutil.copy(pyz, machine / "swamp.pyz")
    local = machine / "swamp.pyz"
    _install_beside(machine)  # a plugin next to the file, on the workers' machine
    version = _swamp(local, "version", "--json", cwd=machine)
    assert version.returncode == 0, version.stderr
    assert json.loads(version.stdout)["protocolVersion"] >= 1
    flag = _swamp(local, "--version", cwd=machine)
    about = json.loads(version.stdout)
    assert flag.stdout == f"swamp {about['version']} (protocol {about['protocolVersion']})\n"
    assert _swamp(local, "init", "repo", cwd=machine).returncode == 0
    repo = machine / "repo"
    serve = subprocess.Popen(
        [PYTHON, "-I", str(local), "serve", "--port", "0", "--json", "--repo-dir", str(repo)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    workers = []
    try:
        listening = json.loads(serve.stdout.readline())
        url = listening["url"]
        # it serves itself
        served = httpx.get(listening["download"])
        assert served.content == local.read_bytes()
        assert served.headers["x-swamp-sha256"] == hashlib.sha256(served.content).hexdigest()
        token = json.loads(
            _swamp(
                local,
                "worker",
                "token",
                "create",
                "pool",
                "--duration",
                "1h",
                "--max-enrollments",
                "2",
                "--json",
                "--repo-dir",
                str(repo),
                cwd=machine,
            ).stdout
        )["token"]
        for i in range(2):
            worker = subprocess.Popen(
                [PYTHON, "-I", str(local), "worker", "connect", "--json"],
                env=_env(
                    SWAMP_ORCHESTRATOR_URL=url,
                    SWAMP_WORKER_TOKEN=token,
                    SWAMP_WORKER_CACHE_DIR=str(machine / f"cache-{i}"),
                    SWAMP_DISKSPACE_MIN_FREE_MB="1",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            workers.append(worker)
        for worker in workers:
            line = worker.stdout.readline()
            while line and '"enrolled"' not in line:
                line = worker.stdout.readline()
            assert '"enrolled"' in line
        ran = _swamp(
            local,
            "model",
            "method",
            "run",
            "command/shell",
            "run",
            "--arg",
            "command=echo hi",
            "--label",
            "fleet=pool",
            "--repo-dir",
            str(repo),
            "--json",
            cwd=machine,
        )
        assert ran.returncode == 0, ran.stderr
        verified = _swamp(local, "worker", "verify", "--repo-dir", str(repo), "--json", cwd=machine)
        report = json.loads(verified.stdout)
        assert verified.returncode == 0 and report["passed"] == report["total"] == 2
        for verdict in report["workers"]:  # the plugin beside the file was loaded and ran
            assert verdict["seams"]["disk-space"]["ok"], verdict
    finally:
        for proc in [*workers, serve]:
            proc.send_signal(signal.SIGTERM)
        for proc in [*workers, serve]:
            assert proc.wait(timeout=15) == 0


def _render_runcmd(commands) -> str:
    """``runcmd`` as cloud-init writes it to its script (``util.shellify``, from Debian's
    cloud-init package, imported by the system python that package serves)."""
    system_python = "/usr/bin/python3"
    require(Path(system_python).exists(), "the system python3 with Debian's cloud-init")
    rendered = subprocess.run(
        [system_python, "-c", "import json, sys; from cloudinit import util; "
         "print(util.shellify(json.load(sys.stdin)), end='')"],
        input=json.dumps(commands), capture_output=True, text=True,
    )  # fmt: skip
    require(rendered.returncode == 0, f"cloudinit (Debian's cloud-init): {rendered.stderr[-200:]}")
    return rendered.stdout


def _boot(tmp, config: dict, script: str, *, name: str) -> tuple[int, str, list[str], Path]:
    """Boot a machine, as far as cloud-init goes, in a mount namespace of its own: a private
    /opt and an overlay over /etc take the user-data's files; the rendered runcmd script runs
    as cloud-init runs it (``sh``, no ``set -e``) with a ``systemctl`` that only writes down
    what it was asked. Returns the script's exit status, its output, the systemctl calls, and
    a copy of what the machine ended up with in /opt/swamp and /etc/swamp."""
    command("unshare")
    box = tmp / name
    stage, upper, work, kept, fake = (box / d for d in ("stage", "up", "work", "kept", "bin"))
    for folder in (stage, upper, work, kept, fake):
        folder.mkdir(parents=True)
    for entry in config["write_files"]:
        path = stage / entry["path"].lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(entry["content"])
        path.chmod(int(entry["permissions"], 8))
    calls = box / "systemctl.calls"
    (fake / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (fake / "systemctl").chmod(0o755)
    (box / "runcmd").write_text(script)
    inside = (
        "set -e\n"
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc\n"
        "mount -t tmpfs tmpfs /opt\n"
        f"cp -a {stage}/. /\n"
        "set +e\n"
        f"sh {box / 'runcmd'}; status=$?\n"
        f"cp -a /opt/swamp /etc/swamp {kept}/ 2>/dev/null\n"
        "exit $status\n"
    )
    booted = subprocess.run(
        ["unshare", "--mount", "sh", "-c", inside],
        env=_env(PATH=f"{fake}:/usr/bin:/bin"), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = calls.read_text().splitlines() if calls.exists() else []
    return booted.returncode, booted.stdout + booted.stderr, said, kept


def test_cloud_init_starts_a_checked_build_and_nothing_else(pyz, cluster):
    """The user-data of a --tls auto orchestrator, rendered the way cloud-init renders it and
    run for real: with the download altered it starts nothing; with the real build it enables
    the unit, whose command (run here as systemd would) enrolls over TLS it verified by pin."""
    cluster.serve("--pyz", str(pyz), "--tls", "auto")
    out = cluster.tmp / "user-data.yaml"
    made = cluster.cli(
        "worker", "token", "create", "pool", "--duration", "1h", "--max-enrollments", "5",
        "--cloud-init", "--output", str(out),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert out.stat().st_mode & 0o777 == 0o600
    config = yaml.safe_load(out.read_text())
    schema = subprocess.run(
        [command("cloud-init"), "schema", "--config-file", str(out)], capture_output=True, text=True
    )
    assert schema.returncode == 0, schema.stdout + schema.stderr
    [chain] = config["runcmd"]
    pin = json.loads((cluster.repo / ".swamp" / "serve.json").read_text())["caPin"]
    files = {f["path"]: f for f in config["write_files"]}
    lines = files["/etc/swamp/worker.env"]["content"].splitlines()
    env = dict(line.split("=", 1) for line in lines)
    assert env["SWAMP_CA_PIN"] == pin and env["SWAMP_ORCHESTRATOR_URL"] == cluster.url

    # the download altered: another file where the build should be
    fake_dir = cluster.tmp / "altered"
    fake_dir.mkdir()
    (fake_dir / "swamp.pyz").write_bytes(pyz.read_bytes() + b"\0")
    fake = subprocess.Popen(
        [PYTHON, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"],
        cwd=fake_dir, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        port = int(fake.stdout.readline().split(" port ")[1].split()[0])
        altered = [f"http://127.0.0.1:{port}/swamp.pyz" if a == chain[4] else a for a in chain]
        status, said, calls, kept = _boot(
            cluster.tmp, config, _render_runcmd([altered]), name="altered"
        )
    finally:
        fake.terminate()
        fake.wait(timeout=10)
    assert status != 0 and calls == [], said
    assert "expected " + chain[5] in said and "not started" in said
    assert not (kept / "swamp" / "swamp.pyz").exists()

    # the real build, through the orchestrator's own TLS (the CA the user-data carries)
    status, said, calls, kept = _boot(cluster.tmp, config, _render_runcmd([chain]), name="real")
    assert status == 0, said
    assert calls == ["daemon-reload", "enable --now swamp-worker"]
    assert (kept / "swamp" / "swamp.pyz").read_bytes() == pyz.read_bytes()
    unit = files["/etc/systemd/system/swamp-worker.service"]["content"]
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = exec_start.removeprefix("ExecStart=").split()
    argv = [str(kept / "swamp" / "swamp.pyz") if a == "/opt/swamp/swamp.pyz" else a for a in argv]
    env.update(
        SWAMP_CA_CERT=str(kept / "swamp" / "ca.pem"),
        SWAMP_WORKER_CACHE_DIR=str(cluster.tmp / "cache"),
    )
    worker = subprocess.Popen(
        argv, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        line = worker.stdout.readline()
        while line and "enrolled as" not in line:
            line = worker.stdout.readline()
        assert "enrolled as pool-" in line
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0
    unit_file = cluster.tmp / "swamp-worker.service"
    unit_file.write_text(unit)
    verified = subprocess.run(
        [command("systemd-analyze"), "verify", str(unit_file)], capture_output=True, text=True
    )
    assert verified.returncode == 0, verified.stderr


def test_the_unit_printed_by_a_pyz_runs_that_pyz_and_passes_systemd_analyze(pyz, tmp_path):
    printed = _swamp(pyz, "worker", "unit", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert f"ExecStart={PYTHON} -I {pyz.resolve()} worker connect\n" in printed.stdout
    unit_file = tmp_path / "swamp-worker.service"
    unit_file.write_text(printed.stdout)
    verified = subprocess.run(
        [command("systemd-analyze"), "verify", str(unit_file)], capture_output=True, text=True
    )
    assert verified.returncode == 0, verified.stderr


def test_the_other_shapes_parse_and_carry_the_checked_download(pyz, cluster):
    cluster.serve("--pyz", str(pyz))
    digest = hashlib.sha256(pyz.read_bytes()).hexdigest()
    base = cluster.url.replace("ws://", "http://")
    as_json = cluster.cli_json(
        "worker", "token", "create", "js", "--duration", "1h", "--cloud-init"
    )
    assert as_json["provisioning"]["kind"] == "cloud-init" and as_json["token"].startswith("js.")
    assert as_json["token"] in as_json["provisioning"]["content"]
    kinds = ["Secret", "ConfigMap", "Service", "StatefulSet"]
    for flag, expected in (("--kubernetes", kinds), ("--compose", None)):
        printed = cluster.cli("worker", "token", "create", f"k{flag[2]}", "--duration", "1h", flag)
        assert printed.returncode == 0, printed.stderr
        documents = list(yaml.safe_load_all(printed.stdout))
        if expected:
            assert [d["kind"] for d in documents] == expected
        assert digest in printed.stdout and f"{base}/swamp.pyz" in printed.stdout


def test_provisioning_without_a_served_build_mints_nothing(cluster):
    cluster.serve()
    made = cluster.cli("worker", "token", "create", "pool", "--duration", "1h", "--cloud-init")
    assert made.returncode == 1 and "serves no build" in made.stderr
    assert cluster.cli_json("worker", "token", "list") == []


# -- provisioning output: nothing in it reaches a shell, and nothing is overwritten ------------


def test_a_container_fetches_checks_and_runs_the_build_without_a_shell(pyz, cluster, unpacked):
    """``--compose`` (``--kubernetes`` has the same command): the token goes to a secret file
    beside the compose file, never into it; the container's command, run here for real,
    downloads the build, checks it, and runs a worker that enrolls with the secret file."""
    cluster.serve("--pyz", str(pyz))
    out = cluster.tmp / "compose" / "compose.yaml"
    out.parent.mkdir()
    made = cluster.cli(
        "worker", "token", "create", "boxes", "--duration", "1h", "--max-enrollments", "3",
        "--compose", "--output", str(out), "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    written = json.loads(made.stdout)["provisioning"]
    token_file = out.parent / "swamp_token"
    assert written == {"kind": "compose", "path": str(out), "tokenFile": str(token_file)}
    token = token_file.read_text().strip()
    assert token.startswith("boxes.") and token_file.stat().st_mode & 0o777 == 0o600
    text = out.read_text()
    assert token not in text and token.split(".")[1] not in text
    compose = yaml.safe_load(text)
    service = compose["services"]["worker"]
    argv_of = service["command"]
    assert argv_of[:4] == ["python3", "-I", "/etc/swamp/bootstrap.py", "compose"]
    bootstrap = cluster.tmp / "bootstrap.py"  # the config Compose mounts, $$ read as $
    bootstrap.write_text(compose["configs"]["swamp_bootstrap"]["content"].replace("$$", "$"))

    def run(argv, log):
        places = {"python3": PYTHON, "/tmp/swamp.pyz": str(cluster.tmp / "fetched.pyz"),
                  "/etc/swamp/bootstrap.py": str(bootstrap)}  # fmt: skip
        argv = [places.get(a, a) for a in argv]
        env = _env(
            SWAMP_ORCHESTRATOR_URL=service["environment"]["SWAMP_ORCHESTRATOR_URL"],
            SWAMP_WORKER_TOKEN_FILE=str(token_file),
            SWAMP_WORKER_CACHE_DIR=str(cluster.tmp / "box-cache"),
            SHIV_ROOT=str(unpacked),
        )
        with open(log, "w") as stderr:
            return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)

    # the control: a build that does not match the checksum is never run
    wrong = list(argv_of)
    digest = argv_of[5]
    wrong[5] = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    refused = run(wrong, cluster.tmp / "refused.log")
    refused.communicate(timeout=60)
    err = (cluster.tmp / "refused.log").read_text()
    assert refused.returncode == 1 and err.count("\n") == 1 and f"expected {wrong[5]}" in err
    assert not (cluster.tmp / "fetched.pyz").exists()
    worker = run(argv_of, cluster.tmp / "box.log")
    try:
        line = worker.stdout.readline()
        while line and "enrolled as" not in line:
            line = worker.stdout.readline()
        assert "enrolled as boxes-" in line, (cluster.tmp / "box.log").read_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0


def _fake_orchestrator(directory, checksum):
    """A real HTTP server that answers ``/swamp.pyz.sha256`` with ``checksum``: an
    orchestrator (or whoever sits in the middle) that lies."""
    directory.mkdir()
    (directory / "swamp.pyz.sha256").write_text(f"{checksum}  swamp.pyz\n")
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"],
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (…) ..."
    return server, int(line.split(" port ")[1].split()[0])


def test_a_checksum_that_is_not_one_is_never_written_into_a_script(cluster):
    # 64 characters, as the old check wanted, and a command for a shell
    payload = "';touch${IFS}poisoned;'" + "0" * 41
    assert len(payload) == 64
    server, port = _fake_orchestrator(cluster.tmp / "fake", payload)
    try:
        out = cluster.tmp / "user-data.yaml"
        made = cluster.cli(
            "worker", "token", "create", "pool", "--duration", "1h", "--cloud-init",
            "--orchestrator-url", f"ws://127.0.0.1:{port}", "--output", str(out),
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert made.returncode == 1 and made.stderr.count("\n") == 1, made.stderr
    assert "sent a malformed checksum" in made.stderr and payload not in made.stderr
    assert not out.exists() and cluster.cli_json("worker", "token", "list") == []
    # the control: in the shell line the old cloud-init ran, the payload runs
    shell = cluster.tmp / "shell"
    shell.mkdir()
    old_check = f"echo '{payload}  /opt/swamp/swamp.pyz' | sha256sum -c -"
    subprocess.run(["sh", "-c", old_check], cwd=shell, capture_output=True, timeout=30)
    assert (shell / "poisoned").exists()


@pytest.mark.parametrize(
    "url",
    ["ws://127.0.0.1:7420/';touch${IFS}x;'", "ws://h:99999", "wss://a b:1", "ws://u:p@h:1"],
)
def test_a_bad_orchestrator_url_is_one_line_and_mints_nothing(cluster, url):
    made = cluster.cli(
        "worker", "token", "create", "pool", "--duration", "1h", "--kubernetes",
        "--orchestrator-url", url,
    )  # fmt: skip
    assert made.returncode == 2 and not made.stdout and made.stderr.count("\n") == 1
    assert "invalid --orchestrator-url" in made.stderr, made.stderr
    assert cluster.cli_json("worker", "token", "list") == []


def test_output_never_overwrites_a_file_or_follows_a_link(pyz, cluster):
    cluster.serve("--pyz", str(pyz))
    victim = cluster.tmp / "victim"
    victim.write_text("keep me\n")
    existing = cluster.tmp / "existing.yaml"
    existing.write_text("mine\n")
    link = cluster.tmp / "link.yaml"
    link.symlink_to(victim)
    compose_dir = cluster.tmp / "compose"
    compose_dir.mkdir()
    (compose_dir / "swamp_token").write_text("an older token\n")
    for kind, out, why in (
        ("--cloud-init", existing, f"--output {existing} exists already"),
        ("--cloud-init", link, f"--output {link} exists already (a file or a link)"),
        ("--compose", compose_dir / "compose.yaml", "the token file of --compose"),
    ):
        made = cluster.cli(
            "worker", "token", "create", "pool", "--duration", "1h", kind, "--output", str(out)
        )
        assert made.returncode == 2 and made.stderr.count("\n") == 1, made.stderr
        assert why in made.stderr, made.stderr
    assert victim.read_text() == "keep me\n" and existing.read_text() == "mine\n"
    assert link.is_symlink() and os.readlink(link) == str(victim)
    assert (compose_dir / "swamp_token").read_text() == "an older token\n"
    assert not (compose_dir / "compose.yaml").exists()  # nothing half-written is left
    assert cluster.cli_json("worker", "token", "list") == []
    # the control: the way --output used to be opened follows the link and clobbers its target
    fd = os.open(link, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)
    assert victim.read_text() == ""


def test_output_without_a_provisioning_file_is_one_line_and_mints_nothing(cluster):
    out = cluster.tmp / "token.txt"
    made = cluster.cli(
        "worker", "token", "create", "pool", "--duration", "1h", "--output", str(out)
    )
    assert made.returncode == 2 and made.stderr.count("\n") == 1
    assert "--output goes with --cloud-init, --kubernetes or --compose" in made.stderr
    assert not out.exists() and cluster.cli_json("worker", "token", "list") == []
