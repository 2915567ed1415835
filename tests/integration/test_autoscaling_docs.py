"""docs/autoscaling.md's files hold to their word, without a cluster: the Kubernetes objects
pass the API's schemas (``kubernetes-validate``, strict), KEDA's pass KEDA's own (the npm
package ``@kubernetes-models/keda``, generated from KEDA's API, run by node), both scalers
target the StatefulSet that ``swamp worker token create --kubernetes`` makes, and KEDA and the
adapter run the query that ``test_autoscaling_prometheus.py`` checks on a real Prometheus.
(That the document shows exactly these files is ``test_readme.py``'s ``file`` blocks.)"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from swamp.domain.provisioning import Build, kubernetes
from tests.external import command, require
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration

DOCS = ROOT / "docs" / "autoscaling"
QUERY = (DOCS / "workers-needed.promql").read_text()


def _objects(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DOCS / name).read_text()))


def _one(name: str, kind: str) -> dict:
    [found] = [o for o in _objects(name) if o["kind"] == kind]
    return found


def test_the_kubernetes_objects_pass_the_api_schemas():
    try:
        import kubernetes_validate
    except ImportError:
        require(False, "kubernetes-validate (pip, in the test extras)")
    version = kubernetes_validate.latest_version()
    checked = []
    for name in ("scrape.yaml", "keda.yaml", "hpa.yaml"):
        for obj in _objects(name):
            if obj["apiVersion"].startswith("keda.sh/"):
                continue  # a CRD's: the next test
            kubernetes_validate.validate(obj, version, strict=True)
            checked.append(obj["kind"])
    assert sorted(checked) == ["ConfigMap", "HorizontalPodAutoscaler", "Secret", "Secret"]


KEDA_MODELS = ROOT / "build" / "keda-models"  # .ci/run: npm install --prefix build/keda-models
KEDA_PACKAGE = "@kubernetes-models/keda@2.0.0"


def _keda_verdicts(objects: list[dict]) -> list[str | None]:
    """KEDA's own models' verdict on each object (``None``: valid), by node."""
    node = command("node")
    require(
        (KEDA_MODELS / "node_modules" / "@kubernetes-models" / "keda").is_dir(),
        f"KEDA's models: npm install --prefix build/keda-models {KEDA_PACKAGE}",
    )
    script = KEDA_MODELS / "check.mjs"  # beside its node_modules, where imports resolve
    script.write_text((ROOT / "tests" / "integration" / "autoscaling_keda_check.mjs").read_text())
    ran = subprocess.run(
        [node, str(script)],
        input=json.dumps(objects), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def test_keda_objects_pass_keda_s_own_schemas():
    objects = [o for o in _objects("keda.yaml") if o["apiVersion"].startswith("keda.sh/")]
    assert sorted(o["kind"] for o in objects) == ["ScaledObject", "TriggerAuthentication"]
    assert _keda_verdicts(objects) == [None, None]
    # the controls: the same objects, broken, are refused
    scaled = next(o for o in objects if o["kind"] == "ScaledObject")
    wrong_type = json.loads(json.dumps(scaled))
    wrong_type["spec"]["minReplicaCount"] = "zero"
    no_target = json.loads(json.dumps(scaled))
    del no_target["spec"]["scaleTargetRef"]["name"]
    refused = _keda_verdicts([wrong_type, no_target])
    assert "minReplicaCount must be integer" in (refused[0] or ""), refused
    assert "must have required property name" in (refused[1] or ""), refused


def test_keda_and_the_adapter_run_the_documented_query_and_refer_to_what_exists():
    scaled = _one("keda.yaml", "ScaledObject")
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["query"] == QUERY
    assert trigger["metadata"]["threshold"] == "1"  # replicas = the query's answer
    auth = _one("keda.yaml", "TriggerAuthentication")
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert "bearer" in trigger["metadata"]["authModes"].split(",")
    [ref] = auth["spec"]["secretTargetRef"]
    secret = _one("keda.yaml", "Secret")
    assert ref["parameter"] == "bearerToken" and ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in secret["stringData"]
    assert auth["metadata"]["namespace"] == scaled["metadata"]["namespace"]

    adapter = yaml.safe_load(_one("hpa.yaml", "ConfigMap")["data"]["config.yaml"])
    [rule] = adapter["externalRules"]
    assert rule["metricsQuery"] == QUERY and rule["resources"] == {"namespaced": False}
    hpa = _one("hpa.yaml", "HorizontalPodAutoscaler")
    [metric] = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == rule["name"]["as"]
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    # the series the rule lists the metric by is on every scrape, demand or not
    assert rule["seriesQuery"].strip("'") == "swamp_queue_requirements_omitted"


def test_both_scale_the_statefulset_the_provisioning_makes_within_the_fleet_s_places():
    made = kubernetes(
        Build(
            url="wss://orchestrator.example:7420",
            download="https://orchestrator.example:7420/swamp.pyz",
            sha256="0" * 64,
            bootstrap="print('bootstrap')\n",
        ),
        name="gpu",
        token="gpu." + "a" * 64,
    )
    [workers] = [o for o in yaml.safe_load_all(made) if o["kind"] == "StatefulSet"]
    target = {
        "apiVersion": workers["apiVersion"],
        "kind": workers["kind"],
        "name": workers["metadata"]["name"],
    }
    scaled = _one("keda.yaml", "ScaledObject")["spec"]
    hpa = _one("hpa.yaml", "HorizontalPodAutoscaler")["spec"]
    assert scaled["scaleTargetRef"] == target and hpa["scaleTargetRef"] == target
    assert scaled["minReplicaCount"] == 0  # scale to zero
    text = (ROOT / "docs" / "autoscaling.md").read_text()
    places = int(re.search(r"--max-enrollments (\d+)", text)[1])
    assert scaled["maxReplicaCount"] <= places and hpa["maxReplicas"] <= places
    assert "--label gpu=true" in text  # the requirement's label, pinned by the token
    assert "/ 4" in QUERY and "--max-concurrency 4" in text  # S: the workers' slots


def test_prometheus_reads_the_token_from_the_secret_it_mounts():
    secret = _one("scrape.yaml", "Secret")
    [job] = yaml.safe_load((DOCS / "prometheus.yml").read_text())["scrape_configs"]
    mounted = f"/etc/prometheus/secrets/{secret['metadata']['name']}"
    assert job["authorization"]["credentials_file"] == f"{mounted}/token"
    assert job["tls_config"]["ca_file"] == f"{mounted}/ca.pem"
    assert set(secret["stringData"]) == {"token", "ca.pem"}
    assert re.fullmatch(r"prometheus\.<secret>", secret["stringData"]["token"])
