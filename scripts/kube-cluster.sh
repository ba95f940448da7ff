#!/usr/bin/env bash
# A real single-node Kubernetes for issue 23's tests, started as root from
# what scripts/kubernetes.sh built and Debian's etcd, containerd, runc and
# CNI plugins: `kube-cluster.sh start DIR` starts etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, and containerd with kubelet in a
# mount namespace of their own (so /run, /var/lib and /var/log of the host
# are not touched), waits for the node to be Ready and writes
# DIR/kubeconfig; `kube-cluster.sh stop DIR` stops all of it and removes
# what it made. `image DIR NAME:TAG ROOTFS` imports a one-layer image made
# from a directory (no registry: pods use imagePullPolicy Never); `import
# DIR ARCHIVE` imports a docker-archive (what `vcdn image` writes).
#
# `kube-cluster.sh start-kwok DIR NODES` starts the same control plane
# without kubelet and containerd, creates NODES nodes kwok-node-0.. through
# the API (label type=kwok; allocatable cpu 4, memory 8Gi, pods 110; a /24
# podCIDR each from 10.128.0.0/14) and runs kwok (scripts/kubernetes.sh
# builds it) managing them: they go Ready, pods bound to them go Running and
# Ready with an IP from their node's podCIDR, and nothing executes. Waits
# for all NODES Ready and writes DIR/kubeconfig; `stop DIR` stops it too.
#
# Environment: KUBE_PORT=16443 (apiserver; 17443 for start-kwok, so both
# can run side by side; etcd, controller-manager, scheduler and kubelet use
# the next ones).
set -euo pipefail
cmd=${1:?usage: kube-cluster.sh start|start-kwok|stop|image DIR ...}
DIR=$(mkdir -p "${2:?DIR}" && cd "$2" && pwd)
BIN=${KUBE_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/vcdn/kubernetes-1.34.4/bin}
if [[ $cmd == start-kwok ]]; then PORT=${KUBE_PORT:-17443}; else PORT=${KUBE_PORT:-16443}; fi
ETCD=$((PORT + 1)) ETCD_PEER=$((PORT + 2)) KCM=$((PORT + 3)) SCHED=$((PORT + 4)) KUBELET=$((PORT + 5))
NODE=vcdn-node
# Debian's etcd 3.4.23 lacks what the apiserver needs for streaming lists
# (RequestWatchProgress), yet with WatchList on it turns every watch from
# resourceVersion "" or "0" with bookmarks into one and fails it (HTTP 500
# "a watch stream was requested by the client but the required storage
# feature RequestWatchProgress is disabled"): clients whose caches rely on
# such watches (kwok's client-go) go stale. Legacy watches instead. For the
# same reason etcd sends watch progress notifications every 100 ms (a
# precaution: the apiserver serves consistent lists from its watch cache
# once the cache has caught up with etcd's revision, which otherwise only
# an event of the same resource tells it).
APISERVER_FLAGS=(--feature-gates WatchList=false) KCM_FLAGS=() SCHED_FLAGS=()
log() { echo "[kube-cluster $(date +%H:%M:%S)] $*" >&2; }

