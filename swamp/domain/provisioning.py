"""What a machine needs to become a worker, as text: cloud-init user-data, a Kubernetes
StatefulSet with its Secret, a Compose service. Each runs the bootstrap program
(``swamp/bootstrap.py``): download the orchestrator's own build, check its sha256, and only
then start ``swamp worker connect``, configured by environment variables only.

Each carries the trust it needs, so that the download and the worker's connection are both
verified: the orchestrator's own CA certificate (public) and its pin, when it has one
(``serve --tls auto``), or the CA file the operator named (``--ca-cert``).

Plain text builders (no YAML library at run time): strings go through ``json.dumps``, which is
valid YAML for a scalar, and file contents are literal blocks.

What goes into these files is checked first, because a machine runs them as root: the URL has
a plain shape (:func:`check_url`: no spaces, quotes, newlines or shell syntax, so it is safe in
an environment file and a command line) and the checksum, which comes from the orchestrator,
is 64 lowercase hex digits (:func:`is_sha256`). No shell reads either: the bootstrap program
gets both as arguments.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from swamp.domain.text import printable
from swamp.errors import UserError

PYZ_PATH = "/opt/swamp/swamp.pyz"
BOOTSTRAP_PATH = "/opt/swamp/bootstrap.py"
ENV_FILE = "/etc/swamp/worker.env"
CA_FILE = "/etc/swamp/ca.pem"
UNIT_PATH = "/etc/systemd/system/swamp-worker.service"
CONTAINER_PYZ = "/tmp/swamp.pyz"
CONTAINER_CONFIG = "/etc/swamp"  # Kubernetes: the ConfigMap (bootstrap.py, ca.pem)
CACHE_DIR = "/var/lib/swamp-worker"
TOKEN_FILE = "swamp_token"  # Compose: the secret file beside compose.yaml
IMAGE = "python:3.12-slim"

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


@dataclass(frozen=True)
class Build:
    """What a provisioning file carries: where machines connect, the build they download and
    its checksum, the bootstrap program's text, and the trust (``ca_pem``: a CA certificate,
    ``ca_pin``: the pin of the orchestrator's own CA)."""

    url: str
    download: str
    sha256: str
    bootstrap: str
    ca_pem: str | None = None
    ca_pin: str | None = None

    def __post_init__(self) -> None:
        check_url(self.url, what="orchestrator URL")
        check_url(self.download, what="download URL", schemes=("http", "https"))
        if not is_sha256(self.sha256):
            raise UserError(
                f"invalid sha256 {printable(self.sha256)!r}: expected 64 lowercase hex digits"
            )
        if self.ca_pin is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", self.ca_pin):
            raise UserError(f"invalid CA pin {printable(self.ca_pin)!r}")
        if self.ca_pem is not None and not _PEM_TEXT.fullmatch(self.ca_pem):
            raise UserError("the CA certificate to carry is not a PEM text")

    def environment(self, *, ca_file: str | None) -> dict[str, str]:
        """The worker's variables, but for its token."""
        env = {"SWAMP_ORCHESTRATOR_URL": self.url, "SWAMP_WORKER_CACHE_DIR": CACHE_DIR}
        if self.ca_pem is not None and ca_file:
            env["SWAMP_CA_CERT"] = ca_file
        if self.ca_pin is not None:
            env["SWAMP_CA_PIN"] = self.ca_pin
        return env


# A PEM text: BEGIN/END lines and base64 between them, nothing a YAML block or a shell reads.
_PEM_TEXT = re.compile(r"(-----(BEGIN|END) [A-Z ]+-----\n|[A-Za-z0-9+/=]{1,76}\n)+")


