//! The `kubernetes` VIM driver: a region that is a Kubernetes cluster (or
//! a namespace of one). Each instance is one pod running `vcdn cache`,
//! which vcdn places on a node itself (the planner's choice, from the
//! nodes' allocatable capacity) and replaces itself when it is gone; see
//! `docs/ARCHITECTURE.md` for why pods and not a Deployment.
//!
//! The driver keeps three watches (its own pods, every pod, nodes) in
//! memory, so the
//! supervisor's questions (does it run, what IP has it, what is free) are
//! answered without an API call; only starts and stops call the API. It
//! runs its own small runtime, so the [`Vim`] trait stays synchronous for
//! both drivers.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use parking_lot::Mutex;
use serde_json::json;

use crate::types::Host;
use crate::vim::{InstanceFiles, InstanceSpec, Marked, Started, Vim, VimError};

/// Every object vcdn makes carries these labels.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Which control plane (a hash of its data directory) owns the object: a
/// restart adopts what matches its records and deletes the rest of its
/// own, and never touches another control plane's.
pub const OWNER: &str = "vcdn.io/control-plane";
pub const INSTANCE: &str = "vcdn.io/instance";
pub const SERVICE: &str = "vcdn.io/service";
pub const CUSTOMER: &str = "vcdn.io/customer";
pub const REGION: &str = "vcdn.io/region";
/// The pod's instance identity (`--instance-id`), an annotation.
pub const IDENTITY: &str = "vcdn.io/identity";

/// The environment variable that holds a host-network pod's node address.
const NODE_IP: &str = "VCDN_NODE_IP";

/// Where a pod finds the files of its Secret.
const FILES: &str = "/run/vcdn";

/// How long `start` waits for the watch to show the pod it created (it is
/// normally milliseconds behind).
const SEEN_WAIT: Duration = Duration::from_secs(2);

/// How long a pod the watch did not show within [`SEEN_WAIT`] counts as
/// running before it does.
const UNSEEN_GRACE: Duration = Duration::from_secs(20);

/// A region given to Kubernetes (`vcdn up --region-vim
/// NAME=kubernetes:KUBECONFIG[?namespace=NS&node-selector=K=V,…&image=REF&network=pod|host]`).
#[derive(Debug, Clone, PartialEq)]
pub struct KubeRegion {
    pub region: String,
    /// None: the in-cluster service account (`in-cluster`).
    pub kubeconfig: Option<PathBuf>,
    pub namespace: String,
    /// Nodes must carry these labels to be the region's hosts; pods get
    /// them as their node selector.
    pub node_selector: BTreeMap<String, String>,
    /// The cache image (`vcdn image` builds one from this binary).
    pub image: String,
    /// Caches listen on their node's own address (`network=host`) instead
    /// of a pod IP, for operators whose pod network users cannot reach:
    /// one cache per node then, as every cache of a region listens on the
    /// same ports.
    pub host_network: bool,
}

/// The image `vcdn image` makes from this build, used when a region names
/// none.
pub fn default_image() -> String {
    format!("vcdn.local/vcdn:{}", env!("CARGO_PKG_VERSION"))
}