stop() {
  for p in "$DIR"/*.pid; do
    [[ -f $p ]] || continue
    local pid; pid=$(cat "$p")
    # The node's processes run in their own process group.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  sleep 1
  for p in "$DIR"/*.pid; do
    [[ -f $p ]] || continue
    local pid; pid=$(cat "$p")
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    rm -f "$p"
  done
  # A kwok cluster (DIR/kwok-cluster) has no node of its own: it leaves the
  # host's pods, cgroups and bridge (a real cluster's beside it) alone.
  local node=1; [[ -f "$DIR/kwok-cluster" ]] && node=0
  # Pods' processes (in kubelet's kubepods cgroups; killing their shims
  # would orphan them), then the shims and runc of this cluster, then the
  # cgroups kubelet made.
  for f in /proc/[0-9]*/cgroup; do
    ((node)) || break
    if grep -q ':/kubepods' "$f" 2>/dev/null; then
      local pid=${f#/proc/}; kill -KILL "${pid%/cgroup}" 2>/dev/null || true
    fi
  done
  pkill -KILL -f -- "$DIR/" 2>/dev/null || true
  sleep 0.2
  for c in /sys/fs/cgroup/*/kubepods; do
    ((node)) || break
    [[ -d $c ]] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  ((node)) && { ip link del cni-vcdn 2>/dev/null || true; }
  [[ -f "$DIR/sysctl.saved" ]] && sysctl -q -p "$DIR/sysctl.saved" >/dev/null 2>&1 || true
}

image() {
  local name=${3:?NAME:TAG} rootfs=${4:?ROOTFS}
  local t; t=$(mktemp -d)
  tar -C "$rootfs" -cf "$t/layer.tar" .
  local diff; diff=sha256:$(sha256sum "$t/layer.tar" | cut -d' ' -f1)
  local entry=${ENTRYPOINT:-'["/pause"]'}
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s},"rootfs":{"type":"layers","diff_ids":["%s"]}}' "$entry" "$diff" > "$t/config.json"
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$name" > "$t/manifest.json"
  tar -C "$t" -cf "$t/image.tar" config.json manifest.json layer.tar
  ctr --address "$DIR/run/containerd/containerd.sock" -n k8s.io images import "$t/image.tar" >&2
  rm -rf "$t"
}

# Imports a docker-archive (`vcdn image --out`) into the node's containerd.
import_archive() {
  local tar=${3:?usage: kube-cluster.sh import DIR ARCHIVE}
  ctr --address "$DIR/run/containerd/containerd.sock" -n k8s.io images import "$tar" >&2
}

need() {
  for b in "$@"; do
    [[ -x "$BIN/$b" ]] || { echo "kube-cluster.sh: no $BIN/$b; run scripts/kubernetes.sh" >&2; exit 1; }
  done
}

# kubeconfig FILE USER TOKEN: the cluster's API as USER (owner-only file).
kubeconfig() {
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: vcdn-test
  cluster: {server: "https://127.0.0.1:$PORT", certificate-authority: "$DIR/pki/ca.crt"}
users:
- name: $2
  user: {token: "$3"}
contexts:
- name: vcdn-test
  context: {cluster: vcdn-test, user: $2}
current-context: vcdn-test
EOF
  chmod 600 "$1"
}

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler; DIR/kubeconfig
# (admin) and DIR/kubeconfig-vcdn (user vcdn, rights only from RBAC bindings).
control_plane() {
  mkdir -p "$DIR/pki" "$DIR/etcd" "$DIR/log"
  cd "$DIR/pki"
  if [[ ! -f ca.crt ]]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=vcdn-test-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default\n' > san.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 2 -extfile san.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    TOKEN=$(openssl rand -hex 24)
    # admin (system:masters), and vcdn, with no right until a binding
    # gives it some (deploy/kubernetes/rbac.json).
    printf '%s,admin,admin,system:masters\n%s,vcdn,vcdn\n' "$TOKEN" "$(openssl rand -hex 24)" > tokens.csv
  fi
  TOKEN=$(sed -n 1p tokens.csv | cut -d, -f1)
  kubeconfig "$DIR/kubeconfig" admin "$TOKEN"
  kubeconfig "$DIR/kubeconfig-vcdn" vcdn "$(sed -n 2p tokens.csv | cut -d, -f1)"
  cd "$DIR"

  log "etcd on 127.0.0.1:$ETCD"
  setsid etcd --data-dir "$DIR/etcd" --name vcdn-test \
    --listen-client-urls "http://127.0.0.1:$ETCD" --advertise-client-urls "http://127.0.0.1:$ETCD" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "vcdn-test=http://127.0.0.1:$ETCD_PEER" \
    --experimental-watch-progress-notify-interval 100ms > "$DIR/log/etcd.log" 2>&1 &
  echo $! > "$DIR/etcd.pid"

  log "kube-apiserver on https://127.0.0.1:$PORT"
  setsid "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$PORT" \
    --tls-cert-file pki/apiserver.crt --tls-private-key-file pki/apiserver.key --client-ca-file pki/ca.crt \
    --token-auth-file pki/tokens.csv --authorization-mode Node,RBAC \
    --service-account-key-file pki/sa.pub --service-account-signing-key-file pki/sa.key \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/16 \
    --allow-privileged=true "${APISERVER_FLAGS[@]}" > "$DIR/log/apiserver.log" 2>&1 &
  echo $! > "$DIR/apiserver.pid"
  for _ in $(seq 1 300); do
    curl -sf --cacert pki/ca.crt -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$PORT/readyz" >/dev/null && break
    sleep 0.1
  done
  curl -sf --cacert pki/ca.crt -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$PORT/readyz" >/dev/null \
    || { log "the apiserver did not get ready; see $DIR/log/apiserver.log"; exit 1; }

  setsid "$BIN/kube-controller-manager" --kubeconfig "$DIR/kubeconfig" --bind-address 127.0.0.1 --secure-port "$KCM" \
    --service-account-private-key-file pki/sa.key --root-ca-file pki/ca.crt \
    --use-service-account-credentials=false "${KCM_FLAGS[@]}" > "$DIR/log/controller-manager.log" 2>&1 &
  echo $! > "$DIR/controller-manager.pid"
  setsid "$BIN/kube-scheduler" --kubeconfig "$DIR/kubeconfig" --bind-address 127.0.0.1 --secure-port "$SCHED" \
    "${SCHED_FLAGS[@]}" > "$DIR/log/scheduler.log" 2>&1 &
  echo $! > "$DIR/scheduler.pid"
}

start() {
  [[ $(id -u) -eq 0 ]] || { echo "kube-cluster.sh: needs root (kubelet, containerd)" >&2; exit 1; }
  need kube-apiserver kube-controller-manager kube-scheduler kubelet
  stop
  rm -f "$DIR/kwok-cluster"
  mkdir -p "$DIR/run" "$DIR/lib" "$DIR/cni/net.d" "$DIR/images"
  control_plane

  cat > "$DIR/containerd.toml" <<EOF
version = 2
root = "$DIR/lib/containerd"
state = "$DIR/run/containerd"
[grpc]
  address = "$DIR/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "vcdn.local/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
EOF
  cat > "$DIR/cni/net.d/10-vcdn.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "vcdn", "plugins": [
  {"type": "bridge", "bridge": "cni-vcdn", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$DIR/lib/cni"}},
  {"type": "loopback"}]}
EOF
  cat > "$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET
readOnlyPort: 0
healthzPort: 0
cgroupDriver: cgroupfs
failSwapOn: false
resolvConf: ""
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
makeIPTablesUtilChains: false
protectKernelDefaults: false
localStorageCapacityIsolation: false
enforceNodeAllocatable: []
evictionHard: {}
imageGCHighThresholdPercent: 100
EOF
  # The pods' bridge, made now (the CNI plugin would make it with the first
  # pod) so that the host can serve them on 10.244.0.1 from the start (an
  # origin, say).
  ip link add cni-vcdn type bridge 2>/dev/null || true
  ip addr replace 10.244.0.1/24 dev cni-vcdn
  ip link set cni-vcdn up
  sysctl -e vm.overcommit_memory kernel.panic kernel.panic_on_oops 2>/dev/null | sed 's/ = /=/' > "$DIR/sysctl.saved" || true

  # The node's address is the bridge's (the kubelet refuses a loopback one
  # and would report none: host-network pods need it as status.hostIP);
  # its API stays on 127.0.0.1 (kubelet.yaml), out of the pods' reach.
  log "containerd and kubelet (node $NODE) in their own mount namespace"
  setsid unshare --mount --propagation private bash -c "
    set -e
    mount --make-rprivate /
    for d in run var/lib var/log; do mkdir -p \"$DIR/ns/\$d\"; mount --bind \"$DIR/ns/\$d\" /\$d; done
    containerd --config '$DIR/containerd.toml' > '$DIR/log/containerd.log' 2>&1 &
    for _ in \$(seq 1 100); do [ -S '$DIR/run/containerd/containerd.sock' ] && break; sleep 0.1; done
    exec '$BIN/kubelet' --kubeconfig '$DIR/kubeconfig' --config '$DIR/kubelet.yaml' \
      --container-runtime-endpoint 'unix://$DIR/run/containerd/containerd.sock' \
      --root-dir '$DIR/lib/kubelet' --cert-dir '$DIR/pki/kubelet' \
      --hostname-override $NODE --node-ip 10.244.0.1 > '$DIR/log/kubelet.log' 2>&1
  " &
  echo $! > "$DIR/node.pid"
  for _ in $(seq 1 100); do [[ -S "$DIR/run/containerd/containerd.sock" ]] && break; sleep 0.1; done
  # The pause image: a static program that waits for a signal.
  if [[ ! -f "$DIR/images/pause/pause" ]]; then
    mkdir -p "$DIR/images/pause-src" "$DIR/images/pause"
    printf 'package main\nimport ("os";"os/signal";"syscall")\nfunc main(){c:=make(chan os.Signal,1);signal.Notify(c,syscall.SIGTERM,syscall.SIGINT);<-c}\n' > "$DIR/images/pause-src/main.go"
    (cd "$DIR/images/pause-src" && printf 'module pause\ngo 1.21\n' > go.mod && CGO_ENABLED=0 "$(command -v go || echo /usr/local/go/bin/go)" build -o "$DIR/images/pause/pause" .)
  fi
  image x "$DIR" vcdn.local/pause:1 "$DIR/images/pause"
  for _ in $(seq 1 300); do
    if curl -sf --cacert pki/ca.crt -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$PORT/api/v1/nodes/$NODE" \
      | python3 -c 'import json,sys; n=json.load(sys.stdin); sys.exit(0 if any(c["type"]=="Ready" and c["status"]=="True" for c in n["status"].get("conditions",[])) else 1)' 2>/dev/null; then
      log "node $NODE Ready; kubeconfig: $DIR/kubeconfig"
      exit 0
    fi
    sleep 0.2
  done
  log "the node did not get Ready; see $DIR/log/kubelet.log"
  exit 1
}

start_kwok() {
  local nodes=${1:?usage: kube-cluster.sh start-kwok DIR NODES}
  local stages=${KWOK_STAGES:-$BIN/../kwok-stages}
  need kube-apiserver kube-controller-manager kube-scheduler kwok
  [[ -f "$stages/node-initialize.yaml" ]] || { echo "kube-cluster.sh: no $stages; run scripts/kubernetes.sh" >&2; exit 1; }
  [[ $nodes =~ ^[0-9]+$ ]] || { echo "kube-cluster.sh: NODES must be a number" >&2; exit 2; }
  [[ -f "$DIR/node.pid" ]] || touch "$DIR/kwok-cluster"
  stop
  touch "$DIR/kwok-cluster"
  # A fresh etcd each time: nodes of an earlier run would linger.
  rm -rf "$DIR/etcd"
  # Hundreds of pods: the default client rate limits (controller-manager 20
  # requests/s, scheduler 50) would pace them.
  KCM_FLAGS=(--kube-api-qps 200 --kube-api-burst 400)
  SCHED_FLAGS=(--kube-api-qps 200 --kube-api-burst 400)
  control_plane

  log "creating $nodes nodes kwok-node-0..$((nodes - 1))"
  python3 - "$PORT" "$TOKEN" "$DIR/pki/ca.crt" "$nodes" <<'PY'
import http.client, json, ssl, sys
port, token, ca, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
conn = http.client.HTTPSConnection("127.0.0.1", int(port), context=ssl.create_default_context(cafile=ca))
res = {"cpu": "4", "memory": "8Gi", "pods": "110"}
for i in range(n):
    name = f"kwok-node-{i}"
    cidr = f"10.{128 + i // 256}.{i % 256}.0/24"
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                                                  "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
                         "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
            "status": {"allocatable": res, "capacity": res,
                       "addresses": [{"type": "InternalIP", "address": f"10.120.{(i + 1) // 256}.{(i + 1) % 256}"},
                                     {"type": "Hostname", "address": name}]}}
    conn.request("POST", "/api/v1/nodes", json.dumps(node),
                 {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    r = conn.getresponse(); body = r.read()
    if r.status != 201:
        sys.exit(f"creating {name}: {r.status} {body[:300]!r}")
PY

  log "kwok managing nodes labelled type=kwok"
  # KWOK_WORKDIR: so that a ~/.kwok/kwok.yaml is not read as well. Without
  # --node-lease-duration-seconds kwok keeps no node leases (and the
  # heartbeat stage only every ~10 minutes), so the controller-manager
  # would mark the nodes NotReady after 40 s. -v WARN: at INFO it logs every
  # lease renewal (300 nodes: ~45 MB an hour).
  KWOK_WORKDIR="$DIR/kwok" setsid "$BIN/kwok" --kubeconfig "$DIR/kubeconfig" \
    --manage-all-nodes=false --manage-nodes-with-label-selector type=kwok --node-lease-duration-seconds 40 -v WARN \
    -c "$(printf '%s,' "$stages"/*.yaml | sed 's/,$//')" > "$DIR/log/kwok.log" 2>&1 &
  echo $! > "$DIR/kwok.pid"
  for _ in $(seq 1 600); do
    # All nodes Ready, and the default service account there (pods need it).
    if curl -sf --cacert pki/ca.crt -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$PORT/api/v1/nodes?labelSelector=type%3Dkwok" \
      | python3 -c 'import json,sys; n=json.load(sys.stdin)["items"]; sys.exit(0 if len(n)==int(sys.argv[1]) and all(any(c["type"]=="Ready" and c["status"]=="True" for c in x["status"].get("conditions",[])) for x in n) else 1)' "$nodes" 2>/dev/null \
      && curl -sf --cacert pki/ca.crt -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$PORT/api/v1/namespaces/default/serviceaccounts/default" >/dev/null; then
      log "$nodes kwok nodes Ready; kubeconfig: $DIR/kubeconfig"
      exit 0
    fi
    sleep 0.2
  done
  log "the kwok nodes did not get Ready; see $DIR/log/kwok.log"
  exit 1
}

case $cmd in
  start) start ;;
  start-kwok) start_kwok "${3:-}" ;;
  stop) stop; log "stopped" ;;
  image) image "$@" ;;
  import) import_archive "$@" ;;
  *) echo "usage: kube-cluster.sh start|start-kwok|stop|image|import DIR ..." >&2; exit 2 ;;
esac