UNIT = """\
# swamp worker, run by systemd. Configure it with {env_file} (mode 0600, owned by root):
#   SWAMP_ORCHESTRATOR_URL=wss://orchestrator.example:7420
#   SWAMP_WORKER_TOKEN=<name.secret>         (or SWAMP_WORKER_TOKEN_FILE=/path/to/secret)
#   SWAMP_CA_PIN=sha256:<hex>                (an orchestrator with its own CA: serve --tls auto)
#   SWAMP_WORKER_CACHE_DIR=/var/lib/swamp-worker
# A stop sends SIGTERM: the worker takes no new work and exits 0 once its running steps are done
# (up to TimeoutStopSec). Exit 0 is never restarted, nor are exit 1 (a revoked or wrong token,
# a wrong CA pin) and exit 2 (a configuration error): they would fail the same way again.
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
RestartPreventExitStatus=1 2
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


# A token as the orchestrator mints it (<name>.<hex>): it comes in the orchestrator's answer
# and goes into an environment file, a Secret and a Compose secret file, which a newline in it
# would add lines to.
_TOKEN = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}\.[A-Za-z0-9_-]{1,512}")


def check_token(token: str) -> str:
    if not isinstance(token, str) or _TOKEN.fullmatch(token) is None:
        raise UserError(
            "the orchestrator answered with a token that is not <name>.<secret>: nothing "
            "was written"
        )
    return token


def environment(build: Build, token: str) -> str:
    variables = {**build.environment(ca_file=CA_FILE), "SWAMP_WORKER_TOKEN": check_token(token)}
    return "".join(f"{name}={value}\n" for name, value in variables.items())


def _file(path: str, permissions: str, content: str) -> str:
    return (
        f"  - path: {path}\n"
        f"    permissions: '{permissions}'\n"
        "    owner: root:root\n"
        "    content: |\n"
        f"{_block(content, 6)}\n"
    )


def cloud_init(build: Build, *, token: str) -> str:
    """``#cloud-config`` user-data: python3; the CA (if any), the environment file (0600, the
    token in it), the unit and the bootstrap program as files; and one command — the
    bootstrap — that downloads and checks the build and only then enables and starts the
    unit. cloud-init runs ``runcmd`` as one shell script that goes on after a failed line, so
    the whole chain is that one command: nothing can start after a failed check. Its
    arguments are quoted by cloud-init; no ``sh -c``."""
    ca = [build.ca_pem and CA_FILE] if build.ca_pem else []
    command = ["python3", "-I", BOOTSTRAP_PATH, "install", build.download, build.sha256]
    command += [PYZ_PATH, *ca]
    files = ""
    if build.ca_pem:
        files += _file(CA_FILE, "0644", build.ca_pem)
    files += _file(ENV_FILE, "0600", environment(build, token))
    files += _file(UNIT_PATH, "0644", unit(exec_start=f"/usr/bin/python3 -I {PYZ_PATH}"))
    files += _file(BOOTSTRAP_PATH, "0755", build.bootstrap)
    return (
        "#cloud-config\n"
        "# A swamp worker: downloads the orchestrator's build, checks its sha256, and only then\n"
        "# starts it as a systemd service (a failed check starts nothing: see\n"
        "# /var/log/cloud-init-output.log). This file holds an enrollment token: a secret.\n"
        "packages: [python3]\n"
        "write_files:\n"
        f"{files}"
        "runcmd:\n"
        f"  - {json.dumps(command)}\n"
    )


def _container_command(build: Build, mode: str, pyz: str, ca_file: str | None) -> list[str]:
    """The argv of a container that fetches the build, checks it and runs the worker."""
    return ["python3", "-I", f"{CONTAINER_CONFIG}/bootstrap.py", mode, build.download,
            build.sha256, pyz, *([ca_file] if ca_file else [])]  # fmt: skip


def kubernetes(build: Build, *, name: str, token: str) -> str:
    """A Secret (the token), a ConfigMap (the bootstrap program and the CA), a headless
    Service and a StatefulSet. A StatefulSet, not a Deployment: each pod keeps its volume
    (``SWAMP_WORKER_CACHE_DIR``, where the machine id lives) across restarts and re-rolls, so a
    restarted pod comes back as the same worker and holds the same fleet place, never a new
    one (a fleet of N places takes ``replicas: N``)."""
    check_token(token)
    app = f"swamp-worker-{name}"
    ca_file = f"{CONTAINER_CONFIG}/ca.pem" if build.ca_pem else None
    command = _container_command(build, "container", CONTAINER_PYZ, ca_file)
    env = build.environment(ca_file=ca_file)
    env_lines = "".join(
        f"            - {{name: {n}, value: {json.dumps(v)}}}\n" for n, v in env.items()
    )
    config = {"bootstrap.py": build.bootstrap, **({"ca.pem": build.ca_pem} if build.ca_pem else {})}
    data = "".join(f"  {key}: |\n{_block(text, 4)}\n" for key, text in config.items())
    return (
        "apiVersion: v1\n"
        "kind: Secret\n"
        f"metadata: {{name: {json.dumps(f'{name}-token')}}}\n"
        f"stringData: {{token: {json.dumps(token)}}}\n"
        "---\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        f"metadata: {{name: {json.dumps(f'{app}-bootstrap')}}}\n"
        "data:\n"
        f"{data}"
        "---\n"
        "apiVersion: v1\n"
        "kind: Service\n"
        f"metadata: {{name: {json.dumps(app)}}}\n"
        "spec:\n"
        "  clusterIP: None\n"
        f"  selector: {{app: {json.dumps(app)}}}\n"
        "---\n"
        "apiVersion: apps/v1\n"
        "kind: StatefulSet\n"
        f"metadata: {{name: {json.dumps(app)}}}\n"
        "spec:\n"
        f"  serviceName: {json.dumps(app)}\n"
        "  replicas: 1\n"
        "  podManagementPolicy: Parallel\n"
        f"  selector: {{matchLabels: {{app: {json.dumps(app)}}}}}\n"
        "  template:\n"
        f"    metadata: {{labels: {{app: {json.dumps(app)}}}}}\n"
        "    spec:\n"
        "      terminationGracePeriodSeconds: 300\n"
        "      containers:\n"
        "        - name: worker\n"
        f"          image: {IMAGE}\n"
        f"          command: {json.dumps(command)}\n"
        "          env:\n"
        f"{env_lines}"
        "            - {name: SWAMP_WORKER_TOKEN_FILE, value: /var/run/secrets/swamp/token}\n"
        "            - {name: SWAMP_WORKER_CONCURRENCY, value: auto}\n"
        "          volumeMounts:\n"
        "            - {name: token, mountPath: /var/run/secrets/swamp, readOnly: true}\n"
        f"            - {{name: bootstrap, mountPath: {CONTAINER_CONFIG}, readOnly: true}}\n"
        f"            - {{name: cache, mountPath: {CACHE_DIR}}}\n"
        "      volumes:\n"
        f"        - {{name: token, secret: {{secretName: {json.dumps(f'{name}-token')}}}}}\n"
        f"        - {{name: bootstrap, configMap: {{name: {json.dumps(f'{app}-bootstrap')}}}}}\n"
        "  volumeClaimTemplates:\n"
        "    - metadata: {name: cache}\n"
        "      spec:\n"
        "        accessModes: [ReadWriteOnce]\n"
        "        resources: {requests: {storage: 64Mi}}\n"
    )


def compose(build: Build) -> str:
    """A Compose service. The token is not in it: Compose mounts it from the secret file
    ``./swamp_token`` beside the compose file (written next to ``--output``, mode 0600). A
    named volume keeps the machine id, so a restarted container is the same worker; the
    bootstrap ends a worker that stopped for good with 0, so ``restart: on-failure`` restarts
    a crash but not a refused token or a drain."""
    command = _container_command(build, "compose", CONTAINER_PYZ, None)
    env = {
        **build.environment(ca_file=None),
        "SWAMP_WORKER_TOKEN_FILE": "/run/secrets/swamp_token",
    }
    env_lines = "".join(f"      {n}: {json.dumps(v)}\n" for n, v in env.items())
    if build.ca_pem:
        env_lines += f"      SWAMP_CA_PEM: |\n{_block(build.ca_pem, 8)}\n"
    return (
        f"# the enrollment token is read from ./{TOKEN_FILE} (mode 0600), never from this file\n"
        "services:\n"
        "  worker:\n"
        f"    image: {IMAGE}\n"
        f"    command: {json.dumps(command)}\n"
        "    environment:\n"
        f"{env_lines}"
        "    secrets: [swamp_token]\n"
        "    configs:\n"
        f"      - {{source: swamp_bootstrap, target: {CONTAINER_CONFIG}/bootstrap.py}}\n"
        f'    volumes: ["swamp-cache:{CACHE_DIR}"]\n'
        "    stop_grace_period: 5m\n"
        "    restart: on-failure\n"
        "secrets:\n"
        "  swamp_token:\n"
        f"    file: ./{TOKEN_FILE}\n"
        "configs:\n"
        "  swamp_bootstrap:\n"
        "    content: |\n"
        f"{_block(build.bootstrap.replace('$', '$$'), 6)}\n"
        "volumes:\n"
        "  swamp-cache: {}\n"
    )
