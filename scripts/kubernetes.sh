#!/usr/bin/env bash
# Builds a real Kubernetes (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet) from the Go module proxy, once per version, into
# a cache directory outside the work tree (issue 23's test cluster). Later
# runs find the binaries and do nothing. Prints the binaries' directory.
#
# `go install k8s.io/kubernetes/cmd/...` does not work: kubernetes' go.mod
# replaces its staging modules (k8s.io/api, k8s.io/client-go, ...) with
# local paths. A wrapper module requires k8s.io/kubernetes and replaces
# each staging module with its published v0.X.Y instead; the versions are
# stamped with -ldflags, or the servers report v0.0.0.
#
# Also builds kwok (simulated nodes for `kube-cluster.sh start-kwok`) into
# the same bin/ and copies its "fast" stage definitions (node-initialize,
# node-heartbeat-with-lease, pod-ready/complete/delete, from the kwok
# module's kustomize/stage) into kwok-stages/; kwok is passed them with -c.
#
# Cold, on 2 cores: ~10 minutes (apiserver ~500 s, the rest ~130 s), kwok
# a few minutes more.
set -euo pipefail
VERSION=${KUBERNETES_VERSION:-1.34.4}
KWOK_VERSION=${KWOK_VERSION:-0.8.0}
CACHE=${VCDN_KUBERNETES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vcdn/kubernetes-$VERSION}
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
KWOK_STAGES=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)

have_kubernetes() { for b in "${BINS[@]}"; do [[ -x "$CACHE/bin/$b" ]] || return 1; done; }
have_kwok() {
  [[ -x "$CACHE/bin/kwok" ]] || return 1
  for s in "${KWOK_STAGES[@]}"; do [[ -f "$CACHE/kwok-stages/${s##*/}" ]] || return 1; done
}
if [[ ${1:-} == --built ]]; then have_kubernetes && have_kwok; exit; fi
if have_kubernetes && have_kwok; then echo "$CACHE/bin"; exit 0; fi
# One build at a time (the test command starts one in the background; a
# test run by hand meanwhile waits for it).
mkdir -p "$(dirname "$CACHE")"
exec 9>"$CACHE.lock"
if ! flock -n 9; then
  echo "== another build of Kubernetes $VERSION is running; waiting for it" >&2
  flock 9
fi
if have_kubernetes && have_kwok; then echo "$CACHE/bin"; exit 0; fi

GO=$(command -v go || echo /usr/local/go/bin/go)
[[ -x "$GO" ]] || { echo "kubernetes.sh: needs Go 1.24 or later (the Go toolchain)" >&2; exit 1; }

# kwok v0.8.0 wants Go 1.26 (an older go fetches that toolchain itself).
build_kwok() {
  echo "== building kwok $KWOK_VERSION" >&2
  mkdir -p "$CACHE/bin" "$CACHE/kwok-stages"
  local dir
  dir=$(cd / && GOFLAGS= "$GO" mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  (cd / && GOFLAGS= CGO_ENABLED=0 GOBIN="$CACHE/bin" "$GO" install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION") >&2
  for s in "${KWOK_STAGES[@]}"; do install -m 644 "$dir/kustomize/stage/$s" "$CACHE/kwok-stages/"; done
  "$CACHE/bin/kwok" --version >&2
}
if have_kubernetes; then build_kwok; echo "$CACHE/bin"; exit 0; fi

SRC="$CACHE/src"
rm -rf "$SRC" && mkdir -p "$SRC" "$CACHE/bin"
cd "$SRC"
export GOFLAGS=-mod=mod CGO_ENABLED=0
echo "== kubernetes $VERSION: resolving its staging modules" >&2
GOMOD=$("$GO" mod download -json "k8s.io/kubernetes@v$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
minor=${VERSION#*.}; minor=${minor%%.*}
staging=$(sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$GOMOD" | grep -v -e sample-cli-plugin -e sample-controller)
{
  echo "module vcdn.local/kubernetes-build"
  echo
  echo "go 1.24"
  echo
  echo "require k8s.io/kubernetes v$VERSION"
  echo
  echo "replace ("
  for m in $staging; do echo "	$m => $m v0.${VERSION#*.}"; done
  echo ")"
} > go.mod
{
  echo "//go:build tools"
  echo
  echo "package tools"
  echo
  echo "import ("
  for b in "${BINS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
  echo ")"
} > tools.go
"$GO" mod tidy >&2
LDFLAGS=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $p.gitVersion=v$VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
for b in "${BINS[@]}"; do
  echo "== building $b $VERSION" >&2
  # Whole binaries only: a build cut short leaves none.
  "$GO" build -trimpath -ldflags "-s -w$LDFLAGS" -o "$CACHE/bin/$b.part" "k8s.io/kubernetes/cmd/$b" >&2
  mv "$CACHE/bin/$b.part" "$CACHE/bin/$b"
done
"$CACHE/bin/kube-apiserver" --version >&2
have_kwok || build_kwok
echo "$CACHE/bin"