impl KubeRegion {
    /// Reads `NAME=kubernetes:KUBECONFIG[?namespace=…&node-selector=…&image=…]`.
    pub fn parse(arg: &str) -> Result<KubeRegion, String> {
        let usage = "expected NAME=kubernetes:KUBECONFIG[?namespace=NS&node-selector=K=V,K=V&image=REF&network=pod|host] (KUBECONFIG may be in-cluster)";
        let (region, rest) = arg
            .split_once('=')
            .ok_or_else(|| format!("--region-vim {arg}: {usage}"))?;
        let rest = rest
            .strip_prefix("kubernetes:")
            .ok_or_else(|| format!("--region-vim {arg}: unknown VIM; {usage}"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if region.is_empty() || path.is_empty() {
            return Err(format!("--region-vim {arg}: {usage}"));
        }
        let mut r = KubeRegion {
            region: region.to_string(),
            kubeconfig: (path != "in-cluster").then(|| PathBuf::from(path)),
            namespace: "vcdn".into(),
            node_selector: BTreeMap::new(),
            image: default_image(),
            host_network: false,
        };
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("--region-vim {arg}: {kv}: {usage}"))?;
            match k {
                "namespace" => r.namespace = v.to_string(),
                "image" => r.image = v.to_string(),
                "network" => {
                    r.host_network = match v {
                        "pod" => false,
                        "host" => true,
                        _ => {
                            return Err(format!(
                                "--region-vim {arg}: network {v}: expected pod or host"
                            ))
                        }
                    }
                }
                "node-selector" => {
                    for pair in v.split(',').filter(|s| !s.is_empty()) {
                        let (lk, lv) = pair.split_once('=').ok_or_else(|| {
                            format!("--region-vim {arg}: node-selector {pair}: expected KEY=VALUE")
                        })?;
                        r.node_selector.insert(lk.to_string(), lv.to_string());
                    }
                }
                _ => return Err(format!("--region-vim {arg}: unknown option {k}; {usage}")),
            }
        }
        if !is_dns_label(&r.namespace) {
            return Err(format!(
                "--region-vim {arg}: namespace {} is not a DNS label (lowercase letters, digits, '-', at most 63)",
                r.namespace
            ));
        }
        Ok(r)
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A pod just created that the watch may not show yet.
struct Unseen {
    pod: String,
    at: Instant,
}

pub struct KubeVim {
    cfg: KubeRegion,
    owner: String,
    client: kube::Client,
    /// This control plane's pods (by its owner label): what `alive`,
    /// `address` and `marked` read, every supervisor tick.
    pods: reflector::Store<Pod>,
    /// Every pod of the cluster, for what other workloads request of the
    /// nodes (read when placing).
    all_pods: reflector::Store<Pod>,
    nodes: reflector::Store<Node>,
    /// The EndpointSlices of this control plane's Services: where the
    /// router and DNS send users (an instance's address).
    slices: reflector::Store<EndpointSlice>,
    unseen: Mutex<HashMap<String, Unseen>>,
    /// Each watch's last failure, until that watch delivers again.
    failing: Failing,
    api_errors: std::sync::atomic::AtomicU64,
    /// The driver's own runtime (watches and calls), shut down on drop.
    rt: Option<tokio::runtime::Runtime>,
}

/// What went wrong with a call to the cluster, for events.
fn api_error(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({}): {}", s.reason, s.code, s.message),
        e => e.to_string(),
    }
}

impl KubeVim {
    /// Connects to the region's cluster and starts watching its pods and
    /// nodes. An unreachable cluster is not fatal: the watches retry (the
    /// region has no hosts meanwhile, so orders for it get a 409 saying
    /// so), and the reason is logged.
    pub fn connect(cfg: KubeRegion, owner: &str) -> Result<KubeVim, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("kube-{}", cfg.region))
            .enable_all()
            .build()
            .map_err(|e| format!("region {}: cannot start a runtime: {e}", cfg.region))?;
        let c = cfg.clone();
        let client = run(&rt, Duration::from_secs(30), async move {
            let config = match &c.kubeconfig {
                None => kube::Config::incluster().map_err(|e| e.to_string())?,
                Some(p) => {
                    let k = kube::config::Kubeconfig::read_from(p)
                        .map_err(|e| format!("{}: {e}", p.display()))?;
                    kube::Config::from_custom_kubeconfig(k, &Default::default())
                        .await
                        .map_err(|e| format!("{}: {e}", p.display()))?
                }
            };
            kube::Client::try_from(config).map_err(|e| e.to_string())
        })
        .and_then(|r| r)
        .map_err(|e| format!("region {}: kubernetes: {e}", cfg.region))?;
        let (pods, pods_w) = reflector::store();
        let (all_pods, all_w) = reflector::store();
        let (nodes, nodes_w) = reflector::store();
        let (slices, slices_w) = reflector::store();
        let region = cfg.region.clone();
        let pods_api: Api<Pod> = Api::all(client.clone());
        let all_api: Api<Pod> = Api::all(client.clone());
        let mine = format!("{OWNER}={owner}");
        let nodes_api: Api<Node> = Api::all(client.clone());
        let node_labels = selector(&cfg.node_selector);
        let failing = Failing::default();
        let on_pods = note::<Pod>(&region, &failing, "its pods");
        rt.spawn(async move {
            watcher(pods_api, watcher::Config::default().labels(&mine))
                .backoff(Retry::default())
                .reflect(pods_w)
                .for_each(on_pods)
                .await
        });
        let on_all = note::<Pod>(&region, &failing, "pods");
        rt.spawn(async move {
            watcher(all_api, watcher::Config::default())
                .backoff(Retry::default())
                .reflect(all_w)
                .for_each(on_all)
                .await
        });
        // The endpoint slice controller copies a Service's labels onto its
        // slices: the owner label finds this control plane's.
        let slices_api: Api<EndpointSlice> = Api::namespaced(client.clone(), &cfg.namespace);
        let on_slices = note::<EndpointSlice>(&region, &failing, "endpoint slices");
        let mine = format!("{OWNER}={owner}");
        rt.spawn(async move {
            watcher(slices_api, watcher::Config::default().labels(&mine))
                .backoff(Retry::default())
                .reflect(slices_w)
                .for_each(on_slices)
                .await
        });
        let on_nodes = note::<Node>(&region, &failing, "nodes");
        rt.spawn(async move {
            let mut c = watcher::Config::default();
            if !node_labels.is_empty() {
                c = c.labels(&node_labels);
            }
            watcher(nodes_api, c)
                .backoff(Retry::default())
                .reflect(nodes_w)
                .for_each(on_nodes)
                .await
        });
        // The namespace is made if missing (an operator who gives vcdn a
        // namespace of a shared cluster makes it; vcdn then needs no
        // cluster-wide right to create namespaces).
        let (c, ns) = (client.clone(), cfg.namespace.clone());
        let made = run(&rt, Duration::from_secs(10), async move {
            let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c);
            match api.get_opt(&ns).await {
                Ok(Some(_)) => return Ok(false),
                Ok(None) => {}
                // Least privilege (deploy/kubernetes/rbac.json): the
                // operator made it.
                Err(kube::Error::Api(s)) if s.code == 403 => return Ok(false),
                Err(e) => return Err(api_error(e)),
            }
            let obj = serde_json::from_value(
                json!({"metadata": {"name": ns, "labels": {MANAGED_BY: "vcdn"}}}),
            )
            .map_err(|e| e.to_string())?;
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(api_error(e)),
            }
        });
        match made {
            Ok(Ok(true)) => {
                tracing::info!(region = %cfg.region, namespace = %cfg.namespace, "kubernetes: namespace created")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(region = %cfg.region, namespace = %cfg.namespace, error = %e, "kubernetes: cannot check or create the namespace")
            }
        }
        let (p, a, n, e) = (
            pods.clone(),
            all_pods.clone(),
            nodes.clone(),
            slices.clone(),
        );
        let ready = run(&rt, Duration::from_secs(5), async move {
            let _ = p.wait_until_ready().await;
            let _ = a.wait_until_ready().await;
            let _ = n.wait_until_ready().await;
            let _ = e.wait_until_ready().await;
        });
        let vim = KubeVim {
            cfg,
            owner: owner.to_string(),
            client,
            pods,
            all_pods,
            nodes,
            slices,
            unseen: Mutex::new(HashMap::new()),
            failing,
            api_errors: Default::default(),
            rt: Some(rt),
        };
        if ready.is_ok() {
            vim.repair_services();
        }
        match ready {
            Ok(()) => tracing::info!(
                region = %vim.cfg.region,
                namespace = %vim.cfg.namespace,
                nodes = vim.nodes.state().len(),
                image = %vim.cfg.image,
                "kubernetes VIM ready"
            ),
            Err(_) => tracing::warn!(
                region = %vim.cfg.region,
                "kubernetes: the cluster did not answer within 5 s; the region has no hosts until it does"
            ),
        }
        Ok(vim)
    }

    pub fn region(&self) -> &str {
        &self.cfg.region
    }

    fn call<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
    ) -> Result<T, String> {
        let rt = self
            .rt
            .as_ref()
            .expect("runtime lives as long as the driver");
        let r = run(rt, Duration::from_secs(30), f).and_then(|r| r);
        if r.is_err() {
            self.api_errors
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    /// A pod of this control plane, of any region (the planner counts
    /// those itself, wherever they run).
    fn ours(&self, p: &Pod) -> bool {
        label(p, OWNER) == Some(self.owner.as_str())
    }

    /// A pod of this control plane in this driver's region: two regions
    /// may share a cluster and namespace (one on pod IPs, one on the
    /// nodes' network), and each lists, adopts and repairs only its own.
    fn mine(&self, p: &Pod) -> bool {
        self.ours(p) && label(p, REGION) == Some(self.cfg.region.as_str())
    }

    /// The instance's pods that are not being deleted.
    fn pods_of(&self, id: &str) -> Vec<Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| self.mine(p) && label(p, INSTANCE) == Some(id))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect()
    }

    fn selector(&self, id: &str) -> String {
        format!("{OWNER}={},{INSTANCE}={id}", self.owner)
    }

    /// Makes sure every pod of this control plane is an owner of its
    /// Service: a control plane stopped between creating a pod and its
    /// Service left the pod without an address (one call to list the
    /// Services, one per pod to repair).
    fn repair_services(&self) {
        let api: Api<Service> = Api::namespaced(self.client.clone(), &self.cfg.namespace);
        let mine = ListParams::default().labels(&format!("{OWNER}={}", self.owner));
        let Ok(services) = self.call(async move { api.list(&mine).await.map_err(api_error) })
        else {
            return;
        };
        let owned: std::collections::HashSet<String> = services
            .items
            .iter()
            .flat_map(|s| s.metadata.owner_references.iter().flatten())
            .map(|o| o.uid.clone())
            .collect();
        for p in self.pods.state() {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            if !self.mine(&p) || ended(&p) || owned.contains(&uid) || label(&p, SERVICE).is_none() {
                continue;
            }
            let (client, ns, pod) = (self.client.clone(), self.cfg.namespace.clone(), p.clone());
            let owner = self.owner.clone();
            let name = p.metadata.name.clone().unwrap_or_default();
            match self.call(async move { own_service(client, &ns, &owner, &pod).await }) {
                Ok(s) => {
                    tracing::info!(region = %self.cfg.region, pod = %name, service = %s, "service repaired")
                }
                Err(e) => {
                    tracing::warn!(region = %self.cfg.region, pod = %name, error = %e, "cannot repair the pod's service")
                }
            }
        }
    }

    /// The address the instance's EndpointSlice gives its live pod.
    fn slice_address(&self, pod: &str) -> Option<IpAddr> {
        self.slices.state().iter().find_map(|s| {
            s.endpoints
                .iter()
                .filter(|e| e.target_ref.as_ref().and_then(|t| t.name.as_deref()) == Some(pod))
                .find_map(|e| e.addresses.first()?.parse().ok())
        })
    }

    /// The instance's Secret and Pod.
    fn objects(&self, spec: &InstanceSpec, name: &str) -> Result<(Secret, Pod), String> {
        let mut data = serde_json::Map::new();
        data.insert("admin-token".into(), json!(spec.admin_token));
        if let Some(c) = &spec.admin_tls {
            data.insert("admin.crt".into(), json!(c.cert_pem));
            data.insert("admin.key".into(), json!(c.key_pem));
        }
        if let Some(ca) = &spec.origin_ca_pem {
            data.insert("origin-ca.pem".into(), json!(ca));
        }
        let (crt, key, ca) = (
            PathBuf::from(format!("{FILES}/admin.crt")),
            PathBuf::from(format!("{FILES}/admin.key")),
            PathBuf::from(format!("{FILES}/origin-ca.pem")),
        );
        // A pod has the whole network namespace to itself: it listens on
        // every address of it, at the planned ports.
        let mut inside = spec.clone();
        let any = IpAddr::from([0, 0, 0, 0]);
        inside.listen.set_ip(any);
        inside.admin.set_ip(any);
        if let Some(t) = &mut inside.tls_listen {
            t.set_ip(any);
        }
        let (mut args, _env) = crate::vim::command(
            &inside,
            InstanceFiles {
                origin_ca: spec.origin_ca_pem.as_ref().map(|_| ca.as_path()),
                admin_tls: spec
                    .admin_tls
                    .as_ref()
                    .map(|_| (crt.as_path(), key.as_path())),
                telemetry_keys: None,
            },
        );
        if self.cfg.host_network {
            // On the node's own network, a cache listens on the node's
            // address only (the kubelet puts it in the environment and
            // expands `$(…)` in the arguments), not on every address of it.
            for a in &mut args {
                if let Some(port) = a.strip_prefix("0.0.0.0:") {
                    *a = format!("$({NODE_IP}):{port}");
                }
            }
        }
        let labels = json!({
            MANAGED_BY: "vcdn",
            OWNER: self.owner,
            INSTANCE: spec.id,
            SERVICE: spec.service,
            CUSTOMER: spec.customer,
            REGION: spec.region,
        });
        let secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.cfg.namespace, "labels": labels},
            "type": "Opaque",
            "stringData": data,
        }))
        .map_err(|e| e.to_string())?;
        let cpu = format!("{}m", (spec.cpu_quota * 1000.0).round().max(1.0) as u64);
        let memory = format!("{}Mi", spec.memory_mib.max(1));
        let scheme = if spec.admin_tls.is_some() {
            "HTTPS"
        } else {
            "HTTP"
        };
        let mut ports = vec![
            json!({"name": "http", "containerPort": spec.listen.port()}),
            json!({"name": "admin", "containerPort": spec.admin.port()}),
        ];
        if let Some(t) = spec.tls_listen {
            ports.push(json!({"name": "https", "containerPort": t.port()}));
        }
        let mut env = vec![
            json!({"name": "VCDN_ADMIN_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "admin-token"}}}),
        ];
        if self.cfg.host_network {
            // The node's ports are declared, so the scheduler refuses a
            // second pod on them rather than the cache failing to bind.
            for p in &mut ports {
                p["hostPort"] = p["containerPort"].clone();
            }
            env.push(
                json!({"name": NODE_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}),
            );
        }
        let mut pod = json!({
            "metadata": {
                "name": name,
                "namespace": self.cfg.namespace,
                "labels": labels,
                "annotations": {IDENTITY: spec.identity},
            },
            "spec": {
                // vcdn replaces a pod that is gone itself (and records it):
                // the kubelet does not restart it in place.
                "restartPolicy": "Never",
                // SIGTERM drains (GOAWAY, finish in-flight responses).
                "terminationGracePeriodSeconds": 10,
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "nodeSelector": self.cfg.node_selector,
                // The planner chose the node; the scheduler still checks it.
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [spec.host]}
                    ]}]
                }}},
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534},
                "containers": [{
                    "name": "cache",
                    "image": self.cfg.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/vcdn"],
                    "args": args,
                    "env": env,
                    "ports": ports,
                    "resources": {
                        "requests": {"cpu": cpu, "memory": memory},
                        "limits": {"cpu": cpu, "memory": memory},
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/healthz", "port": spec.admin.port(), "scheme": scheme},
                        "periodSeconds": 1,
                        "failureThreshold": 1,
                        "timeoutSeconds": 1,
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "readOnlyRootFilesystem": true,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": "files", "mountPath": FILES, "readOnly": true},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                }],
                "volumes": [
                    {"name": "files", "secret": {"secretName": name, "defaultMode": 0o440}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                ],
            }
        });
        if self.cfg.host_network {
            pod["spec"]["hostNetwork"] = json!(true);
            pod["spec"]["dnsPolicy"] = json!("ClusterFirstWithHostNet");
        }
        let pod = serde_json::from_value(pod).map_err(|e| e.to_string())?;
        Ok((secret, pod))
    }
}

