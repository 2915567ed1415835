"""What goes into a provisioning file, which a machine runs as root: a URL of a plain shape, a
checksum that is one, no shell, and no token in a Compose file (the real processes:
tests/integration/test_pyz.py)."""

import pytest
import yaml

from swamp.domain import provisioning
from swamp.domain.provisioning import check_url, is_sha256
from swamp.errors import UserError

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


def test_builders_refuse_what_they_cannot_carry_safely():
    for build in (
        {**BUILD, "sha256": "';touch${IFS}x;'" + "0" * 48},
        {**BUILD, "sha256": SHA, "url": "ws://h:1/'"},
        {**BUILD, "sha256": SHA, "download": "https://h:1/x y"},
    ):
        with pytest.raises(UserError):
            provisioning.cloud_init(token="t.s", **build)
        with pytest.raises(UserError):
            provisioning.compose(**build)
        with pytest.raises(UserError):
            provisioning.kubernetes(name="t", token="t.s", **build)


def test_no_shell_reads_the_url_or_the_checksum():
    config = yaml.safe_load(provisioning.cloud_init(token="t.s", sha256=SHA, **BUILD))
    assert all(command[0] != "sh" for command in config["runcmd"])
    assert ["sha256sum", "-c", provisioning.SHA256_FILE] in config["runcmd"]
    files = {f["path"]: f["content"] for f in config["write_files"]}
    assert files[provisioning.SHA256_FILE] == f"{SHA}  {provisioning.PYZ_PATH}\n"
    for text in (
        provisioning.compose(sha256=SHA, **BUILD),
        provisioning.kubernetes(name="t", token="t.s", sha256=SHA, **BUILD),
    ):
        documents = list(yaml.safe_load_all(text))
        command = (
            documents[0]["services"]["worker"]["command"]
            if "services" in documents[0]
            else documents[1]["spec"]["template"]["spec"]["containers"][0]["command"]
        )
        assert command == provisioning.fetch_and_run(BUILD["download"], SHA, "worker", "connect")
        assert command[:3] == ["python3", "-I", "-c"]


def test_the_compose_file_holds_no_token_only_a_reference_to_its_secret_file():
    text = provisioning.compose(sha256=SHA, **BUILD)
    service = yaml.safe_load(text)
    assert service["secrets"]["swamp_token"]["file"] == f"./{provisioning.TOKEN_FILE}"
    assert service["services"]["worker"]["environment"]["SWAMP_WORKER_TOKEN_FILE"] == (
        "/run/secrets/swamp_token"
    )
    assert "SWAMP_WORKER_TOKEN:" not in text
