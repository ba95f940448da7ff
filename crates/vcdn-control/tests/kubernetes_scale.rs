//! The kubernetes VIM at scale, on a cluster of 300 nodes that kwok
//! simulates (`scripts/kube-cluster.sh start-kwok`: a real etcd,
//! kube-apiserver, controller-manager and scheduler; kwok plays the
//! kubelets, so pods go Running and Ready with IPs and nothing executes).
//! What it checks is the driver's object handling where a real node could
//! not go: capacity read from hundreds of nodes, the planner's placement
//! honoured by the scheduler, a restart finding every pod it owns (and
//! none of another control plane's), and every object gone after a stop.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use vcdn_control::kubernetes::{KubeRegion, KubeVim};
use vcdn_control::planner::{self, Fleet};
use vcdn_control::types::Region;
use vcdn_control::vim::{InstanceSpec, Vim};

const NODES: usize = 300;
const INSTANCES: u32 = 200;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kube-cluster.sh")
}

struct Kwok {
    dir: PathBuf,
    port: u16,
}

impl Kwok {
    fn start() -> Kwok {
        let dir = std::env::temp_dir().join(format!("vcdn-test-kwok-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // The apiserver's port and the five after it, all free.
        let port = (0..200)
            .map(|i| 33_000 + (std::process::id() as u16 % 300) * 20 + i * 7)
            .find(|p| (0..6).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()))
            .expect("free ports");
        let k = Kwok { dir, port };
        let out = Command::new("bash")
            .arg(script())
            .args(["start-kwok"])
            .arg(&k.dir)
            .arg(NODES.to_string())
            .env("KUBE_PORT", port.to_string())
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "kube-cluster.sh start-kwok: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        k
    }

    fn region(&self, namespace: &str) -> KubeRegion {
        KubeRegion {
            region: "paris".into(),
            kubeconfig: Some(self.dir.join("kubeconfig")),
            namespace: namespace.into(),
            node_selector: BTreeMap::from([("type".to_string(), "kwok".to_string())]),
            image: "vcdn.local/vcdn:test".into(),
            host_network: false,
        }
    }
}

impl Drop for Kwok {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .env("KUBE_PORT", self.port.to_string())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spec(i: &vcdn_control::types::Instance) -> InstanceSpec {
    InstanceSpec {
        id: i.id.clone(),
        region: "paris".into(),
        service: "s-scale".into(),
        customer: "c-scale".into(),
        host: i.host.clone(),
        identity: format!("{}.n0", i.id),
        listen: i.address.parse().unwrap(),
        admin: i.admin.parse().unwrap(),
        admin_token: "t".repeat(32),
        upstream: "http://192.0.2.1".into(),
        origin_policy: String::new(),
        origin_ca_pem: None,
        vcpus: i.vcpus,
        cpu_quota: i.vcpus as f64,
        memory_mib: i.memory_mib,
        proxy: None,
        tls_listen: None,
        admin_tls: None,
        admin_name: None,
        telemetry: None,
        srv6: None,
    }
}

fn until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

#[test]
fn hundreds_of_nodes_placement_restart_and_cleanup() {
    let kwok = Kwok::start();
    let t = Instant::now();
    let vim = KubeVim::connect(kwok.region("vcdn-scale"), "vcdn-owner-a").expect("connects");
    assert!(
        until(20, || vim.hosts().len() == NODES),
        "{} nodes seen",
        vim.hosts().len()
    );
    eprintln!(
        "{NODES} nodes seen as hosts {:?} after connect",
        t.elapsed()
    );

    // Another workload's request comes off a node's capacity.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async {
        let k = kube::config::Kubeconfig::read_from(kwok.dir.join("kubeconfig")).unwrap();
        let c = kube::Config::from_custom_kubeconfig(k, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(c).unwrap()
    });
    let default: Api<Pod> = Api::namespaced(client.clone(), "default");
    let other: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "someone-else"},
        "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "c", "image": "x",
            "resources": {"requests": {"cpu": "3", "memory": "6Gi"}}}]}
    }))
    .unwrap();
    rt.block_on(default.create(&PostParams::default(), &other))
        .unwrap();
    let node0 = || vim.hosts().into_iter().find(|h| h.name == "kwok-node-0");
    assert!(
        until(10, || node0()
            .is_some_and(|h| h.vcpus == 1 && h.memory_mib == 2048)),
        "kwok-node-0 keeps 1 vCPU and 2 GiB: {:?}",
        node0()
    );
    let hosts = vim.hosts();
    assert!(hosts
        .iter()
        .filter(|h| h.name != "kwok-node-0")
        .all(|h| h.vcpus == 4 && h.memory_mib == 8192));

    // The planner places 200 two-vCPU instances over the nodes; each pod
    // lands on its planned node.
    let region = Region {
        name: "paris".into(),
        instance_block: "127.10.0.0/16".into(),
        clients: vec![],
        lat: None,
        lon: None,
    };
    let mut flavor = vcdn_control::defaults::Defaults::embedded()
        .flavors
        .into_iter()
        .find(|f| f.name == "elastic")
        .unwrap();
    flavor.template.vcpus_per_instance = 2;
    flavor.template.memory_mib_per_instance = 1024;
    let fleet = Fleet {
        hosts: &hosts,
        services: &[],
        instance_port: 8080,
        admin_port: 8081,
    };
    let mut n = 0;
    let placed = planner::place_more(
        &fleet,
        &region,
        &flavor.template,
        INSTANCES,
        &mut || {
            n += 1;
            format!("i-{n:05}")
        },
        0,
    )
    .expect("room for 200 instances");
    assert!(placed
        .iter()
        .all(|i| i.host != "kwok-node-0" || i.vcpus <= 1));
    let t = Instant::now();
    for i in &placed {
        vim.start(&spec(i)).expect("pod created");
    }
    eprintln!("{INSTANCES} pods created in {:?}", t.elapsed());
    // Addresses come from the EndpointSlices of the vCDN's Service.
    assert!(
        until(120, || placed.iter().all(|i| vim.address(&i.id).is_some())),
        "{} of {INSTANCES} pods got an address in an EndpointSlice",
        placed
            .iter()
            .filter(|i| vim.address(&i.id).is_some())
            .count()
    );
    eprintln!(
        "all {INSTANCES} pods running with an IP after {:?}",
        t.elapsed()
    );
    let ours: Api<Pod> = Api::namespaced(client.clone(), "vcdn-scale");
    let listed = rt.block_on(ours.list(&ListParams::default())).unwrap();
    let on: HashMap<String, String> = listed
        .items
        .iter()
        .map(|p| {
            (
                p.metadata.labels.as_ref().unwrap()["vcdn.io/instance"].clone(),
                p.spec
                    .as_ref()
                    .unwrap()
                    .node_name
                    .clone()
                    .unwrap_or_default(),
            )
        })
        .collect();
    for i in &placed {
        assert_eq!(
            on.get(&i.id),
            Some(&i.host),
            "instance {} on its planned node",
            i.id
        );
        assert!(vim.alive(&i.id, None, &format!("{}.n0", i.id)));
        assert!(
            !vim.alive(&i.id, None, "someone.else"),
            "an identity it was not started with"
        );
    }

    // A restarted control plane (same owner) finds every pod with its
    // identity and IP; another control plane finds none of them.
    drop(vim);
    let again = KubeVim::connect(kwok.region("vcdn-scale"), "vcdn-owner-a").unwrap();
    let stranger = KubeVim::connect(kwok.region("vcdn-scale"), "vcdn-owner-b").unwrap();
    let marked = again.marked();
    assert_eq!(marked.len(), INSTANCES as usize);
    assert!(marked
        .iter()
        .all(|m| m.ip.is_some() && m.identity.ends_with(".n0")));
    assert!(stranger.marked().is_empty());
    stranger.stop(&placed[0].id, None);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        again.alive(&placed[0].id, None, &format!("{}.n0", placed[0].id)),
        "another control plane's stop touches nothing of ours"
    );

    // Stopping every instance removes every object; the other workload
    // stays.
    let t = Instant::now();
    for i in &placed {
        again.stop(&i.id, None);
    }
    let sel = ListParams::default().labels("app.kubernetes.io/managed-by=vcdn");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "vcdn-scale");
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), "vcdn-scale");
    assert!(
        until(120, || {
            rt.block_on(ours.list(&sel)).unwrap().items.is_empty()
                && rt.block_on(secrets.list(&sel)).unwrap().items.is_empty()
                && rt.block_on(services.list(&sel)).unwrap().items.is_empty()
        }),
        "pods, secrets or the service are left"
    );
    eprintln!(
        "all {INSTANCES} pods, secrets and their service gone {:?} after the stops",
        t.elapsed()
    );
    assert!(rt
        .block_on(default.get_opt("someone-else"))
        .unwrap()
        .is_some());
}
