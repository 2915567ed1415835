"""What goes into a provisioning file, which a machine runs as root: a URL of a plain shape, a
checksum that is one, no shell, and no token in a Compose file (the real processes:
tests/integration/test_pyz.py)."""

from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from swamp.domain import provisioning
from swamp.domain.provisioning import check_url, is_sha256
from swamp.errors import UserError
from swamp.tls import certificates
from tests.external import require

SHA = "0123456789abcdef" * 4
BUILD = {"url": "wss://orch.example:7420", "download": "https://orch.example:7420/swamp.pyz"}


@pytest.mark.parametrize(
    "url",
    [
        "ws://127.0.0.1:7420",
        "wss://orchestrator.example:7420",
        "wss://orchestrator.example",
        "wss://[::1]:7420",
        "wss://proxy.example/swamp/v1",
    ],
)
def test_plain_urls_pass(url):
    assert check_url(url, what="--orchestrator-url") == url


@pytest.mark.parametrize(
    "url",
    [
        "ws://h:1/';touch${IFS}x;'",  # shell syntax
        'ws://h:1/"x"',
        "ws://h:1/$(id)",
        "ws://h:1\nSWAMP_WORKER_TOKEN=x.y",  # a second line in the environment file
        "ws://exa mple:1",
        "ws://user:secret@h:1",
        "ws://h:1/?token=x",
        "ws://h:1/#x",
        "ws://h:99999",
        "ws://h:0",
        "wss://",
        "http://h:1",
        "h:1",
        "ws://-h:1",
    ],
)
def test_anything_else_is_one_input_error(url):
    with pytest.raises(UserError) as caught:
        check_url(url, what="--orchestrator-url")
    assert "\n" not in caught.value.message and "invalid --orchestrator-url" in caught.value.message


@pytest.mark.parametrize(
    "text,ok",
    [
        (SHA, True),
        (SHA.upper(), False),
        (SHA[:-1], False),
        (SHA + "0", False),
        ("';touch${IFS}poisoned;'" + "0" * 41, False),  # 64 characters, a shell's delight
        ("", False),
    ],
)
def test_a_checksum_is_64_lowercase_hex_digits(text, ok):
    assert is_sha256(text) is ok


def _build(**changes):
    fields = {**BUILD, "sha256": SHA, "bootstrap": BOOTSTRAP, **changes}
    return provisioning.Build(**fields)


BOOTSTRAP = (Path(provisioning.__file__).parents[1] / "bootstrap.py").read_text()
CA = certificates.authority(name="test CA", now=datetime(2026, 12, 1, tzinfo=timezone.utc))
PIN = certificates.pin(CA.certificate)


def test_builders_refuse_what_they_cannot_carry_safely():
    for changes in (
        {"sha256": "';touch${IFS}x;'" + "0" * 48},
        {"url": "ws://h:1/'"},
        {"download": "https://h:1/x y"},
        {"ca_pin": "sha256:" + "0" * 63 + "'"},
        {"ca_pem": "-----BEGIN CERTIFICATE-----\n$(id)\n-----END CERTIFICATE-----\n"},
    ):
        with pytest.raises(UserError):
            _build(**changes)


def test_cloud_init_is_one_command_that_stops_at_the_first_failure():
    config = yaml.safe_load(provisioning.cloud_init(_build(), token="t.s"))
    assert config["runcmd"] == [
        ["python3", "-I", provisioning.BOOTSTRAP_PATH, "install", BUILD["download"], SHA,
         provisioning.PYZ_PATH]
    ]  # fmt: skip
    files = {f["path"]: f for f in config["write_files"]}
    assert files[provisioning.BOOTSTRAP_PATH]["content"] == BOOTSTRAP
    assert files[provisioning.ENV_FILE]["permissions"] == "0600"
    assert "SWAMP_CA_PIN" not in files[provisioning.ENV_FILE]["content"]
    assert provisioning.CA_FILE not in files  # a public certificate needs no CA


def test_cloud_init_carries_the_ca_and_its_pin():
    text = provisioning.cloud_init(_build(ca_pem=CA.certificate_pem(), ca_pin=PIN), token="t.s")
    config = yaml.safe_load(text)
    assert config["runcmd"][0][-1] == provisioning.CA_FILE
    files = {f["path"]: f["content"] for f in config["write_files"]}
    assert files[provisioning.CA_FILE] == CA.certificate_pem()
    env = dict(line.split("=", 1) for line in files[provisioning.ENV_FILE].splitlines())
    assert env["SWAMP_CA_PIN"] == PIN and env["SWAMP_CA_CERT"] == provisioning.CA_FILE
    assert env["SWAMP_WORKER_TOKEN"] == "t.s"


