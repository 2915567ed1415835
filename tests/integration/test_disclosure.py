"""Nothing leaves unnamed: the orchestrator's environment, and data a dispatch may read."""

import json

import httpx
import pytest
import trio

from tests.integration.conftest import logs_of, result_of
from tests.integration.hostile import RawSocket, enroll_params

pytestmark = pytest.mark.integration

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
    "DATABASE_URL": "postgres://u:pw@db/x",
    "GITHUB_TOKEN": "ghp_secret_value",
}


def _env_on_worker(cluster, name, *extra):
    code, lines = cluster.run(
        "test/steps", "env", "--arg", f"name={name}", "--target", "w1", *extra
    )
    assert code == 0, lines
    return logs_of(lines)[0].split("=", 1)[1]


def test_the_orchestrators_secrets_reach_no_worker_unless_named(cluster):
    cluster.env.update(SECRETS, SHIPPED_SETTING="every-dispatch", AWS_REGION="eu-west-1")
    cluster.serve("--ship-env", "SHIPPED_SETTING")
    for name in (*SECRETS, "SHIPPED_SETTING", "AWS_REGION"):
        cluster.env.pop(name)  # the worker's own environment has none of them
    cluster.worker(cluster.mint("w1"))
    # the whole environment of a command on the worker: not one secret value in it
    code, lines = cluster.run("command/shell", "run", "--arg", "command=env", "--target", "w1")
    dumped = "\n".join(logs_of(lines))
    assert code == 0 and "SHIPPED_SETTING=every-dispatch" in dumped
    for value in SECRETS.values():
        assert value not in dumped
    assert _env_on_worker(cluster, "AWS_SECRET_ACCESS_KEY") == "<unset>"
    assert _env_on_worker(cluster, "AWS_REGION") == "<unset>"
    # a model names what it needs; a run names more
    (cluster.repo / "models" / "deploy.toml").write_text(
        'type = "test/steps"\nenv = ["AWS_REGION"]\n'
    )
    code, lines = cluster.run("deploy", "env", "--arg", "name=AWS_REGION", "--target", "w1")
    assert code == 0 and logs_of(lines) == ["AWS_REGION=eu-west-1"]
    assert _env_on_worker(cluster, "GITHUB_TOKEN", "--env", "GITHUB_TOKEN") == "ghp_secret_value"
    assert _env_on_worker(cluster, "DATABASE_URL") == "<unset>"  # only for the run that named it
    # what can never ship is an input error, whoever names it
    refused = cluster.cli(
        "model",
        "method",
        "run",
        "test/steps",
        "env",
        "--arg",
        "name=PATH",
        "--target",
        "w1",
        "--env",
        "PATH",
        "--server",
        cluster.url,
    )
    assert refused.returncode == 2 and "can never be shipped" in refused.stderr
    (cluster.repo / "models" / "leaky.toml").write_text(
        'type = "test/steps"\nenv = ["SWAMP_WORKER_TOKEN"]\n'
    )
    code, lines = cluster.run("deploy", "env", "--arg", "name=X", "--target", "w1")
    assert code == 2 and "leaky.toml" in lines[0]["error"]["message"]


def test_serve_refuses_to_ship_what_can_never_ship(cluster):
    result = cluster.cli("serve", "--port", "0", "--ship-env", "AWS_REGION,HOME")
    assert result.returncode == 2 and "HOME" in result.stderr and "--ship-env" in result.stderr