impl Drop for KubeVim {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Each watch's last failure (by what it watches), until it delivers
/// again: the cluster is known only while none fails.
#[derive(Clone, Default)]
struct Failing(Arc<Mutex<BTreeMap<&'static str, String>>>);

impl Failing {
    fn any(&self) -> bool {
        !self.0.lock().is_empty()
    }

    /// "watching its nodes fails: …; …", if any does.
    fn why(&self) -> Option<String> {
        let f = self.0.lock();
        (!f.is_empty()).then(|| {
            f.iter()
                .map(|(what, e)| format!("watching {what} fails: {e}"))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }
}

/// What a watch's events do besides filling its store: a failure is
/// logged and kept (for [`Vim::trouble`] and the metrics) until that
/// watch delivers an event again.
fn note<K>(
    region: &str,
    failing: &Failing,
    what: &'static str,
) -> impl FnMut(Result<watcher::Event<K>, watcher::Error>) -> std::future::Ready<()> {
    let (region, failing) = (region.to_string(), failing.clone());
    move |e| {
        match e {
            Err(e) => {
                tracing::warn!(%region, error = %e, "kubernetes: watching {what} failed; retrying");
                failing.0.lock().insert(what, e.to_string());
            }
            Ok(_) => {
                failing.0.lock().remove(what);
            }
        }
        std::future::ready(())
    }
}

/// How a watch retries: 100 ms doubling to 2 s (kube's default goes to
/// 30 s; a control plane of a few watches can retry sooner and resume
/// soon after an apiserver comes back), from the start again after a
/// success.
struct Retry(Duration);

impl Default for Retry {
    fn default() -> Retry {
        Retry(Duration::from_millis(100))
    }
}

impl Iterator for Retry {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(2));
        Some(d)
    }
}

impl kube::runtime::utils::Backoff for Retry {
    fn reset(&mut self) {
        *self = Retry::default();
    }
}

/// Runs `f` on the driver's runtime and waits for it from any thread (a
/// thread of another runtime included, which `block_on` would refuse).
fn run<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    limit: Duration,
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv_timeout(limit)
        .map_err(|_| format!("no answer from the cluster within {limit:?}"))
}

fn label<'a>(p: &'a Pod, k: &str) -> Option<&'a str> {
    p.metadata.labels.as_ref()?.get(k).map(String::as_str)
}

