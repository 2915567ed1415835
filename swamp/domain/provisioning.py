"""What a machine needs to become a worker, as text: cloud-init user-data, a Kubernetes
Deployment with its Secret, a Compose service. Each downloads the orchestrator's own build,
checks its sha256, and runs ``swamp worker connect`` from environment variables only.

Plain text builders (no YAML library at run time): strings go through ``json.dumps``, which is
valid YAML for a scalar, and file contents are literal blocks.

What goes into these files is checked first, because a machine runs them as root: the URL has
a plain shape (:func:`check_url`: no spaces, quotes, newlines or shell syntax, so it is safe in
an environment file and a command line) and the checksum, which comes from the orchestrator,
is 64 lowercase hex digits (:func:`is_sha256`). No shell reads either: cloud-init checks the
build with ``sha256sum -c`` and a checksum file it writes, a container fetches and checks it
with a small Python program that gets both as arguments.
"""

from __future__ import annotations

import json
import re

from swamp.domain.text import printable
from swamp.errors import UserError

PYZ_PATH = "/opt/swamp/swamp.pyz"
SHA256_FILE = "/opt/swamp/swamp.pyz.sha256"
ENV_FILE = "/etc/swamp/worker.env"
UNIT_PATH = "/etc/systemd/system/swamp-worker.service"
CONTAINER_PYZ = "/tmp/swamp.pyz"
TOKEN_FILE = "swamp_token"  # Compose: the secret file beside compose.yaml

_SHA256 = re.compile(r"[0-9a-f]{64}")
_URL = re.compile(
    r"(?P<scheme>[a-z]+)://"
    r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<path>(?:/[A-Za-z0-9._~-]*)*)"
)


def is_sha256(text: str) -> bool:
    """A sha256 as ``sha256sum`` prints it: 64 lowercase hex digits, nothing else."""
    return _SHA256.fullmatch(text) is not None


def check_url(url: str, *, what: str, schemes: tuple[str, ...] = ("ws", "wss")) -> str:
    """``url`` if it has the plain shape a provisioning file may carry: ``scheme://host`` with
    an optional port and path of letters, digits and ``._~-`` (no user info, query, fragment,
    spaces, quotes or anything a shell or an environment file would read); else an error."""
    match = _URL.fullmatch(url)
    port = match and match["port"]
    if match is None or match["scheme"] not in schemes or (port and not 0 < int(port) < 65536):
        shapes = " or ".join(f"{s}://host:port" for s in schemes)
        raise UserError(
            f"invalid {what} {printable(url)!r}: expected {shapes} (a host name or address, "
            "a port, a path of letters, digits and ._~-; no spaces, quotes, user, query or "
            "fragment)"
        )
    return url


def _checked(url: str, download: str, sha256: str) -> None:
    check_url(url, what="orchestrator URL")
    check_url(download, what="download URL", schemes=("http", "https"))
    if not is_sha256(sha256):
        raise UserError(f"invalid sha256 {printable(sha256)!r}: expected 64 lowercase hex digits")


UNIT = """\
# swamp worker, run by systemd. Configure it with {env_file} (mode 0600, owned by root):
#   SWAMP_ORCHESTRATOR_URL=wss://orchestrator.example:7420
#   SWAMP_WORKER_TOKEN=<name.secret>         (or SWAMP_WORKER_TOKEN_FILE=/path/to/secret)
#   SWAMP_WORKER_CACHE_DIR=/var/lib/swamp-worker
# A stop sends SIGTERM: the worker takes no new work and exits 0 once its running steps are done
# (up to TimeoutStopSec). Exit 0 is never restarted; exit 1 (a revoked or wrong token) is not
# restarted either: it would fail the same way again.
[Unit]
Description=swamp worker
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
EnvironmentFile={env_file}
ExecStart={exec_start} worker connect
{user}KillSignal=SIGTERM
KillMode=mixed
TimeoutStopSec=300
Restart=on-failure
RestartSec=5
RestartPreventExitStatus=1
StateDirectory=swamp-worker
NoNewPrivileges=yes

[Install]
WantedBy=multi-user.target
"""


def unit(*, exec_start: str, env_file: str = ENV_FILE, user: str | None = None) -> str:
    return UNIT.format(
        env_file=env_file, exec_start=exec_start, user=f"User={user}\n" if user else ""
    )


def _block(text: str, indent: int) -> str:
    pad = " " * indent
    return "\n".join(pad + line if line else "" for line in text.splitlines())


def environment(url: str, token: str) -> str:
    return (
        f"SWAMP_ORCHESTRATOR_URL={url}\n"
        f"SWAMP_WORKER_TOKEN={token}\n"
        "SWAMP_WORKER_CACHE_DIR=/var/lib/swamp-worker\n"
    )


