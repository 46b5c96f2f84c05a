"""``scripts/check_deploy.py`` (in ``make lint``): deploy/ as committed passes, and each kind of mistake in a
copy of it is one located line: hadolint on the Containerfile, the compose specification's schema,
``systemd-analyze verify`` and ``security``, the Kubernetes schemas (strict), the prometheus-operator's
ServiceMonitor type, references between manifests, and the mcpipe configs they carry."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts/check_deploy.py"


def check(root: Path, only: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), "--only", only],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.returncode, done.stdout.splitlines()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy", ignore=shutil.ignore_patterns("secrets.env"))
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} is not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("only", ["container", "compose", "systemd", "kubernetes"])
def test_deploy_as_committed_passes_every_check(only: str) -> None:
    assert check(ROOT, only) == (0, [f"deploy: ok ({only})"])


def test_hadolint_reports_an_apt_install_that_brings_recommended_packages(tree: Path) -> None:
    edit(tree / "deploy/container/Containerfile", "install -y --no-install-recommends", "install -y")
    status, lines = check(tree, "container")
    assert status == 1
    assert any("DL3015" in line and "Containerfile:" in line for line in lines), lines


def test_a_compose_file_off_the_specification_is_located(tree: Path) -> None:
    edit(tree / "deploy/compose/compose.yaml", "    stop_grace_period: 45s\n", "    stop_grace: 45s\n")
    status, lines = check(tree, "compose")
    assert status == 1
    assert any("stop_grace" in line for line in lines), lines


def test_the_config_compose_mounts_is_read_by_mcpipe(tree: Path) -> None:
    edit(tree / "deploy/compose/mcpipe.toml", "timeout_ms = 2000", "timeout = 2000")
    status, lines = check(tree, "compose")
    assert status == 1
    assert any("services.mcpipe: mcpipe config:" in line and "store.timeout" in line for line in lines), lines


def test_a_unit_setting_systemd_cannot_parse_fails_verify(tree: Path) -> None:
    edit(tree / "deploy/systemd/mcpipe.service", "Restart=on-failure", "Restart=sometimes")
    status, lines = check(tree, "systemd")
    assert status == 1
    assert any("mcpipe.service:" in line and "sometimes" in line for line in lines), lines


def test_a_service_without_its_hardening_is_too_exposed(tree: Path) -> None:
    unit = tree / "deploy/systemd/mcpipe.service"
    unit.write_text("".join(line for line in unit.read_text().splitlines(True) if not line.startswith("Protect")))
    status, lines = check(tree, "systemd")
    assert status == 1
    assert any("exposure above 2.0" in line for line in lines), lines


def test_an_unknown_field_of_a_deployment_is_refused_strictly(tree: Path) -> None:
    edit(tree / "deploy/kubernetes/mcpipe.yaml", "  replicas: 2\n", "  replica: 2\n")
    status, lines = check(tree, "kubernetes")
    assert status == 1
    assert any(line.startswith("Deployment/mcpipe: Kubernetes 1.29:") and "replica" in line for line in lines), lines


def test_a_service_monitor_field_the_operator_does_not_have_is_refused(tree: Path) -> None:
    edit(tree / "deploy/kubernetes/servicemonitor.yaml", "      scrapeTimeout: 10s\n", "      scrape_timeout: 10s\n")
    status, lines = check(tree, "kubernetes")
    assert status == 1
    assert any(line.startswith("ServiceMonitor/mcpipe: spec.endpoints.0:") for line in lines), lines


def test_a_selector_that_selects_nothing_and_a_probe_on_a_missing_port_are_found(tree: Path) -> None:
    manifests = tree / "deploy/kubernetes/mcpipe.yaml"
    edit(
        manifests,
        "  minAvailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: mcpipe\n",
        "  minAvailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: mcpype\n",
    )
    edit(
        manifests,
        "              path: /healthz\n              port: http\n            periodSeconds: 5",
        "              path: /healthz\n              port: web\n            periodSeconds: 5",
    )
    status, lines = check(tree, "kubernetes")
    assert status == 1
    assert any(line.startswith("PodDisruptionBudget/mcpipe: selects no pod") for line in lines), lines
    assert "Deployment/mcpipe: container mcpipe: readinessProbe port web is no port of it" in lines


def test_the_config_map_s_mcpipe_config_is_read_by_mcpipe_with_the_secret_s_variables(tree: Path) -> None:
    edit(tree / "deploy/kubernetes/mcpipe.toml", 'env = "MCPIPE_TOKEN_METRICS"', 'env = "MCPIPE_TOKEN_PROMETHEUS"')
    status, lines = check(tree, "kubernetes")
    assert status == 1
    assert any(
        "ConfigMap mcpipe-config: mcpipe config:" in line and "MCPIPE_TOKEN_PROMETHEUS" in line for line in lines
    ), lines


def test_a_kustomization_feature_the_check_does_not_render_is_refused(tree: Path) -> None:
    path = tree / "deploy/kubernetes/kustomization.yaml"
    path.write_text(path.read_text() + "commonAnnotations:\n  team: tools\n")
    status, lines = check(tree, "kubernetes")
    assert status == 1
    assert any("`commonAnnotations` is beyond what this check renders" in line for line in lines), lines


def test_a_variable_from_a_secret_key_that_is_not_there_is_found(tree: Path) -> None:
    edit(
        tree / "deploy/kubernetes/redis.yaml",
        "                  key: REDIS_PASSWORD",
        "                  key: REDIS_PASS",
    )
    status, lines = check(tree, "kubernetes")
    assert status == 1
    assert any("REDIS_PASSWORD is mcpipe-secrets/REDIS_PASS, in no Secret" in line for line in lines), lines
