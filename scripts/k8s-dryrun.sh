#!/usr/bin/env bash
# Server-side dry run of kustomize trees against a real kube-apiserver on 127.0.0.1.
#
#   scripts/k8s-dryrun.sh [--psa restricted|baseline|privileged] [--crd FILE]... DIR...
#
# The project's copy of the workplace's shared/tools/k8s-dryrun.sh, so that CI (a clone with
# nothing beside it) runs it too; the tools come from scripts/k8s-tools.sh (.tools/k8s/bin).
#
# Each DIR is rendered with `kubectl kustomize`; its Namespaces are created for real (labelled
# with Pod Security Admission `enforce=LEVEL` when --psa is given), CRD files given with --crd are
# installed for real, then the whole rendering and a Pod built from each Deployment's pod template
# are applied with --dry-run=server. A Pod dry run is what PSA judges: a Deployment that violates
# it is accepted with a warning and then never gets a pod. Exit status: 0 when every dry run
# passed with no PodSecurity warning.
#
# First run installs etcd (Debian etcd-server) and builds kube-apiserver + kubectl from the Go
# module proxy into .tools/k8s/bin (scripts/k8s-tools.sh, ~5 min on 2 cores); later runs start in
# ~3 s. Started processes are stopped by PID on exit.
set -euo pipefail
PY=${PYTHON:-python3}   # needs PyYAML: e.g. PYTHON=.venv/bin/python
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=$ROOT/.tools/k8s
PSA=""
CRDS=()
DIRS=()
while [ $# -gt 0 ]; do
  case $1 in
    --psa) PSA=$2; shift 2 ;;
    --crd) CRDS+=("$(realpath "$2")"); shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) DIRS+=("$(realpath "$1")"); shift ;;
  esac
done
[ ${#DIRS[@]} -gt 0 ] || { sed -n 2,18p "$0"; exit 2; }

build() { bash "$ROOT/scripts/k8s-tools.sh"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

build
RUN=$(mktemp -d)
PIDS=()
cleanup() {  # the API server first (it keeps retrying a dead etcd), then etcd; SIGKILL after 10 s
  local i p
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    p=${PIDS[i]}
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$RUN"
}
trap cleanup EXIT
EP=$(free_port); PP=$(free_port); AP=$(free_port); TOKEN=dryrun-$RANDOM$RANDOM
openssl genrsa -out "$RUN/sa.key" 2048 2>/dev/null
openssl rsa -in "$RUN/sa.key" -pubout -out "$RUN/sa.pub" 2>/dev/null
echo "$TOKEN,admin,admin,system:masters" > "$RUN/tokens.csv"
etcd --name dryrun --data-dir "$RUN/etcd" --listen-client-urls "http://127.0.0.1:$EP" \
  --advertise-client-urls "http://127.0.0.1:$EP" --listen-peer-urls "http://127.0.0.1:$PP" \
  --initial-advertise-peer-urls "http://127.0.0.1:$PP" --initial-cluster "dryrun=http://127.0.0.1:$PP" \
  > "$RUN/etcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 30); do curl -sf "http://127.0.0.1:$EP/health" >/dev/null && break; sleep 1; done
"$CACHE/bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$EP" --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 --secure-port="$AP" --cert-dir="$RUN/certs" \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$RUN/sa.pub" \
  --service-account-signing-key-file="$RUN/sa.key" --service-cluster-ip-range=10.96.0.0/24 \
  --authorization-mode=AlwaysAllow --token-auth-file="$RUN/tokens.csv" > "$RUN/apiserver.log" 2>&1 &
PIDS+=($!)
KC=("$CACHE/bin/kubectl" --server="https://127.0.0.1:$AP" --token="$TOKEN" --insecure-skip-tls-verify --cache-dir="$RUN/kc")
for _ in $(seq 120); do "${KC[@]}" get --raw /readyz >/dev/null 2>&1 && break; sleep 1; done

for crd in "${CRDS[@]}"; do
  "${KC[@]}" apply --server-side -f "$crd" >/dev/null
  "${KC[@]}" wait --for condition=established --timeout=60s -f "$crd" >/dev/null
done

status=0
for dir in "${DIRS[@]}"; do
  echo "=== $dir"
  out="$RUN/$(basename "$dir")-$RANDOM"
  mkdir -p "$out"
  "${KC[@]}" kustomize "$dir" > "$out/all.yaml"
  "$PY" - "$out" <<'PY'
import sys, os, yaml
out = sys.argv[1]
docs = [d for d in yaml.safe_load_all(open(os.path.join(out, "all.yaml"))) if d]
ns = [d for d in docs if d.get("kind") == "Namespace"]
yaml.safe_dump_all(ns, open(os.path.join(out, "namespaces.yaml"), "w"))
for d in docs:
    if d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet"):
        t = d["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": d["metadata"]["name"] + "-template",
                            "namespace": d["metadata"].get("namespace", "default"),
                            "labels": (t.get("metadata") or {}).get("labels", {})},
               "spec": t["spec"]}
        yaml.safe_dump(pod, open(os.path.join(out, f"pod-{d['metadata']['name']}.yaml"), "w"))
PY
  if [ -s "$out/namespaces.yaml" ]; then
    "${KC[@]}" apply -f "$out/namespaces.yaml" >/dev/null
    for n in $("$PY" -c "import yaml,sys; [print(d['metadata']['name']) for d in yaml.safe_load_all(open('$out/namespaces.yaml')) if d]"); do
      [ -n "$PSA" ] && "${KC[@]}" label --overwrite ns "$n" "pod-security.kubernetes.io/enforce=$PSA" >/dev/null
      "${KC[@]}" -n "$n" get sa default >/dev/null 2>&1 || "${KC[@]}" -n "$n" create sa default >/dev/null
    done
  fi
  for f in "$out/all.yaml" "$out"/pod-*.yaml; do
    [ -e "$f" ] || continue
    echo "--- dry run: $(basename "$f")"
    if ! "${KC[@]}" apply --dry-run=server -f "$f" > "$out/res" 2>&1; then status=1; fi
    cat "$out/res"
    grep -q "PodSecurity" "$out/res" && status=1
  done
done
[ $status -eq 0 ] && echo "k8s-dryrun: every object accepted${PSA:+ under PSA $PSA}" || echo "k8s-dryrun: rejections or PodSecurity warnings above"
exit $status