def cloud_init(*, url: str, download: str, sha256: str, token: str) -> str:
    """``#cloud-config`` user-data: python3, the checked build, its environment file (0600,
    the token in it) and the systemd unit, enabled and started. Every command is an argument
    list (cloud-init quotes each argument); none goes through ``sh -c``."""
    _checked(url, download, sha256)
    runcmd = [
        ["mkdir", "-p", "/opt/swamp"],
        ["curl", "-fsSL", "--retry", "5", "-o", PYZ_PATH, download],
        ["sha256sum", "-c", SHA256_FILE],
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "swamp-worker"],
    ]
    return (
        "#cloud-config\n"
        "# A swamp worker: downloads the orchestrator's build, checks its sha256, and runs it\n"
        "# as a systemd service. This file holds an enrollment token: treat it as a secret.\n"
        "packages: [python3, curl]\n"
        "write_files:\n"
        f"  - path: {ENV_FILE}\n"
        "    permissions: '0600'\n"
        "    owner: root:root\n"
        "    content: |\n"
        f"{_block(environment(url, token), 6)}\n"
        f"  - path: {UNIT_PATH}\n"
        "    permissions: '0644'\n"
        "    owner: root:root\n"
        "    content: |\n"
        f"{_block(unit(exec_start=f'/usr/bin/python3 {PYZ_PATH}'), 6)}\n"
        f"  - path: {SHA256_FILE}\n"
        "    permissions: '0644'\n"
        "    owner: root:root\n"
        f"    content: {json.dumps(f'{sha256}  {PYZ_PATH}' + chr(10))}\n"
        "runcmd:\n" + "".join(f"  - {json.dumps(cmd)}\n" for cmd in runcmd)
    )


# A container's command: fetch the build with the image's own python, check its sha256, run it.
# The URL and the checksum are arguments, never parsed by a shell.
FETCH = (
    "import hashlib, os, pathlib, sys, urllib.request; "
    "url, want, path = sys.argv[1:4]; "
    "data = urllib.request.urlopen(url, timeout=60).read(); "
    "got = hashlib.sha256(data).hexdigest(); "
    "got == want or sys.exit(f'swamp.pyz from {url}: sha256 {got}, expected {want}'); "
    "pathlib.Path(path).write_bytes(data); "
    "os.execv(sys.executable, [sys.executable, '-I', path, *sys.argv[4:]])"
)


def fetch_and_run(download: str, sha256: str, *args: str) -> list[str]:
    """The argv of a container that fetches the build, checks it and runs ``swamp *args``."""
    return ["python3", "-I", "-c", FETCH, download, sha256, CONTAINER_PYZ, *args]


def kubernetes(*, name: str, url: str, download: str, sha256: str, token: str) -> str:
    """A Secret with the token and a Deployment whose container fetches the checked build."""
    _checked(url, download, sha256)
    command = fetch_and_run(download, sha256, "worker", "connect")
    return (
        "apiVersion: v1\n"
        "kind: Secret\n"
        f"metadata: {{name: {json.dumps(f'{name}-token')}}}\n"
        f"stringData: {{token: {json.dumps(token)}}}\n"
        "---\n"
        "apiVersion: apps/v1\n"
        "kind: Deployment\n"
        f"metadata: {{name: {json.dumps(f'swamp-worker-{name}')}}}\n"
        "spec:\n"
        "  replicas: 1\n"
        f"  selector: {{matchLabels: {{app: {json.dumps(f'swamp-worker-{name}')}}}}}\n"
        "  template:\n"
        f"    metadata: {{labels: {{app: {json.dumps(f'swamp-worker-{name}')}}}}}\n"
        "    spec:\n"
        "      terminationGracePeriodSeconds: 300\n"
        "      containers:\n"
        "        - name: worker\n"
        "          image: python:3.12-slim\n"
        f"          command: {json.dumps(command)}\n"
        "          env:\n"
        f"            - {{name: SWAMP_ORCHESTRATOR_URL, value: {json.dumps(url)}}}\n"
        "            - {name: SWAMP_WORKER_TOKEN_FILE, value: /var/run/secrets/swamp/token}\n"
        "            - {name: SWAMP_WORKER_CONCURRENCY, value: auto}\n"
        "          volumeMounts:\n"
        "            - {name: token, mountPath: /var/run/secrets/swamp, readOnly: true}\n"
        "      volumes:\n"
        f"        - {{name: token, secret: {{secretName: {json.dumps(f'{name}-token')}}}}}\n"
    )


def compose(*, url: str, download: str, sha256: str) -> str:
    """A Compose service. The token is not in it: Compose mounts it from the secret file
    ``./swamp_token`` beside the compose file (written next to ``--output``, mode 0600)."""
    _checked(url, download, sha256)
    command = fetch_and_run(download, sha256, "worker", "connect")
    return (
        f"# the enrollment token is read from ./{TOKEN_FILE} (mode 0600), never from this file\n"
        "services:\n"
        "  worker:\n"
        "    image: python:3.12-slim\n"
        f"    command: {json.dumps(command)}\n"
        "    environment:\n"
        f"      SWAMP_ORCHESTRATOR_URL: {json.dumps(url)}\n"
        "      SWAMP_WORKER_TOKEN_FILE: /run/secrets/swamp_token\n"
        "    secrets: [swamp_token]\n"
        "    stop_grace_period: 5m\n"
        "    restart: on-failure\n"
        "secrets:\n"
        "  swamp_token:\n"
        f"    file: ./{TOKEN_FILE}\n"
    )
