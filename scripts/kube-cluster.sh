#!/usr/bin/env bash
# A real single-node Kubernetes for issue 23's tests, started as root from
# what scripts/kubernetes.sh built and Debian's etcd, containerd, runc and
# CNI plugins: `kube-cluster.sh start DIR` starts etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, and containerd with kubelet in a
# mount namespace of their own (so /run, /var/lib and /var/log of the host
# are not touched), waits for the node to be Ready and writes
# DIR/kubeconfig; `kube-cluster.sh stop DIR` stops all of it and removes
# what it made. `image DIR NAME:TAG ROOTFS` imports a one-layer image made
# from a directory (no registry: pods use imagePullPolicy Never).
#
# Environment: KUBE_PORT=16443 (apiserver; etcd, controller-manager,
# scheduler and kubelet use the next ones).
set -euo pipefail
cmd=${1:?usage: kube-cluster.sh start|stop|image DIR ...}
DIR=$(mkdir -p "${2:?DIR}" && cd "$2" && pwd)
BIN=${KUBE_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/vcdn/kubernetes-1.34.4/bin}
PORT=${KUBE_PORT:-16443}
ETCD=$((PORT + 1)) ETCD_PEER=$((PORT + 2)) KCM=$((PORT + 3)) SCHED=$((PORT + 4)) KUBELET=$((PORT + 5))
NODE=vcdn-node
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
  # Pods' processes (in kubelet's kubepods cgroups; killing their shims
  # would orphan them), then the shims and runc of this cluster, then the
  # cgroups kubelet made.
  for f in /proc/[0-9]*/cgroup; do
    if grep -q ':/kubepods' "$f" 2>/dev/null; then
      local pid=${f#/proc/}; kill -KILL "${pid%/cgroup}" 2>/dev/null || true
    fi
  done
  pkill -KILL -f -- "$DIR/" 2>/dev/null || true
  sleep 0.2
  for c in /sys/fs/cgroup/*/kubepods; do
    [[ -d $c ]] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  ip link del cni-vcdn 2>/dev/null || true
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

start() {
  [[ $(id -u) -eq 0 ]] || { echo "kube-cluster.sh: needs root (kubelet, containerd)" >&2; exit 1; }
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    [[ -x "$BIN/$b" ]] || { echo "kube-cluster.sh: no $BIN/$b; run scripts/kubernetes.sh" >&2; exit 1; }
  done
  stop
  mkdir -p "$DIR/pki" "$DIR/etcd" "$DIR/run" "$DIR/lib" "$DIR/log" "$DIR/cni/net.d" "$DIR/images"
  cd "$DIR/pki"
  if [[ ! -f ca.crt ]]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=vcdn-test-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default\n' > san.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 2 -extfile san.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    TOKEN=$(openssl rand -hex 24)
    printf '%s,admin,admin,system:masters\n' "$TOKEN" > tokens.csv
  fi
  TOKEN=$(cut -d, -f1 tokens.csv)
  cat > "$DIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: vcdn-test
  cluster: {server: "https://127.0.0.1:$PORT", certificate-authority: "$DIR/pki/ca.crt"}
users:
- name: admin
  user: {token: "$TOKEN"}
contexts:
- name: vcdn-test
  context: {cluster: vcdn-test, user: admin}
current-context: vcdn-test
EOF
  chmod 600 "$DIR/kubeconfig"
  cd "$DIR"

  log "etcd on 127.0.0.1:$ETCD"
  setsid etcd --data-dir "$DIR/etcd" --name vcdn-test \
    --listen-client-urls "http://127.0.0.1:$ETCD" --advertise-client-urls "http://127.0.0.1:$ETCD" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "vcdn-test=http://127.0.0.1:$ETCD_PEER" > "$DIR/log/etcd.log" 2>&1 &
  echo $! > "$DIR/etcd.pid"

  log "kube-apiserver on https://127.0.0.1:$PORT"
  setsid "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$PORT" \
    --tls-cert-file pki/apiserver.crt --tls-private-key-file pki/apiserver.key --client-ca-file pki/ca.crt \
    --token-auth-file pki/tokens.csv --authorization-mode Node,RBAC \
    --service-account-key-file pki/sa.pub --service-account-signing-key-file pki/sa.key \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/16 \
    --allow-privileged=true > "$DIR/log/apiserver.log" 2>&1 &
  echo $! > "$DIR/apiserver.pid"
  for _ in $(seq 1 300); do
    curl -sf --cacert pki/ca.crt -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$PORT/readyz" >/dev/null && break
    sleep 0.1
  done
  curl -sf --cacert pki/ca.crt -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$PORT/readyz" >/dev/null \
    || { log "the apiserver did not get ready; see $DIR/log/apiserver.log"; exit 1; }

  setsid "$BIN/kube-controller-manager" --kubeconfig "$DIR/kubeconfig" --bind-address 127.0.0.1 --secure-port "$KCM" \
    --service-account-private-key-file pki/sa.key --root-ca-file pki/ca.crt \
    --use-service-account-credentials=false > "$DIR/log/controller-manager.log" 2>&1 &
  echo $! > "$DIR/controller-manager.pid"
  setsid "$BIN/kube-scheduler" --kubeconfig "$DIR/kubeconfig" --bind-address 127.0.0.1 --secure-port "$SCHED" \
    > "$DIR/log/scheduler.log" 2>&1 &
  echo $! > "$DIR/scheduler.pid"

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
  sysctl -e vm.overcommit_memory kernel.panic kernel.panic_on_oops 2>/dev/null | sed 's/ = /=/' > "$DIR/sysctl.saved" || true

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
      --hostname-override $NODE --node-ip 127.0.0.1 > '$DIR/log/kubelet.log' 2>&1
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

case $cmd in
  start) start ;;
  stop) stop; log "stopped" ;;
  image) image "$@" ;;
  *) echo "usage: kube-cluster.sh start|stop|image DIR ..." >&2; exit 2 ;;
esac
