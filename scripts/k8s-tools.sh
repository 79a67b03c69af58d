#!/usr/bin/env bash
# Ensure the Kubernetes tools the deployment tests run, all on loopback: etcd (Debian's
# etcd-server), kube-apiserver and kubectl v$K8S_VERSION and helm $HELM_VERSION, built once from
# their Go modules (checked against the Go checksum database) into .tools/k8s/bin (~6 min on 2
# cores the first time; nothing to do later). scripts/k8s-dryrun.sh and tests/test_helm.py use
# them. Versions are pinned; bumping one rebuilds it.
set -euo pipefail
K8S_VERSION=1.36.3
HELM_VERSION=v3.22.0
# What .tools/k8s/bin/helm.version records: the version, built with the Kubernetes version
# defaults a released helm has (a change to how it is built rebuilds it).
HELM_STAMP="$HELM_VERSION+kube-defaults"

cd "$(dirname "$0")/.."
BIN=$PWD/.tools/k8s/bin
mkdir -p "$BIN"

if ! command -v etcd >/dev/null; then
  echo "k8s-tools.sh: installing etcd-server (Debian)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
fi

built() {  # is $1 in .tools/k8s/bin, built from version $2?
  [ -x "$BIN/$1" ] && [ "$(cat "$BIN/$1.version" 2>/dev/null)" = "$2" ]
}

if built kube-apiserver "$K8S_VERSION" && built kubectl "$K8S_VERSION" && built helm "$HELM_STAMP"; then
  exit 0
fi
GO=$(bash scripts/go-toolchain.sh)
export GOTOOLCHAIN=local GO111MODULE=on
work=$(mktemp -d "$PWD/.tools/k8s-build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
log=$work/build.log
fail() {
  tail -n 30 "$log" >&2
  echo "k8s-tools.sh: $1 failed (the lines above are the end of its log)" >&2
  exit 1
}

if ! built kube-apiserver "$K8S_VERSION" || ! built kubectl "$K8S_VERSION"; then
  echo "k8s-tools.sh: building kube-apiserver and kubectl v$K8S_VERSION (once, ~5 min)" >&2
  # k8s.io/kubernetes points its k8s.io/* requirements at ./staging with replace directives:
  # build a copy as the main module with them pinned to the published v0.x of the release.
  (
    cd "$work" &&
    dir=$("$GO" mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c \
          'import json, sys; d = json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))') &&
    cp -r "$dir" k8s && chmod -R u+w k8s && cd k8s &&
    rm -f go.work go.work.sum &&
    sed -i -E '/=> \.\/staging\//d; s#^(\s+k8s\.io/[a-z0-9-]+) v0\.0\.0$#\1 v0.'"${K8S_VERSION#1.}"'#' go.mod &&
    minor=$(echo "$K8S_VERSION" | cut -d. -f2) &&
    ld="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION" &&
    ld="$ld -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" &&
    ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION" &&
    ld="$ld -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor" &&
    for c in kube-apiserver kubectl; do
      GOFLAGS="-mod=mod -buildvcs=false" nice -n 10 "$GO" build -trimpath -ldflags "$ld" -o "$work/$c" "./cmd/$c" || exit 1
    done
  ) >"$log" 2>&1 || fail "building kube-apiserver and kubectl"
  for c in kube-apiserver kubectl; do
    install -m 0755 "$work/$c" "$BIN/$c"
    echo "$K8S_VERSION" >"$BIN/$c.version"
  done
fi

if ! built helm "$HELM_STAMP"; then
  echo "k8s-tools.sh: building helm $HELM_VERSION (once, ~2 min)" >&2
  # As helm's Makefile does: the Kubernetes version `helm template` and `helm lint` assume
  # (without --kube-version) is the one of its client-go, 0.N -> 1.N.
  (
    cd "$work" &&
    gomod=$("$GO" mod download -json "helm.sh/helm/v3@$HELM_VERSION" | python3 -c \
            'import json, sys; d = json.load(sys.stdin); print(d.get("GoMod") or sys.exit(d.get("Error")))') &&
    minor=$(sed -nE 's#^\s*k8s\.io/client-go v0\.([0-9]+)\..*#\1#p' "$gomod") &&
    [ -n "$minor" ] &&
    ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" &&
    for pkg in pkg/lint/rules pkg/chartutil; do
      ld="$ld -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor"
    done &&
    GOBIN=$work GOFLAGS=-buildvcs=false nice -n 10 "$GO" install -trimpath -ldflags "$ld" \
      "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  ) >"$log" 2>&1 || fail "building helm"
  install -m 0755 "$work/helm" "$BIN/helm"
  echo "$HELM_STAMP" >"$BIN/helm.version"
fi
