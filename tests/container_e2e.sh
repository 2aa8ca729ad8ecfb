#!/usr/bin/env bash
# The container image end to end: builds symphony:<version> with scripts/build-image.sh (a base
# made by debootstrap from the Debian archive, no other registry), starts a scheduler, a frontend
# and a backend (emulated GPU) as three containers of that image on the host network, as the
# manifests run them (non-root uid 10001, read-only root filesystem, every capability dropped,
# no privilege escalation, the runtime's default seccomp profile, the join token from a
# read-only file, transport tcp-blocking from SYMPHONY_TRANSPORT, the model list from the
# cluster.toml of deploy/base/cluster-config.yaml), serves one KServe v2 HTTP infer request and
# checks its output byte for byte against the reference output the emulated executor computes,
# then stops the containers (SIGTERM; each must exit 0) and removes them. Everything is bounded:
# readiness is polled with deadlines. Before the build it checks that every flag deploy/ passes
# is one these binaries accept (tests/deploy_validate.sh --flags-only).
#
# Needs root, debootstrap, podman and runc (Debian packages; installed with apt-get when missing)
# and the release binaries in $SYMPHONY_BIN_DIR (default target/release; tests/run.sh builds
# them). podman runs with the OCI runtime runc and the cgroupfs manager, and with the ulimits
# this process already has: in a container sandbox (this repository's CI) podman's defaults fail
# (crun refuses a cgroup v1/v2 hybrid host; raising RLIMIT_NOFILE/NPROC to podman's defaults
# needs CAP_SYS_RESOURCE).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
t_start=$(date +%s)

fail() { echo "container_e2e: FAIL: $*" >&2; exit 1; }
# shellcheck source=tests/lib/require.sh
. tests/lib/require.sh
require container_e2e root "podman's root store and debootstrap need root" test "$(id -u)" = 0 || exit 0

missing=()
for tool in debootstrap:debootstrap podman:podman runc:runc curl:curl etcd:etcd-server etcdctl:etcd-client openssl:openssl; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "container_e2e: installing ${missing[*]} from the Debian archive" >&2
  timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || { timeout 300 apt-get update -q >/dev/null && timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } \
    || fail "cannot install ${missing[*]}"
fi

bin_dir=${SYMPHONY_BIN_DIR:-$repo/target/release}
# The manifests' flags and cluster.toml keys against these very binaries (deploy_validate runs
# before the release build in tests/run.sh, so it cannot).
bash tests/deploy_validate.sh --flags-only "$bin_dir" || fail "deploy/ passes flags the daemons do not accept"
image=$(timeout 900 bash scripts/build-image.sh --bin-dir "$bin_dir") || fail "scripts/build-image.sh failed"
image=$(printf '%s\n' "$image" | tail -1)
t_image=$(date +%s)
echo "container_e2e: image $image ($((t_image - t_start)) s)"