fn selector(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A pod that has ended (its container exited or it was evicted).
fn ended(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

/// The headless Service of a vCDN's caches in a region (`vcdn-SERVICE-REGION`,
/// or a hash of the region where that name would be too long): its
/// EndpointSlices give the pods' addresses, and an operator finds a vCDN's
/// caches with `kubectl get endpointslices -l kubernetes.io/service-name=…`.
fn service_name(service: &str, region: &str) -> String {
    let name = format!("vcdn-{service}-{region}");
    if name.len() <= 63 && is_dns_label(&name) {
        return name;
    }
    let h = region.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    format!("vcdn-{service}-r{:08x}", h as u32)
}

/// Makes `pod` an owner of its Service, creating the Service if needed.
/// Owned by its pods, the Service goes (garbage collection) when its last
/// pod does: nothing is left behind, whenever the control plane stops.
async fn own_service(
    client: kube::Client,
    ns: &str,
    owner: &str,
    pod: &Pod,
) -> Result<String, String> {
    let get = |k: &str| label(pod, k).unwrap_or_default().to_string();
    let (service, region) = (get(SERVICE), get(REGION));
    let name = service_name(&service, &region);
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("http"))
        .map(|p| p.container_port)
        .ok_or("the pod has no http port")?;
    let reference = json!({
        "apiVersion": "v1", "kind": "Pod",
        "name": pod.metadata.name, "uid": pod.metadata.uid,
        "blockOwnerDeletion": false,
    });
    let object: Service = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {MANAGED_BY: "vcdn", OWNER: owner, SERVICE: service, CUSTOMER: get(CUSTOMER), REGION: region},
            "ownerReferences": [reference],
        },
        "spec": {
            // Headless: no ClusterIP (nothing routes one here, and users
            // reach pods through vcdn's router), only EndpointSlices.
            "clusterIP": "None",
            "selector": {OWNER: owner, SERVICE: service, REGION: region},
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        }
    }))
    .map_err(|e| e.to_string())?;
    let api: Api<Service> = Api::namespaced(client, ns);
    // A Service being deleted (its last pod just went) is waited out.
    for _ in 0..20 {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => return Ok(name),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(api_error(e)),
        }
        let more = json!({"metadata": {"ownerReferences": [reference]}});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Strategic(&more))
            .await
        {
            Ok(s) if s.metadata.deletion_timestamp.is_none() => return Ok(name),
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_error(e)),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("service {name} stays in deletion"))
}

