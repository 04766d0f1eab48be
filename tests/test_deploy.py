"""The deployment files in deploy/ are well formed and agree with the code, without Docker,
systemd or a Kubernetes cluster: every YAML document parses, every node configuration they carry
loads through `node.config.load_config` as the node would load it, the three nodes of each
layout name each other as peers, and the image and unit keep the properties docs/operations.md
promises (non-root, `xr node run`, a /readyz health check; hardening, graceful stop)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from node.config import ConfigError, NodeConfig, load_config

REPOSITORY = Path(__file__).resolve().parent.parent
DEPLOY = REPOSITORY / "deploy"


def _yaml_documents(path: Path) -> list[Any]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def _load(text: str, tmp_path: Path) -> NodeConfig:
    """A node configuration as the node loads it, with its secret file replaced by a local one."""
    secret = tmp_path / "cluster_secret"
    secret.write_text("test-secret-0123456789\n")
    path = tmp_path / "node.toml"
    path.write_text(text)
    return load_config(path=path, environ={}, overrides={"raft.cluster_secret_file": str(secret)})


def _assert_a_cluster(configs: list[NodeConfig]) -> None:
    """Each node's Raft address is written exactly so in every other node's peers."""
    addresses = [config.raft.self_address for config in configs]
    assert len(set(addresses)) == len(configs)
    for config in configs:
        assert config.raft.cluster_secret, "Raft off loopback needs the cluster secret"
        assert sorted(config.raft.peers) == sorted(
            address for address in addresses if address != config.raft.self_address
        )
    assert len({config.region.name for config in configs}) == len(configs)


@pytest.mark.parametrize(
    "path", sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml")), ids=str
)
def test_yaml__parses(path: Path) -> None:
    assert _yaml_documents(path)


def test_grafana_dashboard__parses() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "xr.json").read_text())
    assert dashboard["panels"]


def test_compose__three_regions_whose_configurations_load(tmp_path: Path) -> None:
    compose_dir = DEPLOY / "compose"
    (compose,) = _yaml_documents(compose_dir / "docker-compose.yml")
    assert len(compose["services"]) == 3
    configs = []
    for name, service in compose["services"].items():
        (config_ref,) = service["configs"]
        source = compose["configs"][config_ref["source"]]["file"]
        config = _load((compose_dir / source).read_text(), tmp_path)
        assert config.region.name == name
        assert config.raft.self_address == f"{name}:7001"
        assert config.http.advertise_address == f"{name}:8700"
        assert service["secrets"] == ["cluster_secret"]
        assert any(volume.endswith(":/var/lib/xr") for volume in service["volumes"])
        configs.append(config)
    _assert_a_cluster(configs)
    assert compose["secrets"]["cluster_secret"]["file"] == "./cluster_secret"
    # A node stopped by SIGTERM exits 0, and `on-failure` never restarted one after the Docker
    # daemon restarted or the host rebooted.
    assert compose["x-node"]["restart"] == "unless-stopped"
    assert "chmod 0644" not in (compose_dir / "docker-compose.yml").read_text()


def test_kubernetes__statefulset_configurations_load(tmp_path: Path) -> None:
    documents = [
        document
        for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for document in _yaml_documents(path)
    ]
    by_kind: dict[str, list[Any]] = {}
    for document in documents:
        by_kind.setdefault(document["kind"], []).append(document)
    (statefulset,) = by_kind["StatefulSet"]
    (config_map,) = by_kind["ConfigMap"]
    replicas = statefulset["spec"]["replicas"]
    assert replicas == 3
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    configs = [
        _load(config_map["data"][f"xr-{ordinal}.toml"], tmp_path) for ordinal in range(replicas)
    ]
    _assert_a_cluster(configs)
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    (pdb,) = by_kind["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1
    headless = [
        service for service in by_kind["Service"] if service["spec"].get("clusterIP") == "None"
    ]
    assert [service["metadata"]["name"] for service in headless] == [
        statefulset["spec"]["serviceName"]
    ]
    assert headless[0]["spec"]["publishNotReadyAddresses"] is True
    region_services = {
        service["spec"]["selector"].get("statefulset.kubernetes.io/pod-name")
        for service in by_kind["Service"]
    }
    assert {f"xr-{ordinal}" for ordinal in range(replicas)} <= region_services
    (secret,) = by_kind["Secret"]
    assert "cluster_secret" in secret["stringData"]
    # Applied unedited, the example's placeholder was accepted as the cluster secret.
    placeholder = tmp_path / "placeholder"
    placeholder.write_text(secret["stringData"]["cluster_secret"])
    with pytest.raises(ConfigError, match="placeholder of an example file"):
        load_config(
            path=None,
            environ={},
            overrides={
                "region.name": "r0",
                "raft.address": "127.0.0.1:7001",
                "data_dir": str(tmp_path),
                "raft.cluster_secret_file": str(placeholder),
            },
        )
    kustomization = _yaml_documents(DEPLOY / "k8s" / "kustomization.yaml")[0]
    assert sorted(kustomization["resources"]) == sorted(
        path.name for path in (DEPLOY / "k8s").glob("*.yaml") if path.name != "kustomization.yaml"
    )


def test_dockerfile__non_root_xr_node_run_with_a_readyz_health_check() -> None:
    text = (DEPLOY / "container" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim|^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    assert re.search(r"^USER xr$", text, re.M)
    # tini as PID 1: it passes signals on and reaps orphaned processes.
    assert '\nENTRYPOINT ["tini", "--", "xr", "node", "run"]\n' in text
    assert re.search(r"^ && apt-get install --yes --no-install-recommends tini \\$", text, re.M)
    assert re.search(r"^HEALTHCHECK .*\n.*/readyz", text, re.M)


def test_systemd_unit__hardened_with_a_graceful_stop() -> None:
    settings: dict[str, str] = {}
    for line in (DEPLOY / "systemd" / "xr-node.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            name, _, value = line.partition("=")
            settings[name] = value
    assert settings["User"] == "xr"
    assert settings["NoNewPrivileges"] == "yes"
    assert settings["ProtectSystem"] == "strict"
    assert settings["ReadWritePaths"] == "/var/lib/xr"
    assert settings["Restart"] == "on-failure"
    assert settings["KillSignal"] == "SIGTERM"
    assert settings["ExecStart"].endswith("xr node run --config /etc/xr/node.toml")


def test_compose_region_files__are_toml_with_a_data_dir() -> None:
    for path in sorted((DEPLOY / "compose").glob("*.toml")):
        assert tomllib.loads(path.read_text())["data_dir"] == "/var/lib/xr"
