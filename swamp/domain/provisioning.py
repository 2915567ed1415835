"""What a machine needs to become a worker, as text: cloud-init user-data, a Kubernetes
Deployment with its Secret, a Compose service. Each downloads the orchestrator's own build,
checks its sha256, and runs ``swamp worker connect`` from environment variables only.

Plain text builders (no YAML library at run time): strings go through ``json.dumps``, which is
valid YAML for a scalar, and file contents are literal blocks.
"""

from __future__ import annotations

import json

PYZ_PATH = "/opt/swamp/swamp.pyz"
ENV_FILE = "/etc/swamp/worker.env"
UNIT_PATH = "/etc/systemd/system/swamp-worker.service"

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
    the token in it) and the systemd unit, enabled and started."""
    check = f"echo '{sha256}  {PYZ_PATH}' | sha256sum -c -"
    runcmd = [
        ["mkdir", "-p", "/opt/swamp"],
        ["curl", "-fsSL", "--retry", "5", "-o", PYZ_PATH, download],
        ["sh", "-c", check],
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
        "runcmd:\n" + "".join(f"  - {json.dumps(cmd)}\n" for cmd in runcmd)
    )


def _fetch_and_run(download: str, sha256: str) -> str:
    """A container's command: fetch the build with the image's own python, check it, run it."""
    return (
        f"python3 -c \"import urllib.request; urllib.request.urlretrieve('{download}', "
        f"'/tmp/swamp.pyz')\" && echo '{sha256}  /tmp/swamp.pyz' | sha256sum -c - && "
        "exec python3 /tmp/swamp.pyz worker connect"
    )


def kubernetes(*, name: str, url: str, download: str, sha256: str, token: str) -> str:
    """A Secret with the token and a Deployment whose container fetches the checked build."""
    fetch = _fetch_and_run(download, sha256)
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
        f"          command: {json.dumps(['sh', '-c', fetch])}\n"
        "          env:\n"
        f"            - {{name: SWAMP_ORCHESTRATOR_URL, value: {json.dumps(url)}}}\n"
        "            - {name: SWAMP_WORKER_TOKEN_FILE, value: /var/run/secrets/swamp/token}\n"
        "            - {name: SWAMP_WORKER_CONCURRENCY, value: auto}\n"
        "          volumeMounts:\n"
        "            - {name: token, mountPath: /var/run/secrets/swamp, readOnly: true}\n"
        "      volumes:\n"
        f"        - {{name: token, secret: {{secretName: {json.dumps(f'{name}-token')}}}}}\n"
    )


def compose(*, url: str, download: str, sha256: str, token: str) -> str:
    """A Compose service (the token in a secret file next to it: ``./swamp_token``)."""
    fetch = _fetch_and_run(download, sha256)
    return (
        f"# write the token to ./swamp_token (mode 0600) first: {token}\n"
        "services:\n"
        "  worker:\n"
        "    image: python:3.12-slim\n"
        f"    command: {json.dumps(['sh', '-c', fetch])}\n"
        "    environment:\n"
        f"      SWAMP_ORCHESTRATOR_URL: {json.dumps(url)}\n"
        "      SWAMP_WORKER_TOKEN_FILE: /run/secrets/swamp_token\n"
        "    secrets: [swamp_token]\n"
        "    stop_grace_period: 5m\n"
        "    restart: on-failure\n"
        "secrets:\n"
        "  swamp_token:\n"
        "    file: ./swamp_token\n"
    )