def test_a_dispatch_reads_only_what_it_runs_and_learns_nothing_else(cluster):
    """The oracle attack: a method bisected a worker's machine id and a token's hash prefix one
    character at a time, because a refusal after matching told it what exists."""
    cluster.serve()
    cluster.worker(cluster.mint("w1"), cache_dir=cluster.tmp / "w1-cache")
    machine_id = (cluster.tmp / "w1-cache" / "machine-id").read_text().strip()
    code, _ = cluster.run(
        "command/shell", "run", "--arg", "command=echo secret-output", "--target", "w1"
    )
    assert code == 0

    def count(predicate, model="test/steps"):
        code, lines = cluster.run(
            model, "query", "--arg", f"predicate={predicate}", "--target", "w1"
        )
        assert code == 0, lines  # never a refusal: a refusal would be the oracle
        return result_of(lines)["result"]["count"]

    # what exists and what does not exist answer alike
    token = 'modelType == "swamp/enrollment-token" && attributes.secretHash > '
    probes = {
        'modelType == "swamp/worker"': 'modelType == "swamp/nothing"',
        f'attributes.machineId == "{machine_id}"': 'attributes.machineId == "0000"',
        f'attributes.machineId >= "{machine_id[0]}"': 'attributes.machineId >= "~"',
        token + '"0"': token + '"~"',
        'modelType == "command/shell"': 'modelType == "command/nothing"',
    }
    for real, fake in probes.items():
        assert count(real) == count(fake) == 0, real
    assert count("version > 0") == 0  # nothing of its own yet: no other model's data either
    # a model that declares what it reads sees that, and still no infrastructure
    (cluster.repo / "models" / "auditor.toml").write_text(
        'type = "test/steps"\nreads = ["@command/shell", "@swamp/*"]\n'
    )
    assert count('modelType == "command/shell"', model="auditor") == 1
    assert count('modelType == "swamp/worker"', model="auditor") == 0
    assert count("version > 0", model="auditor") == 1
    (cluster.repo / "models" / "typo.toml").write_text('type = "test/steps"\nreads = ["nobody"]\n')
    code, lines = cluster.run("typo", "query", "--arg", "predicate=version > 0", "--target", "w1")
    assert code == 2 and "nobody" in lines[0]["error"]["message"]


async def test_an_adhoc_run_is_its_own_instance_no_other_run_reads_or_overwrites(cluster):
    """Every ad-hoc run of a type shared one instance (``<type>/default``): a worker of another
    token, given a later ad-hoc command/shell run, read the secret an earlier run printed on
    another worker and overwrote the 'latest result' the operator then looked at."""
    cluster.serve()
    cluster.worker(cluster.mint("honest"), "--label", "role=honest")
    code, lines = cluster.run(
        "command/shell", "run", "--arg", "command=echo s3cret-value", "--label", "role=honest"
    )
    assert code == 0, lines
    honest = result_of(lines)
    assert honest["model"].startswith("run-")
    # a worker of another token that does what it likes with the dispatch it is given
    token = cluster.mint("mallory")  # first: a socket has only seconds to enroll
    hostile = await RawSocket.open(cluster.url)
    params = enroll_params(token, labels={"role": "mallory"})
    reply = await hostile.request("worker.enroll", params)
    assert reply["type"] == "response", reply
    seen: dict = {}

    async def misbehave() -> None:
        while True:
            frame = await hostile.next_frame()
            if frame.get("method") == "worker.dispatch":
                break
        params = frame["params"]
        data_plane = cluster.url.replace("ws://", "http://")
        auth = {"Authorization": f"Bearer {params['credential']}"}
        async with httpx.AsyncClient() as http:
            # its own run's data: written and read back (the control: queries do find data)
            mine = await http.put(
                f"{data_plane}/data/resources/result/mine", json={"x": 1}, headers=auth
            )
            seen["own write"] = mine.status_code
            # the attack: the earlier run's result, and the name the operator reads
            for name in ("result",):
                put = await http.put(
                    f"{data_plane}/data/resources/result/{name}",
                    json={"exitCode": 0, "stdoutTail": ["all is well"]},
                    headers=auth,
                )
                seen["overwrite"] = put.status_code
        for predicate in ('modelType == "command/shell"', "version > 0"):
            answer = await hostile.request(
                "capability.queryData",
                {"dispatchId": params["dispatchId"], "predicate": predicate},
            )
            seen[predicate] = answer["result"]["records"]
        await hostile.send({
            "type": "response",
            "id": frame["id"],
            "result": {"status": "succeeded", "durationMs": 1},
        })  # fmt: skip

    async with trio.open_nursery() as nursery:
        nursery.start_soon(misbehave)
        code, lines = await trio.to_thread.run_sync(
            lambda: cluster.run(
                "command/shell", "run", "--arg", "command=true", "--label", "role=mallory"
            )
        )
    await hostile.aclose()
    assert code == 0, lines
    mallory = result_of(lines)["model"]
    assert mallory.startswith("run-") and mallory != honest["model"]
    assert seen["own write"] == 200
    for predicate in ('modelType == "command/shell"', "version > 0"):
        found = seen[predicate]
        assert {r["modelName"] for r in found} == {mallory}, found  # only its own run's
        assert "s3cret" not in json.dumps(found)
    # what the operator sees of the honest run is what the honest run wrote
    latest = cluster.query(f'modelName == "{honest["model"]}" && name == "result"')
    assert latest[0]["attributes"]["stdoutTail"].strip() == "s3cret-value"
