"""Makes a machine a worker: fetch the orchestrator's build, check it, then start it.

This file is not imported by swamp: ``swamp worker token create --cloud-init`` (and
``--kubernetes``, ``--compose``) put its text on the new machine, which runs it with its own
``python3`` and nothing but the standard library (so it keeps to syntax old Pythons read)::

    python3 -I bootstrap.py MODE DOWNLOAD SHA256 PYZ [CA_FILE]

Every step must pass before the next runs, and the first failure ends it with one line on
stderr and exit status 1 — nothing is enabled or started after a failed check:

1. download ``DOWNLOAD`` (``https`` verified against ``CA_FILE`` when given — the
   orchestrator's own CA, which names no particular host, so names are not checked — else
   the system's roots), a bounded number of attempts with a growing pause;
2. check its sha256 against ``SHA256``; write it to ``PYZ`` (mode 0755) by a rename;
3. by ``MODE``: ``install`` enables and starts the systemd unit ``swamp-worker``;
   ``container`` becomes ``swamp worker connect``; ``compose`` runs it and passes on its
   exit status, except that a worker that stopped for good (1: its token refused; 2: its
   configuration wrong) exits 0 after saying so, so that ``restart: on-failure`` does not
   start it again and again. A crash or a kill is still restarted.

``SWAMP_CA_PEM`` in the environment (Compose) is the CA certificate itself instead of a file.
"""

import hashlib
import http.client
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

ATTEMPTS = 5
FIRST_PAUSE = 2.0
MAX_BYTES = 64 * 1024 * 1024
ATTEMPT_SECONDS = 300  # an attempt that has not finished by then (a trickle) is a failed one
UNIT = "swamp-worker"


def fail(message):
    sys.stderr.write("swamp bootstrap: " + message + "\n")
    sys.exit(1)


def context(ca_file):
    if not ca_file:
        return ssl.create_default_context()
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.check_hostname = False  # the orchestrator's own CA signs for it alone
    return ctx


def too_slow(signum, frame):
    raise OSError(f"not complete after {ATTEMPT_SECONDS} s")


def download(url, ca_file):
    """One attempt: the whole body, or an exception (a body shorter than its Content-Length,
    which a connection closed early gives, is one: it is asked again, not checked)."""
    secure = context(ca_file) if url.startswith("https://") else None
    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(ATTEMPT_SECONDS)
    try:
        with urllib.request.urlopen(url, timeout=60, context=secure) as answer:
            declared = answer.getheader("Content-Length") or ""
            data = answer.read(MAX_BYTES + 1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    if len(data) > MAX_BYTES:
        fail(f"the download from {url} is larger than {MAX_BYTES} bytes")
    if declared.isdigit() and len(data) < int(declared):
        raise OSError(f"the answer ended after {len(data)} of {declared} bytes")
    return data


def fetch(url, ca_file):
    """The build's bytes, after at most ATTEMPTS tries."""
    pause = FIRST_PAUSE
    last = None
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return download(url, ca_file)
        # URLError, HTTPError and TLS errors are OSErrors; a peer that is not HTTP (or stops
        # in the middle of a chunk) raises an HTTPException
        except (OSError, ValueError, http.client.HTTPException) as exc:
            last = " ".join(str(exc).split())  # one line, whatever the peer sent
            sys.stderr.write(
                f"swamp bootstrap: download {attempt}/{ATTEMPTS} from {url} failed: {last}\n"
            )
            if attempt < ATTEMPTS:
                time.sleep(pause)
                pause *= 2
    fail(f"could not download {url} in {ATTEMPTS} attempts (last: {last}); nothing started")


def place(data, want, path):
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        fail(f"the build from the orchestrator has sha256 {got}, expected {want}: not started")
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".swamp.pyz.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp)
        fail(f"cannot write {path}: {exc}")


def install():
    for command in (["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", UNIT]):
        try:
            done = subprocess.run(command)
        except OSError as exc:
            fail(f"cannot run {' '.join(command)}: {exc}")
        if done.returncode != 0:
            fail(f"{' '.join(command)} failed (exit status {done.returncode})")
    sys.stderr.write(f"swamp bootstrap: the build checked; {UNIT} enabled and started\n")


def worker_argv(path):
    return [sys.executable, "-I", path, "worker", "connect"]


def supervise(path):
    """Run the worker; pass SIGTERM and SIGINT on (a drain); end as the table above says."""
    child = subprocess.Popen(worker_argv(path))

    def forward(signum, frame):
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = child.wait()
    if status in (1, 2):
        sys.stderr.write(
            f"swamp bootstrap: the worker stopped for good (exit status {status}: see above); "
            "not restarting it\n"
        )
        sys.exit(0)
    sys.exit(status if status >= 0 else 128 - status)


def main(argv):
    if len(argv) not in (4, 5) or argv[0] not in ("install", "container", "compose"):
        fail("usage: bootstrap.py install|container|compose DOWNLOAD SHA256 PYZ [CA_FILE]")
    mode, url, want, path = argv[:4]
    ca_file = argv[4] if len(argv) == 5 else None
    pem = os.environ.get("SWAMP_CA_PEM")
    if pem and not ca_file:
        fd, ca_file = tempfile.mkstemp(prefix="swamp-ca.", suffix=".pem")
        with os.fdopen(fd, "w") as out:
            out.write(pem)
    if ca_file:
        os.environ["SWAMP_CA_CERT"] = ca_file  # the worker trusts what the download did
    place(fetch(url, ca_file), want, path)
    if mode == "install":
        install()
    elif mode == "container":
        argv = worker_argv(path)
        os.execv(argv[0], argv)
    else:
        supervise(path)


if __name__ == "__main__":
    main(sys.argv[1:])
