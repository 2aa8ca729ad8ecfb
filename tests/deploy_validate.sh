#!/usr/bin/env bash
# Validates deploy/ offline: every manifest against the pinned Kubernetes version's OpenAPI
# schemas (PyPI kubernetes-validate, strict: unknown fields are errors; the schemas ship inside
# the package, so validating needs no cluster and no network), then the project's own rules:
# every daemon container has liveness and readiness probes, mounts the join token Secret and
# passes --join-token-file, and GPU backends request nvidia.com/gpu.
# Installs kubernetes-validate into the project's .venv (scripts/setup.sh creates it) if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
KV_PIN="kubernetes-validate==1.37.0"
K8S_VERSION="1.34.0"
venv="$PWD/.venv"
if ! "$venv/bin/python" -c 'import kubernetes_validate, sys; sys.exit(kubernetes_validate.__version__ != "1.37.0")' 2>/dev/null; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  timeout 600 "$venv/bin/python" -m pip install -q --disable-pip-version-check "$KV_PIN"
fi
"$venv/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" deploy/*.yaml deploy/secret/*.yaml
"$venv/bin/python" - deploy/*.yaml <<'PY'
import sys, yaml
errors, daemons = [], 0
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if not doc or doc.get("kind") not in ("StatefulSet", "Deployment", "DaemonSet"):
            continue
        name = f'{path}: {doc["kind"]}/{doc["metadata"]["name"]}'
        spec = doc["spec"]["template"]["spec"]
        for c in spec["containers"]:
            for probe in ("livenessProbe", "readinessProbe"):
                if probe not in c:
                    errors.append(f"{name}: container {c['name']} has no {probe}")
            if not c.get("command", [""])[0].startswith("symphony"):
                continue
            daemons += 1
            args = c.get("args", [])
            if not any(a.startswith("--join-token-file=") for a in args):
                errors.append(f"{name}: no --join-token-file")
            secrets = {v["name"] for v in spec.get("volumes", []) if v.get("secret", {}).get("secretName") == "symphony-join-token"}
            if not any(m["name"] in secrets for m in c.get("volumeMounts", [])):
                errors.append(f"{name}: the join token Secret is not mounted")
            if c["command"][0] == "symphony-backend" and "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}):
                errors.append(f"{name}: backend without an nvidia.com/gpu limit")
if daemons != 3:
    errors.append(f"expected the 3 daemons (scheduler, frontend, backend), found {daemons}")
for e in errors:
    print("deploy_validate:", e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
echo "deploy_validate: deploy/ is valid for Kubernetes $K8S_VERSION"
