"""The plugin API: pluggy hook specifications.

A plugin is any module or object with functions marked ``@hookimpl``, published under the
``swamp`` entry-point group. Built-in models register through the very same hook.

Example, a package's ``pyproject.toml``::

    [project.entry-points.swamp]
    hello = "swamp_hello"

and ``swamp_hello.py``::

    from swamp.hooks import hookimpl
    from swamp.models import Arg, Method, ModelType, ResourceSpec

    async def greet(ctx, args):
        await ctx.log(f"hello, {args['who']}")
        await ctx.write_resource("greeting", "latest", {"who": args["who"]})

    @hookimpl
    def swamp_model_types():
        return [ModelType("hello/greeter", methods=(Method("greet", greet, args=(
            Arg("who", required=True),)),), resources=(ResourceSpec("greeting"),))]

Install the package where ``swamp serve`` runs *and* on the workers that should run it.
"""

from __future__ import annotations

import pluggy

PROJECT = "swamp"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def swamp_model_types() -> list:
    """Return a list of :class:`swamp.models.ModelType` this plugin contributes.

    Called once, when the model registry is built (by a command, never at import time). Two
    plugins contributing the same type name is an error reported at that point.
    """


@hookspec
def swamp_probe_seams() -> list:
    """Return a list of :class:`swamp.models.fleet_probe.Seam` the fleet probe should check.

    Called on the worker when ``swamp/fleet-probe.verify`` runs (``swamp worker verify`` and
    ``swamp serve --verify-on-enroll``). Each seam gets the probe's method context and returns a
    short detail, or raises (``SeamFailed`` or anything else) with a one-line reason. Example::

        from swamp.hooks import hookimpl
        from swamp.models.fleet_probe import Seam, SeamFailed

        async def has_docker(ctx, args):
            result = await ctx.run_process(["docker", "info"], timeout=10)
            if result.exit_code != 0:
                raise SeamFailed("docker info failed: " + " ".join(result.stderr_tail)[-120:])
            return "docker answers"

        @hookimpl
        def swamp_probe_seams():
            return [Seam("docker", has_docker)]
    """


@hookspec
def swamp_token_sources() -> list:
    """Return a list of :class:`swamp.worker.token_sources.TokenSource`: where a worker's
    enrollment token may come from, by scheme.

    Called on the worker by ``swamp worker connect`` when ``SWAMP_WORKER_TOKEN`` (or
    ``--token``) is ``<scheme>:<reference>`` rather than a token: the source of that scheme is
    given the reference and returns the token ``<name>.<secret>``. It is called once as the
    worker starts, and again only when the orchestrator refuses the token in hand for good
    (revoked, expired, unknown) or its deadline passes — so a rotated secret is picked up
    without a restart. ``file`` and ``env`` are built in; a scheme is registered once.

    ``resolve(reference)`` is plain (not async) and may block: it runs in a thread, and one
    that has not answered within :data:`swamp.worker.token_sources.TIMEOUT` fails the
    worker. Raise ``TokenSourceFailed`` with a one-line reason that holds no secret; any other
    exception is reported by its type alone. Example, a Vault source::

        import subprocess
        from swamp.errors import TokenSourceFailed
        from swamp.hooks import hookimpl
        from swamp.worker.token_sources import TokenSource

        def from_vault(path):
            done = subprocess.run(["vault", "kv", "get", "-field=token", path],
                                  capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise TokenSourceFailed(f"vault exited with status {done.returncode}")
            return done.stdout

        @hookimpl
        def swamp_token_sources():
            return [TokenSource("vault", from_vault, "a Vault KV path, e.g. secret/swamp")]

    and then ``SWAMP_WORKER_TOKEN=vault:secret/swamp swamp worker connect wss://…``.
    """