def test_containers_run_the_bootstrap_without_a_shell_and_carry_the_trust():
    build = _build(ca_pem=CA.certificate_pem(), ca_pin=PIN)
    documents = list(yaml.safe_load_all(provisioning.kubernetes(build, name="t", token="t.s")))
    assert [d["kind"] for d in documents] == ["Secret", "ConfigMap", "Service", "StatefulSet"]
    config, statefulset = documents[1], documents[3]
    assert config["data"] == {"bootstrap.py": BOOTSTRAP, "ca.pem": CA.certificate_pem()}
    pod = statefulset["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == [
        "python3", "-I", "/etc/swamp/bootstrap.py", "container", BUILD["download"], SHA,
        provisioning.CONTAINER_PYZ, "/etc/swamp/ca.pem",
    ]  # fmt: skip
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SWAMP_CA_PIN"] == PIN and env["SWAMP_WORKER_CACHE_DIR"] == provisioning.CACHE_DIR
    # the machine id lives on a volume each pod keeps: a restarted pod is the same worker
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["cache"] == provisioning.CACHE_DIR
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "cache"

    compose = yaml.safe_load(provisioning.compose(build))
    service = compose["services"]["worker"]
    assert service["command"][:5] == ["python3", "-I", "/etc/swamp/bootstrap.py", "compose",
                                      BUILD["download"]]  # fmt: skip
    assert service["environment"]["SWAMP_CA_PEM"] == CA.certificate_pem()
    assert service["environment"]["SWAMP_CA_PIN"] == PIN
    assert service["restart"] == "on-failure"
    # Compose reads $ in the file as its own variables: the program's text escapes them
    assert compose["configs"]["swamp_bootstrap"]["content"].replace("$$", "$") == BOOTSTRAP


def test_the_compose_file_holds_no_token_only_a_reference_to_its_secret_file():
    text = provisioning.compose(_build())
    service = yaml.safe_load(text)
    assert service["secrets"]["swamp_token"]["file"] == f"./{provisioning.TOKEN_FILE}"
    assert service["services"]["worker"]["environment"]["SWAMP_WORKER_TOKEN_FILE"] == (
        "/run/secrets/swamp_token"
    )
    assert "SWAMP_WORKER_TOKEN:" not in text


def test_the_unit_restarts_neither_a_rejection_nor_a_configuration_error():
    text = provisioning.unit(exec_start="/usr/bin/python3 -I /opt/swamp/swamp.pyz")
    assert "RestartPreventExitStatus=1 2\n" in text
    assert "ExecStart=/usr/bin/python3 -I /opt/swamp/swamp.pyz worker connect\n" in text


def test_the_kubernetes_output_passes_the_api_schemas():
    try:
        import kubernetes_validate
    except ImportError:
        require(False, "kubernetes-validate (pip, in the test extras)")
    build = _build(ca_pem=CA.certificate_pem(), ca_pin=PIN)
    text = provisioning.kubernetes(build, name="fleet", token="fleet.0123")
    version = kubernetes_validate.latest_version()
    for document in yaml.safe_load_all(text):
        kubernetes_validate.validate(document, version, strict=True)
    broken = next(d for d in yaml.safe_load_all(text) if d["kind"] == "StatefulSet")
    broken["spec"]["replicas"] = "one"  # the control: the validator does find errors
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


@pytest.mark.parametrize(
    "token", ["t.s\nSWAMP_ORCHESTRATOR_URL=wss://evil.example:443", "t.s\r\nLD_PRELOAD=/x", "", "t"]
)
def test_a_token_that_is_not_one_adds_no_line_to_any_file(token):
    """The token is the orchestrator's answer: a newline in it would add variables to the
    environment file the unit reads as root."""
    for render in (
        lambda: provisioning.cloud_init(_build(), token=token),
        lambda: provisioning.kubernetes(_build(), name="t", token=token),
    ):
        with pytest.raises(UserError, match="not <name>.<secret>"):
            render()


def test_no_provisioning_file_for_a_plain_url_off_loopback(tmp_path):
    """Its worker would refuse to send the token (exit 2, never restarted), and the checksum
    the file carries would have been read in clear text: refused before anything is asked."""
    from swamp.cli.common import Route
    from swamp.cli.worker_cmd import _served_build

    with pytest.raises(UserError, match="refusing to provision machines for ws://192.0.2.1"):
        _served_build("ws://192.0.2.1:7420", Route(repo_dir=tmp_path))
