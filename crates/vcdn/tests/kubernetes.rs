//! Issue 23: a region that is a Kubernetes cluster. A real single-node
//! cluster (etcd, kube-apiserver, controller-manager, scheduler, kubelet
//! with containerd and runc; `scripts/kube-cluster.sh`) runs the caches of
//! region paris as pods made from `vcdn image`; the other regions stay
//! local. Needs root, and the binaries `scripts/kubernetes.sh` builds once
//! (the test command runs it).

mod support;

use support::{region_instances as instances, resolve};

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::Value;
use support::up::{free_port, Up, OP};
use support::{eventually, tempdir, x_cache, TempDir};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kube-cluster.sh")
}

/// A cluster of `kube-cluster.sh`, stopped (and everything it made
/// removed) when dropped, also when the test fails.
struct Cluster {
    dir: TempDir,
    port: u16,
}

impl Cluster {
    fn start(name: &str) -> Cluster {
        assert!(
            unsafe { libc::geteuid() } == 0,
            "the Kubernetes tests run as root (kubelet, containerd)"
        );
        // The apiserver's port and the five after it.
        let port = loop {
            let p = free_port();
            if (1..6).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
                break p;
            }
        };
        let c = Cluster {
            dir: tempdir(name),
            port,
        };
        c.run(&["start"]);
        c
    }

    fn run(&self, args: &[&str]) {
        let out = Command::new("bash")
            .arg(script())
            .arg(args[0])
            .arg(&*self.dir)
            .args(&args[1..])
            .env("KUBE_PORT", self.port.to_string())
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "kube-cluster.sh {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
    }

    fn logs(&self) -> String {
        ["kubelet", "apiserver", "containerd"]
            .iter()
            .map(|l| {
                let t = std::fs::read_to_string(self.dir.join(format!("log/{l}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = t.lines().rev().take(15).collect();
                format!(
                    "--- {l}.log (last lines)\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    async fn client(&self) -> kube::Client {
        let k = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let c = kube::Config::from_custom_kubeconfig(k, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(c).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&*self.dir)
            .env("KUBE_PORT", self.port.to_string())
            .status();
    }
}

/// `vcdn image` of this build (debug information stripped: the pods'
/// snapshots copy the layer), imported into the node's containerd.
fn import_image(c: &Cluster, tag: &str) {
    let bin = c.dir.join("vcdn-stripped");
    let ok = Command::new("strip")
        .args(["--strip-debug", "-o"])
        .arg(&bin)
        .arg(env!("CARGO_BIN_EXE_vcdn"))
        .status()
        .expect("strip runs (binutils)");
    assert!(ok.success());
    let tar = c.dir.join("vcdn-image.tar");
    let out = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(["image", "--tag", tag, "--binary"])
        .arg(&bin)
        .arg("--out")
        .arg(&tar)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    c.run(&["import", tar.to_str().unwrap()]);
}

/// What `deploy/kubernetes/rbac.json` gives the service account `vcdn`,
/// given to the cluster's user `vcdn` as well: the control plane runs
/// with exactly the rights the manifest grants.
async fn apply_rbac(k: &kube::Client) {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/rbac.json");
    let list: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let pp = PostParams::default();
    for mut item in list["items"].as_array().unwrap().iter().cloned() {
        if let Some(subjects) = item["subjects"].as_array_mut() {
            subjects.push(serde_json::json!({"kind": "User", "name": "vcdn", "apiGroup": "rbac.authorization.k8s.io"}));
        }
        let ns = item["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let kind = item["kind"].as_str().unwrap().to_string();
        macro_rules! create {
            ($t:ty, $api:expr) => {{
                let api: Api<$t> = $api;
                api.create(&pp, &serde_json::from_value(item).unwrap())
                    .await
                    .map(|_| ())
            }};
        }
        let r = match kind.as_str() {
            "Namespace" => create!(Namespace, Api::all(k.clone())),
            "ServiceAccount" => create!(ServiceAccount, Api::namespaced(k.clone(), &ns)),
            "ClusterRole" => create!(ClusterRole, Api::all(k.clone())),
            "ClusterRoleBinding" => create!(ClusterRoleBinding, Api::all(k.clone())),
            "Role" => create!(Role, Api::namespaced(k.clone(), &ns)),
            "RoleBinding" => create!(RoleBinding, Api::namespaced(k.clone(), &ns)),
            other => panic!("rbac.json: unexpected kind {other}"),
        };
        r.unwrap_or_else(|e| panic!("rbac.json: {kind}: {e}"));
    }
}

/// An elastic order of the demo customer: `NAME.example` from `origin`
/// for `users` viewers in `region` at MOS 4.
fn order_spec(name: &str, origin: SocketAddr, region: &str, users: u32) -> Value {
    serde_json::json!({"name": name, "origin": format!("http://{origin}"),
        "hostname": format!("{name}.example"), "flavor": "elastic",
        "regions": [{"region": region, "peak_users": users}], "quality": {"min_mos": 4.0}})
}

/// The demo customer's order is refused with `status`, the problem's
/// detail saying `saying`.
async fn assert_refused(up: &Up, spec: Value, status: u16, saying: &str) {
    let (st, p) = up
        .call(&up.demo_key(), "POST", "/v1/services", Some(spec))
        .await;
    assert_eq!(st, status, "{p}");
    let detail = p["detail"].as_str().unwrap_or("");
    assert!(detail.contains(saying), "{p}");
}

/// The service's pods that are not being deleted: name → IP.
async fn pods_of(api: &Api<Pod>, service: &str) -> Vec<(String, String, bool)> {
    let l = api
        .list(&ListParams::default().labels(&format!("vcdn.io/service={service}")))
        .await
        .unwrap();
    let mut v: Vec<(String, String, bool)> = l
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let st = p.status.unwrap_or_default();
            let ready = st
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (
                p.metadata.name.unwrap_or_default(),
                st.pod_ip.unwrap_or_default(),
                ready,
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_on_kubernetes_runs_its_caches_as_pods_that_serve_heal_scale_and_go() {
    let cluster = Cluster::start("kube-e2e");
    let tag = "vcdn.local/vcdn:test";
    import_image(&cluster, tag);
    // The demo origin on the pods' bridge, where they reach the host.
    let origin = SocketAddr::from(([10, 244, 0, 1], free_port()));
    let model_dir = tempdir("kube-model");
    let model = support::small_capacity_model(&model_dir);
    // The control plane has only the rights deploy/kubernetes/rbac.json
    // grants.
    let k = cluster.client().await;
    apply_rbac(&k).await;
    let kubeconfig = cluster.dir.join("kubeconfig-vcdn");
    let vim = format!(
        "paris=kubernetes:{}?namespace=vcdn&image={tag}",
        kubeconfig.display()
    );
    // Lyon's caches use the node's own network (the same node: its
    // address is the pods' bridge's, 10.244.0.1).
    let host_vim = format!(
        "lyon=kubernetes:{}?namespace=vcdn&image={tag}&network=host",
        kubeconfig.display()
    );
    let mut up = Up::start_with_origin(
        "kube-up",
        origin,
        &[
            "--region-vim",
            &vim,
            "--region-vim",
            &host_vim,
            "--capacity-model",
            &model,
        ],
    );
    let pods: Api<Pod> = Api::namespaced(k.clone(), "vcdn");
    let secrets: Api<Secret> = Api::namespaced(k.clone(), "vcdn");
    let services: Api<Service> = Api::namespaced(k.clone(), "vcdn");
    let slices: Api<EndpointSlice> = Api::namespaced(k.clone(), "vcdn");
    let dns = SocketAddr::from(([127, 0, 0, 1], up.ports[0]));

    // The region's hosts are the cluster's nodes, with their allocatable
    // CPU and memory.
    let (st, hosts) = up.call(OP, "GET", "/v1/hosts", None).await;
    assert_eq!(st, 200, "{hosts}");
    let node = hosts["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["region"] == "paris")
        .cloned()
        .unwrap_or_else(|| panic!("no paris host: {hosts}"));
    assert_eq!(node["name"], "vcdn-node", "{hosts}");
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(node["vcpus"].as_u64(), Some(cpus), "{node}");

    // Caches only: an order that needs proxies there is refused, saying why.
    let mut accel = order_spec("accel", origin, "paris", 10);
    accel["acceleration"] = serde_json::json!({"paths": ["/dynamic"], "uncacheable": true});
    assert_refused(
        &up,
        accel,
        422,
        "runs on Kubernetes, which runs caches only",
    )
    .await;

    // Order → active, pods included.
    let t0 = Instant::now();
    let id = up.order("kube", "paris", 10).await;
    let took = t0.elapsed();
    eprintln!("order → active on Kubernetes (pod start included): {took:?}");
    let (_, s) = up
        .call(OP, "GET", &format!("/v1/services/{id}"), None)
        .await;
    let paris = instances(&s, "paris");
    assert_eq!(paris.len(), 1, "{s}");
    // vcdn answers once the cache answers it; the kubelet's readiness
    // probe (every second) follows.
    assert!(
        eventually(5, || async {
            pods_of(&pods, &id).await.iter().all(|p| p.2)
        })
        .await,
        "the pod is not ready for the kubelet: {:?}",
        pods_of(&pods, &id).await
    );
    let p = pods_of(&pods, &id).await;
    assert_eq!(p.len(), 1, "one pod per instance: {p:?}");
    let ip: IpAddr = p[0].1.parse().unwrap();
    assert!(p[0].1.starts_with("10.244.0."), "a pod IP: {p:?}");
    assert_eq!(
        paris[0]["address"],
        format!("{ip}:{}", up.instance_port),
        "the record holds the pod's IP: {s}"
    );
    let pod: Pod = pods.get(&p[0].0).await.unwrap();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        ("vcdn.io/service", id.as_str()),
        ("vcdn.io/region", "paris"),
        ("vcdn.io/customer", s["customer"].as_str().unwrap()),
        ("app.kubernetes.io/managed-by", "vcdn"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{labels:?}");
    }
    let c = &pod.spec.as_ref().unwrap().containers[0];
    let res = c.resources.as_ref().unwrap();
    assert_eq!(
        res.limits, res.requests,
        "requests and limits from the flavor"
    );
    assert!(c.readiness_probe.is_some());
    // The address came from the EndpointSlice of the vCDN's headless
    // Service in the region, which lists the pod.
    let svc = services
        .get(&format!("vcdn-{id}-paris"))
        .await
        .expect("the vCDN's Service in paris");
    assert_eq!(
        svc.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("None"),
        "headless"
    );
    let sel = ListParams::default().labels(&format!("kubernetes.io/service-name=vcdn-{id}-paris"));
    let listed: Vec<(String, String)> = slices
        .list(&sel)
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|s| s.endpoints.clone())
        .map(|e| {
            (
                e.target_ref.and_then(|t| t.name).unwrap_or_default(),
                e.addresses.join(","),
            )
        })
        .collect();
    assert_eq!(listed, vec![(p[0].0.clone(), ip.to_string())], "its slice");

    // The control plane's /metrics shows the cluster.
    let m = up.api_client().get("/metrics").await;
    let m = String::from_utf8_lossy(&m.body).into_owned();
    for line in [
        "vcdn_kubernetes_cluster_up{region=\"paris\"} 1",
        "vcdn_kubernetes_nodes{region=\"paris\"} 1",
        "vcdn_kubernetes_pods{region=\"paris\",phase=\"Running\"} 1",
    ] {
        assert!(m.contains(line), "no {line} in /metrics:\n{m}");
    }

    // DNS from Paris's client range answers with the pod's IP; a GET
    // through it is a MISS, then a HIT.
    assert_eq!(
        resolve(dns, "127.1.0.1", "kube.example"),
        vec![ip.to_string()]
    );
    let cache = SocketAddr::new(ip, up.instance_port);
    let get = || support::get_with(cache, "/size/4096", &[("Host", "kube.example")]);
    let r = get().await;
    assert_eq!(r.status(), 200);
    assert!(x_cache(&r).starts_with("MISS"), "{}", x_cache(&r));
    assert!(x_cache(&get().await).starts_with("HIT"));

    // A region on the node's network: its cache listens on the node's
    // address (no pod IP), DNS answers that, and the node takes one cache
    // of the region (every cache listens on the same port), whatever
    // Paris's pod holds.
    {
        let (_, hosts) = up.call(OP, "GET", "/v1/hosts", None).await;
        assert!(
            hosts["hosts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h["region"] == "lyon" && h["max_instances"] == 1),
            "{hosts}"
        );
        let on_node = up.order("onnode", "lyon", 10).await;
        let (_, s) = up
            .call(OP, "GET", &format!("/v1/services/{on_node}"), None)
            .await;
        let lyon = instances(&s, "lyon");
        assert_eq!(lyon.len(), 1, "{s}");
        assert_eq!(
            lyon[0]["address"],
            format!("10.244.0.1:{}", up.instance_port),
            "the node's address: {s}"
        );
        let p = pods_of(&pods, &on_node).await;
        let pod: Pod = pods.get(&p[0].0).await.unwrap();
        assert_eq!(pod.spec.as_ref().unwrap().host_network, Some(true));
        assert_eq!(
            resolve(dns, "127.2.0.1", "onnode.example"),
            vec!["10.244.0.1".to_string()]
        );
        let cache = SocketAddr::from(([10, 244, 0, 1], up.instance_port));
        let get = || support::get_with(cache, "/size/4096", &[("Host", "onnode.example")]);
        let r = get().await;
        assert_eq!(r.status(), 200);
        assert!(x_cache(&r).starts_with("MISS"), "{}", x_cache(&r));
        assert!(x_cache(&get().await).starts_with("HIT"));
        // A second is refused (on this 2-CPU node Paris's pod and this one
        // also hold all its CPUs; the planner's tests show the slot alone
        // refusing one).
        assert_refused(
            &up,
            order_spec("second", origin, "lyon", 10),
            409,
            "region lyon",
        )
        .await;
        let (st, _) = up
            .call(OP, "DELETE", &format!("/v1/services/{on_node}"), None)
            .await;
        assert!(st == 202 || st == 200 || st == 204, "{st}");
        assert!(
            eventually(30, || async {
                pods_of(&pods, &on_node).await.is_empty()
                    && services
                        .get_opt(&format!("vcdn-{on_node}-lyon"))
                        .await
                        .unwrap()
                        .is_none()
            })
            .await,
            "the host-network pod or its service is left"
        );
    }

    // A pod deleted behind vcdn's back (kubectl delete pod) is replaced,
    // the event says so, and DNS follows the new IP.
    let t1 = Instant::now();
    pods.delete(&p[0].0, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let healed = eventually(30, || async {
        let now = pods_of(&pods, &id).await;
        now.len() == 1 && now[0].0 != p[0].0 && now[0].2 && {
            let (_, s) = up
                .call(OP, "GET", &format!("/v1/services/{id}"), None)
                .await;
            s["state"] == "active"
                && instances(&s, "paris")[0]["address"]
                    == format!("{}:{}", now[0].1, up.instance_port)
        }
    })
    .await;
    assert!(
        healed,
        "the deleted pod was not replaced: {:?}",
        pods_of(&pods, &id).await
    );
    eprintln!("deleted pod replaced and serving in {:?}", t1.elapsed());
    let now = pods_of(&pods, &id).await;
    assert!(
        eventually(5, || async {
            resolve(dns, "127.1.0.1", "kube.example") == vec![now[0].1.clone()]
        })
        .await,
        "DNS answers the new pod: {:?}",
        resolve(dns, "127.1.0.1", "kube.example")
    );
    let cache = SocketAddr::new(now[0].1.parse().unwrap(), up.instance_port);
    let r = support::get_with(cache, "/size/4096", &[("Host", "kube.example")]).await;
    assert_eq!(r.status(), 200, "the region keeps answering");
    let (_, ev) = up
        .call(OP, "GET", &format!("/v1/services/{id}/events"), None)
        .await;
    assert!(
        ev.to_string()
            .contains("(its pod) was gone; replaced by a new pod serving"),
        "{ev}"
    );

    // Load on the pod (40 viewers' connections; one carries 20 at MOS 4):
    // the supervisor scales Paris out with a second pod.
    let conns: Vec<std::net::TcpStream> = (0..40)
        .map(|_| std::net::TcpStream::connect(cache).unwrap())
        .collect();
    let scaled = eventually(30, || async {
        pods_of(&pods, &id).await.iter().filter(|p| p.2).count() >= 2
    })
    .await;
    assert!(
        scaled,
        "no scale-out under load: {:?}",
        pods_of(&pods, &id).await
    );
    assert!(
        eventually(5, || async {
            resolve(dns, "127.1.0.1", "kube.example").len() >= 2
        })
        .await,
        "the router answers with the new pod too"
    );

    // A cache that dies in its pod leaves the DNS answers within a second
    // (the router polls its /healthz like a local cache's), and is
    // replaced.
    // (The new one: the viewers' connections stay on the first.)
    let two = pods_of(&pods, &id).await;
    let victim = two
        .iter()
        .find(|p| p.1 != cache.ip().to_string())
        .expect("a second pod");
    let pid = cache_pid_in_pod(&pods, &victim.0).await;
    let t2 = Instant::now();
    // SAFETY: signalling the pod's cache process.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let left = eventually(5, || async {
        !resolve(dns, "127.1.0.1", "kube.example").contains(&victim.1)
    })
    .await;
    let out_in = t2.elapsed();
    assert!(left, "the dead pod's IP stays in the answers");
    eprintln!("a dead pod's IP left the DNS answers in {out_in:?}");
    assert!(out_in < Duration::from_secs(1), "{out_in:?}");
    assert!(
        eventually(30, || async {
            let now = pods_of(&pods, &id).await;
            now.iter().filter(|p| p.2).count() == 2 && !now.iter().any(|p| p.0 == victim.0)
        })
        .await,
        "the pod whose cache died was not replaced: {:?}",
        pods_of(&pods, &id).await
    );

    // A control plane restarted adopts its pods (no new pod) and deletes
    // one of its own that no record owns; pods of other owners stay.
    let before = pods_of(&pods, &id).await;
    // (Each pod caches the object now: the demo origin goes with this
    // vcdn up, and a pod serves it later without the cluster's API.)
    for p in &before {
        let at = SocketAddr::new(p.1.parse().unwrap(), up.instance_port);
        let r = support::get_with(at, "/size/4096", &[("Host", "kube.example")]).await;
        assert_eq!(r.status(), 200);
    }
    let owner = pods
        .get(&before[0].0)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap()["vcdn.io/control-plane"]
        .clone();
    up.kill();
    let stray: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vcdn-i-stray", "labels": {
            "app.kubernetes.io/managed-by": "vcdn", "vcdn.io/control-plane": owner,
            "vcdn.io/region": "paris", "vcdn.io/instance": "i-stray"}, "annotations": {"vcdn.io/identity": "i-stray.0"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "vcdn.local/pause:1"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &stray).await.unwrap();
    let foreign: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "not-vcdns", "labels": {"vcdn.io/control-plane": "someone-else"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": "vcdn.local/pause:1"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &foreign).await.unwrap();
    up.relaunch();
    let (_, s) = up
        .call(OP, "GET", &format!("/v1/services/{id}"), None)
        .await;
    assert_eq!(s["state"], "active", "{s}");
    assert_eq!(
        pods_of(&pods, &id).await,
        before,
        "the pods were adopted, not re-created"
    );
    assert!(
        eventually(15, || async {
            pods.get_opt("vcdn-i-stray").await.unwrap().is_none()
        })
        .await,
        "the stray pod was not deleted"
    );
    assert!(
        pods.get_opt("not-vcdns").await.unwrap().is_some(),
        "another owner's pod was touched"
    );
    pods.delete("not-vcdns", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let (_, ev) = up
        .call(OP, "GET", &format!("/v1/services/{id}/events"), None)
        .await;
    assert!(
        ev.to_string().contains("2 instances adopted, 0 re-created"),
        "{ev}"
    );

    // The viewers leave: scale-in drains a pod and deletes it.
    drop(conns);
    let shrunk = eventually(60, || async { pods_of(&pods, &id).await.len() == 1 }).await;
    assert!(shrunk, "no scale-in: {:?}", pods_of(&pods, &id).await);
    let (_, ev) = up
        .call(OP, "GET", &format!("/v1/services/{id}/events"), None)
        .await;
    assert!(ev.to_string().contains("scaled_in"), "{ev}");

    // More than the node holds: a 409 naming the region and the shortfall.
    assert_refused(
        &up,
        order_spec("toobig", origin, "paris", 60),
        409,
        "region paris lacks",
    )
    .await;

    // The cluster's API goes away: /metrics and an order for the region
    // say so, the pods keep serving, and nothing is replaced on stale
    // knowledge; once the API is back, the watches resume.
    let kept = pods_of(&pods, &id).await;
    let cache = SocketAddr::new(kept[0].1.parse().unwrap(), up.instance_port);
    let restart_apiserver = stop_apiserver(&cluster);
    let metric = |v: u8| format!("vcdn_kubernetes_cluster_up{{region=\"paris\"}} {v}");
    let metrics = || async {
        let m = up.api_client().get("/metrics").await;
        String::from_utf8_lossy(&m.body).into_owned()
    };
    assert!(
        eventually(20, || async { metrics().await.contains(&metric(0)) }).await,
        "/metrics does not say the cluster is down"
    );
    assert_refused(
        &up,
        order_spec("during", origin, "paris", 10),
        409,
        "does not answer",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = support::get_with(cache, "/size/4096", &[("Host", "kube.example")]).await;
    assert_eq!(
        r.status(),
        200,
        "the pods serve without the cluster's API: {}",
        String::from_utf8_lossy(&r.body)
    );
    let (_, s) = up
        .call(OP, "GET", &format!("/v1/services/{id}"), None)
        .await;
    assert_eq!(s["state"], "active", "{s}");
    restart_apiserver();
    assert!(
        eventually(45, || async { metrics().await.contains(&metric(1)) }).await,
        "the watches did not resume"
    );
    assert_eq!(
        pods_of(&pods, &id).await,
        kept,
        "no pod was replaced during the outage"
    );
    // The kubelet's own watch comes back after a backoff of its own: a
    // pod that runs says it has (the next steps start pods).
    kubelet_runs_pods_again(&k).await;

    // Delete: every object vcdn made goes.
    let (st, _) = up
        .call(OP, "DELETE", &format!("/v1/services/{id}"), None)
        .await;
    assert!(st == 202 || st == 200 || st == 204, "{st}");
    let gone = eventually(30, || async {
        let sel = ListParams::default().labels("app.kubernetes.io/managed-by=vcdn");
        pods.list(&sel).await.unwrap().items.is_empty()
            && secrets.list(&sel).await.unwrap().items.is_empty()
            && services.list(&sel).await.unwrap().items.is_empty()
    })
    .await;
    assert!(
        gone,
        "pods, secrets or services are left: {:?} {:?}",
        pods_of(&pods, &id).await,
        services
            .list(&Default::default())
            .await
            .map(|l| l.items.len())
    );

    // A lease that ends removes the pods as well.
    let mut short = order_spec("short", origin, "paris", 10);
    short["lease"] = serde_json::json!({"duration_s": 3});
    let (st, s) = up
        .call(&up.demo_key(), "POST", "/v1/services", Some(short))
        .await;
    assert_eq!(st, 201, "{s}");
    let sid = s["id"].as_str().unwrap().to_string();
    assert_eq!(pods_of(&pods, &sid).await.len(), 1);
    let ended = eventually(30, || async {
        let (_, s) = up
            .call(OP, "GET", &format!("/v1/services/{sid}"), None)
            .await;
        s["state"] == "expired" && pods_of(&pods, &sid).await.is_empty()
    })
    .await;
    assert!(
        ended,
        "the lease's end left pods: {:?}",
        pods_of(&pods, &sid).await
    );

    // The control plane itself in a pod, reaching the cluster `in-cluster`.
    up.kill();
    in_cluster_control_plane(&cluster, &k, tag, &model).await;
}

/// `vcdn up` in a pod of the cluster (its image, the service account
/// `vcdn` of `rbac.json`, the node's network), its region paris
/// `kubernetes:in-cluster`: it reads the token and CA the kubelet mounts
/// and the API's address from `KUBERNETES_SERVICE_HOST`/`_PORT`. Here
/// those name the apiserver itself, as an operator without kube-proxy sets
/// them (the `kubernetes` Service's ClusterIP does not route). Its caches
/// become pods, serve, and go with the order.
async fn in_cluster_control_plane(cluster: &Cluster, k: &kube::Client, tag: &str, model: &str) {
    let data = tempdir("kube-in-cluster");
    // The image runs as nobody.
    std::os::unix::fs::chown(&*data, Some(65534), Some(65534)).unwrap();
    std::fs::copy(model, data.join("capacity.toml")).unwrap();
    let up = Up {
        child: None,
        dir: data,
        api: SocketAddr::from(([127, 0, 0, 1], free_port())),
        origin: SocketAddr::from(([10, 244, 0, 1], free_port())),
        instance_port: free_port(),
        instance_tls_port: free_port(),
        ports: [free_port(), free_port(), free_port(), free_port()],
        extra: Vec::new(),
        started: true,
        greeting: Vec::new(),
    };
    let [dns, http, router, admin] = up.ports;
    let at = |p: u16| format!("127.0.0.1:{p}");
    let args = [
        "up",
        "--data-dir",
        "/data",
        "--api",
        &up.api.to_string(),
        "--dns",
        &at(dns),
        "--http",
        &at(http),
        "--router-admin",
        &at(router),
        "--operator-token",
        OP,
        "--demo",
        "--demo-origin",
        &up.origin.to_string(),
        "--instance-port",
        &up.instance_port.to_string(),
        "--instance-tls-port",
        &up.instance_tls_port.to_string(),
        "--instance-admin-port",
        &admin.to_string(),
        "--region-vim",
        &format!("paris=kubernetes:in-cluster?namespace=vcdn&image={tag}"),
        "--capacity-model",
        "/data/capacity.toml",
    ];
    let spec = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "vcdn-up", "namespace": "vcdn"},
        "spec": {
            "serviceAccountName": "vcdn",
            "hostNetwork": true,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "up", "image": tag, "imagePullPolicy": "Never", "args": args,
                "env": [
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": cluster.port.to_string()},
                    {"name": "VCDN_LOG", "value": "warn"},
                ],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "hostPath": {"path": up.dir.to_str().unwrap(), "type": "Directory"}}],
        }
    });
    let pods: Api<Pod> = Api::namespaced(k.clone(), "vcdn");
    let t0 = Instant::now();
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(spec).unwrap(),
    )
    .await
    .expect("the control plane's pod is accepted");
    let started = eventually(60, || async {
        up.dir.join("demo-customer-key").exists()
            && up
                .api_client()
                .request("GET", "/healthz", &[], b"")
                .await
                .is_ok_and(|r| r.status() == 200)
    })
    .await;
    let status = |p: Option<Pod>| format!("{:?}", p.and_then(|p| p.status));
    assert!(
        started,
        "vcdn up did not start in its pod: {}\n{}",
        status(pods.get_opt("vcdn-up").await.unwrap()),
        cluster.logs()
    );
    eprintln!(
        "vcdn up in a pod answers {:?} after its creation",
        t0.elapsed()
    );
    // Its region's host is the cluster's node, seen with the pod's token.
    let (st, hosts) = up.call(OP, "GET", "/v1/hosts", None).await;
    assert_eq!(st, 200, "{hosts}");
    assert!(
        hosts["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["region"] == "paris" && h["name"] == "vcdn-node"),
        "{hosts}"
    );
    let id = up.order("inside", "paris", 10).await;
    let p = pods_of(&pods, &id).await;
    assert_eq!(p.len(), 1, "{p:?}");
    let cache = SocketAddr::new(p[0].1.parse().unwrap(), up.instance_port);
    let get = || support::get_with(cache, "/size/4096", &[("Host", "inside.example")]);
    let r = get().await;
    assert_eq!(r.status(), 200);
    assert!(x_cache(&r).starts_with("MISS"), "{}", x_cache(&r));
    assert!(x_cache(&get().await).starts_with("HIT"));
    let (st, _) = up
        .call(OP, "DELETE", &format!("/v1/services/{id}"), None)
        .await;
    assert!(st == 202 || st == 200 || st == 204, "{st}");
    assert!(
        eventually(30, || async { pods_of(&pods, &id).await.is_empty() }).await,
        "the order's pods are left: {:?}",
        pods_of(&pods, &id).await
    );
    pods.delete("vcdn-up", &DeleteParams::default())
        .await
        .expect("the control plane's pod goes");
}

/// Waits until a pause pod runs: the kubelet sees new pods again.
async fn kubelet_runs_pods_again(k: &kube::Client) {
    let api: Api<Pod> = Api::namespaced(k.clone(), "default");
    let probe: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kubelet-probe"},
        "spec": {"terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "vcdn.local/pause:1"}]}
    }))
    .unwrap();
    api.create(&PostParams::default(), &probe).await.unwrap();
    let runs = eventually(90, || async {
        api.get("kubelet-probe")
            .await
            .ok()
            .and_then(|p| p.status?.phase)
            .as_deref()
            == Some("Running")
    })
    .await;
    assert!(
        runs,
        "the kubelet did not run a pod within 90 s of the apiserver's return"
    );
    api.delete("kubelet-probe", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// Kills the cluster's apiserver; the closure starts it again as it was.
fn stop_apiserver(c: &Cluster) -> impl FnOnce() + '_ {
    let pidfile = c.dir.join("apiserver.pid");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let cmdline: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    // SAFETY: signalling the apiserver this test's cluster started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    move || {
        let log = std::fs::File::create(c.dir.join("log/apiserver-again.log")).unwrap();
        let child = Command::new("setsid")
            .args(&cmdline)
            .current_dir(&*c.dir)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        std::fs::write(&pidfile, child.id().to_string()).unwrap();
        // Reaped when kube-cluster.sh stop kills it.
        let mut child = child;
        std::thread::spawn(move || child.wait());
    }
}

/// The pid of the `vcdn cache` process in a pod (this host's kernel runs
/// the node's containers): the one with the pod's instance identity.
async fn cache_pid_in_pod(pods: &Api<Pod>, name: &str) -> u32 {
    let p = pods.get(name).await.unwrap();
    let identity = p.metadata.annotations.unwrap()["vcdn.io/identity"].clone();
    support::up::live_processes()
        .into_iter()
        .find(|(_, args)| {
            args.iter().any(|a| a == &identity) && args.get(1).map(String::as_str) == Some("cache")
        })
        .map(|(pid, _)| pid)
        .unwrap_or_else(|| panic!("no cache process of pod {name} ({identity})"))
}

/// Order → active (the POST answers once every instance answers its
/// `/healthz` and the router has it) for a region on Kubernetes, pod start
/// included, and for a local region, interleaved in one run. Run by
/// `bench/kubernetes.sh`; prints a Markdown table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: bench/kubernetes.sh"]
async fn order_to_active_on_kubernetes_beside_local() {
    const N: usize = 10;
    let cluster = Cluster::start("kube-bench");
    let tag = "vcdn.local/vcdn:bench";
    import_image(&cluster, tag);
    let origin = SocketAddr::from(([10, 244, 0, 1], free_port()));
    let vim = format!(
        "paris=kubernetes:{}?namespace=vcdn-bench&image={tag}",
        cluster.kubeconfig().display()
    );
    let host_vim = format!(
        "marseille=kubernetes:{}?namespace=vcdn-bench&image={tag}&network=host",
        cluster.kubeconfig().display()
    );
    let up = Up::start_with_origin(
        "kube-bench-up",
        origin,
        &["--region-vim", &vim, "--region-vim", &host_vim],
    );
    let k = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(k, "vcdn-bench");
    let key = up.demo_key();
    let mut took: [Vec<f64>; 3] = Default::default();
    for n in 0..N {
        for (d, region) in ["paris", "marseille", "lyon"].iter().enumerate() {
            let name = format!("b{d}x{n}");
            let spec = order_spec(&name, origin, region, 10);
            let t = Instant::now();
            let (st, s) = up.call(&key, "POST", "/v1/services", Some(spec)).await;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(st, 201, "{s}");
            assert_eq!(s["state"], "active", "{s}");
            took[d].push(ms);
            let id = s["id"].as_str().unwrap().to_string();
            let (st, _) = up
                .call(OP, "DELETE", &format!("/v1/services/{id}"), None)
                .await;
            assert!(st < 300);
            // The node's CPU is free again before the next order.
            assert!(eventually(30, || async { pods_of(&pods, &id).await.is_empty() }).await);
        }
    }
    println!("| region's VIM | orders | min (ms) | median (ms) | max (ms) |");
    println!("|---|---|---|---|---|");
    for (d, what) in [
        "kubernetes, pod IPs (pod start included)",
        "kubernetes, host network (pod start included)",
        "local (process)",
    ]
    .iter()
    .enumerate()
    {
        let v = &mut took[d];
        v.sort_by(f64::total_cmp);
        println!(
            "| {what} | {} | {:.0} | {:.0} | {:.0} |",
            v.len(),
            v[0],
            v[v.len() / 2],
            v[v.len() - 1]
        );
    }
}

/// A region's cluster that does not answer does not stop the platform:
/// `vcdn up` starts, the local regions serve, and an order for that region
/// gets a 409 that says its cluster does not answer. A region VIM that
/// cannot be read, or names no region, is refused at start, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_said_and_a_bad_region_vim_refused() {
    let dir = tempdir("kube-gone");
    let closed = free_port();
    let kubeconfig = dir.join("gone.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: gone, cluster: {{server: \"https://127.0.0.1:{closed}\", insecure-skip-tls-verify: true}}}}]\nusers: [{{name: u, user: {{token: x}}}}]\ncontexts: [{{name: c, context: {{cluster: gone, user: u}}}}]\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    let vim = format!("paris=kubernetes:{}", kubeconfig.display());
    let up = Up::start("kube-gone-up", &["--region-vim", &vim]);
    assert_refused(
        &up,
        order_spec("p", up.origin, "paris", 10),
        409,
        "Kubernetes cluster of region paris does not answer",
    )
    .await;
    let (st, s) = up
        .call(
            &up.demo_key(),
            "POST",
            "/v1/services",
            Some(order_spec("l", up.origin, "lyon", 10)),
        )
        .await;
    assert_eq!(st, 201, "a local region serves: {s}");

    let data = tempdir("kube-bad");
    let d = data.to_str().unwrap();
    let err = support::refused_to_start(&[
        "up",
        "--data-dir",
        d,
        "--region-vim",
        "paris=kubernetes:/nonexistent/kubeconfig",
    ]);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
    let err = support::refused_to_start(&[
        "up",
        "--data-dir",
        d,
        "--region-vim",
        &format!("atlantis=kubernetes:{}", kubeconfig.display()),
    ]);
    assert!(
        err.contains("no such region") && err.contains("paris"),
        "{err}"
    );
    let err =
        support::refused_to_start(&["up", "--data-dir", d, "--region-vim", "paris=openstack:x"]);
    assert!(err.contains("unknown VIM"), "{err}");
}