work=$(mktemp -d "$repo/target/image/e2e.XXXXXX")
run_id=$(basename "$work" | tr -cd 'A-Za-z0-9')
names=()
etcd_pid=""
cleanup() {
  local n
  for n in "${names[@]}"; do podman rm -f -t 5 "$n" >/dev/null 2>&1 || true; done
  if [ -n "$etcd_pid" ]; then kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The join token as the Secret mounts it: a file the daemon's uid may read, nobody else.
python3 -c 'import secrets; print(secrets.token_hex(32), end="")' >"$work/token"
chown 10001:10001 "$work/token"
chmod 0400 "$work/token"
# The model list exactly as deploy/base ships it (every daemon must accept its keys).
python3 - "$repo/deploy/base/cluster-config.yaml" "$work/cluster.toml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
open(sys.argv[2], "w").write(doc["data"]["cluster.toml"])
PY
chmod 0444 "$work/cluster.toml"

nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=65536
# Hardened like the pods: see deploy/base/*.yaml's securityContext.
podman_run=(podman --cgroup-manager cgroupfs run -d --runtime runc --network host
  --ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096
  --user 10001:10001 --read-only --read-only-tmpfs=false --tmpfs "/tmp:rw,size=64m,mode=1777"
  --cap-drop ALL --security-opt no-new-privileges
  -e SYMPHONY_TRANSPORT=tcp-blocking -e NO_COLOR=1
  -v "$work/token:/etc/symphony/join-token/token:ro"
  -v "$work/cluster.toml:/etc/symphony/cluster.toml:ro")
common=(--config=/etc/symphony/cluster.toml --join-token-file=/etc/symphony/join-token/token)

# start NAME DAEMON ARGS...: runs one container (with the volumes in $mounts), prints nothing.
mounts=()
start() {
  local name="symphony-e2e-$run_id-$1"
  shift
  names+=("$name")
  "${podman_run[@]}" "${mounts[@]}" --name "$name" "$image" "$@" "${common[@]}" >/dev/null \
    || fail "podman run $name failed"
}
# ready NAME: waits (bounded) for the daemon's READY line and prints it.
ready() {
  local name="symphony-e2e-$run_id-$1" line
  for _ in $(seq 300); do
    line=$(podman logs "$name" 2>/dev/null | grep -m1 '^READY ' || true)
    [ -n "$line" ] && { echo "$line"; return 0; }
    [ "$(podman inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] || break
    sleep 0.2
  done
  podman logs "$name" >&2 || true
  fail "$1 did not print READY"
}
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }

# etcd as deploy/base/etcd.yaml runs it (one member here; Debian's etcd-server): TLS on the
# client port with client-certificate auth, certificates made as docs/operations.md says, and
# RBAC confining the schedulers' certificate to /symphony/.
free_ports() { python3 -c 'import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"; }
read -r etcd_client etcd_peer etcd_metrics sched_port <<<"$(free_ports 4)"
tls=$work/etcd-tls
mkdir -p "$tls"
(
  cd "$tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=e2e-etcd-ca \
    -keyout ca.key -out ca.crt
  for n in server client root; do
    cn=etcd usage=serverAuth,clientAuth ext="subjectAltName=DNS:localhost,IP:127.0.0.1"
    [ "$n" = client ] && cn=symphony-scheduler usage=clientAuth ext="subjectAltName=DNS:symphony-scheduler"
    [ "$n" = root ] && cn=root usage=clientAuth ext="subjectAltName=DNS:root"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" -keyout "$n.key" -out "$n.csr"
    printf '%s\nextendedKeyUsage=%s\n' "$ext" "$usage" >"$n.ext"
    openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$n.ext" -out "$n.crt"
  done
) >"$work/openssl.log" 2>&1 || { cat "$work/openssl.log" >&2; fail "openssl could not make the etcd certificates"; }
mkdir -p "$work/scheduler-tls"
cp "$tls/ca.crt" "$work/scheduler-tls/ca.crt"
cp "$tls/client.crt" "$work/scheduler-tls/tls.crt"
cp "$tls/client.key" "$work/scheduler-tls/tls.key"
chown -R 10001:10001 "$work/scheduler-tls"
chmod 0400 "$work/scheduler-tls"/*
etcd --name=etcd-0 --data-dir="$work/etcd-data" \
  --listen-client-urls="https://127.0.0.1:$etcd_client" --advertise-client-urls="https://127.0.0.1:$etcd_client" \
  --listen-peer-urls="https://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls="https://127.0.0.1:$etcd_peer" \
  --initial-cluster="etcd-0=https://127.0.0.1:$etcd_peer" --initial-cluster-state=new \
  --listen-metrics-urls="http://127.0.0.1:$etcd_metrics" \
  --cert-file="$tls/server.crt" --key-file="$tls/server.key" --trusted-ca-file="$tls/ca.crt" --client-cert-auth=true \
  --peer-cert-file="$tls/server.crt" --peer-key-file="$tls/server.key" --peer-trusted-ca-file="$tls/ca.crt" \
  --peer-client-cert-auth=true >"$work/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 150); do
  curl -fsS --max-time 1 "http://127.0.0.1:$etcd_metrics/health" 2>/dev/null | grep -q '"health":"true"' && break
  kill -0 "$etcd_pid" 2>/dev/null || { cat "$work/etcd.log" >&2; fail "etcd exited"; }
  sleep 0.2
done
ectl() { ETCDCTL_API=3 etcdctl --endpoints="https://127.0.0.1:$etcd_client" --cacert="$tls/ca.crt" --command-timeout=5s "$@"; }
root=(--cert="$tls/root.crt" --key="$tls/root.key")
# Before RBAC, so that only the TLS layer can refuse it.
if ectl --command-timeout=2s put /symphony/probe x >/dev/null 2>&1; then fail "etcd accepted a client without a certificate"; fi
{ ectl "${root[@]}" user add root --no-password && ectl "${root[@]}" user grant-role root root \
  && ectl "${root[@]}" role add symphony && ectl "${root[@]}" role grant-permission symphony readwrite /symphony/ --prefix=true \
  && ectl "${root[@]}" user add symphony-scheduler --no-password && ectl "${root[@]}" user grant-role symphony-scheduler symphony \
  && ectl "${root[@]}" auth enable; } >"$work/rbac.log" 2>&1 || { cat "$work/rbac.log" "$work/etcd.log" >&2; fail "etcd RBAC setup failed"; }
# RBAC: the schedulers' certificate only under /symphony/.
if ectl --cert="$tls/client.crt" --key="$tls/client.key" put /outside x >/dev/null 2>&1; then fail "the schedulers' certificate wrote outside /symphony/"; fi
echo "container_e2e: etcd over TLS: a client without a certificate refused, the schedulers' certificate confined to /symphony/"

mounts=(-v "$work/scheduler-tls:/etc/symphony/etcd-tls:ro")
start scheduler symphony-scheduler --listen="127.0.0.1:$sched_port" --metrics=127.0.0.1:0 \
  --etcd="https://127.0.0.1:$etcd_client" --etcd-ca=/etc/symphony/etcd-tls/ca.crt \
  --etcd-cert=/etc/symphony/etcd-tls/tls.crt --etcd-key=/etc/symphony/etcd-tls/tls.key \
  --election-listen=127.0.0.1:0
mounts=()
sched=$(ready scheduler)
control=$(field control "$sched")
sched_metrics=$(field metrics "$sched")
if [ -z "$control" ] || [ -z "$sched_metrics" ]; then fail "scheduler READY line without addresses: $sched"; fi
metric() { curl -fsS --max-time 2 "http://$sched_metrics/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
# It listens on its control port only once it leads: the peers start after that (a frontend
# that cannot reach a scheduler at start exits).
epoch=""
for _ in $(seq 300); do
  epoch=$(metric symphony_scheduler_leader_epoch || true)
  case "$epoch" in '' | 0) sleep 0.2 ;; *) break ;; esac
done
case "$epoch" in '' | 0) podman logs "symphony-e2e-$run_id-scheduler" >&2 || true; fail "the scheduler did not win the election through etcd over TLS" ;; esac
echo "container_e2e: the scheduler leads through etcd over TLS with its client certificate (epoch $epoch)"

start frontend symphony-frontend --id=0 --scheduler="$control" --http=127.0.0.1:0 --grpc=127.0.0.1:0 \
  --data-listen=127.0.0.1:0 --metrics=127.0.0.1:0
front=$(ready frontend)
http=$(field http "$front")
[ -n "$http" ] || fail "frontend READY line without http=: $front"

start backend symphony-backend --id=0 --scheduler="$control" --gpus-per-backend=1 --executor=emulated \
  --metrics=127.0.0.1:0 --connect-timeout-ms=30000
ready backend >/dev/null

# Serving once the scheduler counts the backend's GPU and the frontend says it is ready.
up=""
for _ in $(seq 300); do
  if [ "$(metric symphony_gpus_online || true)" = 1 ] && curl -fsS --max-time 2 -o /dev/null "http://$http/v2/health/ready"; then
    up=1; break
  fi
  sleep 0.2
done
[ -n "$up" ] || { for n in "${names[@]}"; do podman logs "$n" >&2 || true; done; fail "cluster not ready within 60 s"; }

# Each daemon runs as the manifests ask: uid 10001, no capabilities, a read-only root.
for n in "${names[@]}"; do
  got=$(podman exec "$n" sh -c 'id -u; grep ^CapEff /proc/1/status | cut -f2; touch /probe 2>/dev/null && echo writable || echo read-only')
  [ "$got" = "$(printf '10001\n0000000000000000\nread-only')" ] || fail "$n: uid, capabilities or root filesystem not as the manifests set them: $got"
done

# One request to the first model of the list (model id 0), its output checked against the
# reference output (dataplane/src/reference.rs: FNV-1a over the model id, the input's 8-byte
# words and its length; output byte j = hash byte j % 8 XOR j / 8).
python3 - "$http" "$work/cluster.toml" <<'PY' || fail "the infer request did not return the reference output"
import json, struct, sys, tomllib, urllib.request
addr, toml_path = sys.argv[1], sys.argv[2]
model = tomllib.load(open(toml_path, "rb"))["model"][0].split("=")[0]
values = [float((7 * i * i + 3) % 1000 - 500) for i in range(16)]
body = {"id": "container-e2e", "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": values}]}
req = urllib.request.Request(f"http://{addr}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"}, method="POST")
with urllib.request.urlopen(req, timeout=10) as r:
    status, reply = r.status, json.load(r)
M, P = (1 << 64) - 1, 0x100000001B3
fold = lambda h, x: ((h ^ x) * P) & M
raw = b"".join(struct.pack("<f", v) for v in values)
h = fold(0xCBF29CE484222325, 0)
for i in range(0, len(raw), 8):
    h = fold(h, int.from_bytes(raw[i:i + 8], "little"))
h = fold(h, len(raw)).to_bytes(8, "little")
want = [h[j % 8] ^ (j // 8) for j in range(40)]
out = reply["outputs"][0]
ok = status == 200 and reply.get("id") == "container-e2e" and out["name"] == "OUTPUT0" and out["data"] == want
print(f"container_e2e: POST /v2/models/{model}/infer -> {status}, output {'matches' if ok else 'DIFFERS from'} the reference")
if not ok:
    print(json.dumps(reply)[:2000], file=sys.stderr)
sys.exit(0 if ok else 1)
PY

# A clean stop: SIGTERM to each daemon (PID 1 of its container), each exits 0.
for n in "${names[@]}"; do
  podman stop -t 10 "$n" >/dev/null
  code=$(podman inspect -f '{{.State.ExitCode}}' "$n")
  [ "$code" = 0 ] || { podman logs "$n" >&2 || true; fail "$n exited with $code after SIGTERM"; }
done
echo "container_e2e: ok (scheduler, frontend, backend in containers; image $((t_image - t_start)) s, total $(($(date +%s) - t_start)) s)"