impl Vim for KubeVim {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn start(&self, spec: &InstanceSpec) -> Result<Started, VimError> {
        let name = format!("vcdn-{}-{}", spec.id, crate::control::random_hex(3));
        let fail = |e: String| {
            VimError::Spawn(
                spec.id.clone(),
                std::io::Error::other(format!(
                    "kubernetes region {} (namespace {}): {e}",
                    self.cfg.region, self.cfg.namespace
                )),
            )
        };
        let (secret, pod) = self.objects(spec, &name).map_err(fail)?;
        let (pods, secrets): (Api<Pod>, Api<Secret>) = (
            Api::namespaced(self.client.clone(), &self.cfg.namespace),
            Api::namespaced(self.client.clone(), &self.cfg.namespace),
        );
        let old = ListParams::default().labels(&self.selector(&spec.id));
        let n = name.clone();
        let (client, ns, me) = (
            self.client.clone(),
            self.cfg.namespace.clone(),
            self.owner.clone(),
        );
        self.call(async move {
            // A pod of this instance that ended, or one left behind by a
            // start cut short, goes first (with its Secret).
            let now = DeleteParams::default().grace_period(0);
            pods.delete_collection(&now, &old)
                .await
                .map_err(api_error)?;
            secrets
                .delete_collection(&now, &old)
                .await
                .map_err(api_error)?;
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .map_err(api_error)?;
            let made = pods
                .create(&PostParams::default(), &pod)
                .await
                .map_err(api_error)?;
            // The Secret goes with its pod (garbage collection).
            let owner = json!({"metadata": {"ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": n,
                "uid": made.metadata.uid, "blockOwnerDeletion": false,
            }]}});
            secrets
                .patch(&n, &PatchParams::default(), &Patch::Merge(&owner))
                .await
                .map_err(api_error)?;
            own_service(client, &ns, &me, &made).await?;
            Ok(())
        })
        .map_err(fail)?;
        // The watch shows the pod a few milliseconds after its creation:
        // wait for that, so that "not in the watch" means "gone" from now on.
        // Only a watch that lags longer leaves the pod to `unseen`.
        let t = Instant::now();
        while t.elapsed() < SEEN_WAIT {
            if self
                .pods
                .state()
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if t.elapsed() >= SEEN_WAIT {
            self.unseen.lock().insert(
                spec.id.clone(),
                Unseen {
                    pod: name.clone(),
                    at: Instant::now(),
                },
            );
        }
        tracing::info!(region = %self.cfg.region, instance = %spec.id, pod = %name, node = %spec.host, "pod created");
        Ok(Started {
            pid: None,
            cpu_limit: format!("kubernetes pod {name}: {:.2} CPU limit", spec.cpu_quota),
        })
    }

    fn stop(&self, id: &str, _pid: Option<u32>) {
        // Nothing to delete only if the watch is sure: no pod of it seen,
        // none just created, and the watch working.
        let just_made = self.unseen.lock().remove(id).is_some();
        if !just_made
            && !self.failing.any()
            && !self
                .pods
                .state()
                .iter()
                .any(|p| self.mine(p) && label(p, INSTANCE) == Some(id))
        {
            return;
        }
        let (pods, secrets): (Api<Pod>, Api<Secret>) = (
            Api::namespaced(self.client.clone(), &self.cfg.namespace),
            Api::namespaced(self.client.clone(), &self.cfg.namespace),
        );
        let which = ListParams::default().labels(&self.selector(id));
        let r = self.call(async move {
            // The pod's grace period lets it drain; nobody waits for it.
            pods.delete_collection(&DeleteParams::default(), &which)
                .await
                .map_err(api_error)?;
            secrets
                .delete_collection(&DeleteParams::default(), &which)
                .await
                .map_err(api_error)?;
            Ok(())
        });
        match r {
            Ok(()) => tracing::info!(region = %self.cfg.region, instance = %id, "pod deleted"),
            Err(e) => {
                tracing::warn!(region = %self.cfg.region, instance = %id, error = %e, "cannot delete the pod; the next reconcile will")
            }
        }
    }

    fn alive(&self, id: &str, _pid: Option<u32>, identity: &str) -> bool {
        if self.failing.any() {
            // The watch does not know: nothing is replaced on stale
            // knowledge (the router's health checks still decide whom
            // users reach).
            return true;
        }
        let pods = self.pods_of(id);
        let mut unseen = self.unseen.lock();
        if let Some(u) = unseen.get(id) {
            if pods
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(u.pod.as_str()))
            {
                unseen.remove(id);
            } else if u.at.elapsed() < UNSEEN_GRACE {
                return true;
            }
        }
        pods.iter().any(|p| {
            !ended(p)
                && p.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(IDENTITY))
                    .is_some_and(|i| i == identity)
        })
    }

    fn marked(&self) -> Vec<Marked> {
        self.pods
            .state()
            .iter()
            .filter(|p| self.mine(p) && p.metadata.deletion_timestamp.is_none() && !ended(p))
            .map(|p| Marked {
                pid: None,
                ip: self.slice_address(p.metadata.name.as_deref().unwrap_or_default()),
                identity: p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(IDENTITY))
                    .cloned()
                    .unwrap_or_default(),
                listen: p.metadata.name.clone().unwrap_or_default(),
            })
            .collect()
    }

    fn address(&self, id: &str) -> Option<IpAddr> {
        self.pods_of(id)
            .iter()
            .filter(|p| !ended(p))
            .find_map(|p| self.slice_address(p.metadata.name.as_deref()?))
    }

    fn regions(&self) -> Vec<String> {
        vec![self.cfg.region.clone()]
    }

    fn hosts(&self) -> Vec<Host> {
        if self.failing.any() {
            // Nothing is placed on stale knowledge.
            return Vec::new();
        }
        // What other workloads request of each node (vcdn's own pods are
        // counted by the planner from its records).
        let mut held: HashMap<String, (u64, u64)> = HashMap::new();
        for p in self.all_pods.state() {
            if self.ours(&p) || ended(&p) {
                continue;
            }
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            let (c, m) = requests(&p);
            let h = held.entry(node).or_default();
            h.0 += c;
            h.1 += m;
        }
        self.nodes
            .state()
            .iter()
            .filter(|n| usable(n))
            .filter_map(|n| {
                let name = n.metadata.name.clone()?;
                let alloc = n.status.as_ref()?.allocatable.as_ref()?;
                let cpu = alloc.get("cpu").and_then(|q| millicpu(&q.0))?;
                let mem = alloc.get("memory").and_then(|q| bytes(&q.0))?;
                let (hc, hm) = held.get(&name).copied().unwrap_or_default();
                Some(Host {
                    name,
                    region: self.cfg.region.clone(),
                    vcpus: (cpu.saturating_sub(hc) / 1000) as u32,
                    memory_mib: mem.saturating_sub(hm) >> 20,
                    max_instances: self.cfg.host_network.then_some(1),
                })
            })
            .collect()
    }

    fn samples(&self) -> Vec<crate::vim::Sample> {
        use crate::vim::Sample;
        let region = format!(
            "region=\"{}\"",
            self.cfg.region.replace(['"', '\\', '\n'], "_")
        );
        let mut phases: BTreeMap<String, usize> = BTreeMap::new();
        for p in self.pods.state().iter().filter(|p| self.mine(p)) {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Unknown".into());
            *phases.entry(phase).or_default() += 1;
        }
        let mut out = vec![
            Sample {
                name: "vcdn_kubernetes_cluster_up",
                help: "Whether the region's cluster answers its watches (1) or not (0).",
                kind: "gauge",
                labels: region.clone(),
                value: if self.failing.any() { 0.0 } else { 1.0 },
            },
            Sample {
                name: "vcdn_kubernetes_nodes",
                help: "The region's Ready, schedulable nodes (its hosts).",
                kind: "gauge",
                labels: region.clone(),
                value: self.nodes.state().iter().filter(|n| usable(n)).count() as f64,
            },
            Sample {
                name: "vcdn_kubernetes_api_errors_total",
                help:
                    "Pod and Secret calls (creates, deletes) the cluster refused or did not answer.",
                kind: "counter",
                labels: region.clone(),
                value: self.api_errors.load(std::sync::atomic::Ordering::Relaxed) as f64,
            },
        ];
        for (phase, n) in phases {
            out.push(Sample {
                name: "vcdn_kubernetes_pods",
                help: "This control plane's pods in the region, by phase.",
                kind: "gauge",
                labels: format!("{region},phase=\"{phase}\""),
                value: n as f64,
            });
        }
        out
    }

    fn trouble(&self, _region: &str) -> Option<String> {
        let failing = self.failing.why();
        let nodes = self.nodes.state().len();
        match failing {
            Some(e) => Some(format!(
                "the Kubernetes cluster of region {} does not answer ({e})",
                self.cfg.region
            )),
            None if nodes == 0 => Some(format!(
                "the Kubernetes cluster of region {} has no node{} yet",
                self.cfg.region,
                if self.cfg.node_selector.is_empty() {
                    String::new()
                } else {
                    format!(" labelled {}", selector(&self.cfg.node_selector))
                }
            )),
            None => None,
        }
    }

    fn start_limit(&self, _region: &str) -> Duration {
        // Scheduling, the sandbox, the network and the container start.
        Duration::from_secs(60)
    }
}

/// Ready, schedulable nodes are hosts.
fn usable(n: &Node) -> bool {
    if n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return false;
    }
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A pod's CPU (millicores) and memory (bytes) requests, as the scheduler
/// sums them (containers; init containers are ignored: they end).
fn requests(p: &Pod) -> (u64, u64) {
    let mut out = (0, 0);
    for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
        if let Some(r) = c.resources.as_ref().and_then(|r| r.requests.as_ref()) {
            out.0 += r.get("cpu").and_then(|q| millicpu(&q.0)).unwrap_or(0);
            out.1 += r.get("memory").and_then(|q| bytes(&q.0)).unwrap_or(0);
        }
    }
    out
}

/// A CPU quantity in millicores: `2`, `1500m`, `0.5`.
fn millicpu(q: &str) -> Option<u64> {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    let v: f64 = q.parse().ok()?;
    (v >= 0.0).then(|| (v * 1000.0).round() as u64)
}

/// A memory quantity in bytes: `8Gi`, `16381356Ki`, `1G`, `512M`, `1024`.
fn bytes(q: &str) -> Option<u64> {
    const UNITS: [(&str, u64); 11] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("", 1),
    ];
    let (num, unit) = UNITS
        .iter()
        .find_map(|(s, u)| q.strip_suffix(s).map(|n| (n, *u)))?;
    let v: f64 = num.parse().ok()?;
    (v >= 0.0).then_some((v * unit as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_vim_names_its_cluster_namespace_selector_and_image() {
        let r = KubeRegion::parse(
            "paris=kubernetes:/etc/k.yaml?namespace=cdn&node-selector=zone=a,tier=edge&image=reg/v:1",
        )
        .unwrap();
        assert_eq!(r.region, "paris");
        assert_eq!(
            r.kubeconfig.as_deref(),
            Some(std::path::Path::new("/etc/k.yaml"))
        );
        assert_eq!(r.namespace, "cdn");
        assert_eq!(
            r.node_selector.get("tier").map(String::as_str),
            Some("edge")
        );
        assert_eq!(r.image, "reg/v:1");
        assert!(!r.host_network, "pod IPs unless asked");
        let d = KubeRegion::parse("lyon=kubernetes:in-cluster?network=host").unwrap();
        assert_eq!((d.kubeconfig, d.namespace.as_str()), (None, "vcdn"));
        assert!(d.host_network);
        for bad in [
            "paris",
            "paris=local:/x",
            "=kubernetes:/x",
            "paris=kubernetes:",
            "paris=kubernetes:/x?color=red",
            "paris=kubernetes:/x?namespace=Bad_NS",
            "paris=kubernetes:/x?node-selector=novalue",
            "paris=kubernetes:/x?network=bridge",
        ] {
            assert!(KubeRegion::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quantities_read_as_the_scheduler_reads_them() {
        assert_eq!(millicpu("2"), Some(2000));
        assert_eq!(millicpu("1500m"), Some(1500));
        assert_eq!(millicpu("0.5"), Some(500));
        assert_eq!(millicpu("x"), None);
        assert_eq!(bytes("8Gi"), Some(8 << 30));
        assert_eq!(bytes("16381356Ki"), Some(16381356 << 10));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("1024"), Some(1024));
        assert_eq!(bytes("-1"), None);
    }
}
