//! `vcdn up`: the control plane, the router and (with `--demo`) a demo
//! origin and customer, all with embedded defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct UpArgs {
    /// Where state lives (SQLite store, tokens, instance logs).
    #[arg(long, default_value = "vcdn-data", env = "VCDN_DATA_DIR")]
    data_dir: PathBuf,
    /// PostgreSQL URL for the store (instead of SQLite in the data dir).
    #[arg(long, env = "VCDN_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// The REST API (/v1), /metrics and /healthz.
    #[arg(long, default_value = "127.0.0.1:8070", env = "VCDN_API_LISTEN")]
    api: SocketAddr,
    /// The request router's DNS (UDP and TCP).
    #[arg(long, default_value = "127.0.0.1:5353", env = "VCDN_DNS_LISTEN")]
    dns: SocketAddr,
    /// The request router's HTTP routing (302 to a cache).
    #[arg(long, default_value = "127.0.0.1:8053", env = "VCDN_HTTP_LISTEN")]
    http: SocketAddr,
    /// The request router's admin API.
    #[arg(long, default_value = "127.0.0.1:8054", env = "VCDN_ROUTER_ADMIN")]
    router_admin: SocketAddr,
    /// The operator's bearer token [default: generated once, kept in the data dir].
    #[arg(long, env = "VCDN_OPERATOR_TOKEN", hide_env_values = true)]
    operator_token: Option<String>,
    /// Capacity model (TOML, see vcdn-model) [default: the paper's figures].
    #[arg(long, env = "VCDN_CAPACITY_MODEL")]
    capacity_model: Option<PathBuf>,
    /// Port every cache instance serves users on (each has its own address).
    #[arg(long, default_value_t = 8080)]
    instance_port: u16,
    /// Port of every cache instance's control API.
    #[arg(long, default_value_t = 9080)]
    instance_admin_port: u16,
    /// Port every cache instance serves HTTPS (HTTP/1.1 and HTTP/2) on,
    /// with its service's certificate, uploaded or issued by the internal
    /// CA; 0: caches serve plain HTTP only.
    #[arg(long, default_value_t = 8443)]
    instance_tls_port: u16,
    /// CPU time one instance vCPU gets on this host (a test bed emulates
    /// small vCPUs with a fraction; calibrate with the same share).
    #[arg(long, default_value_t = 1.0, env = "VCDN_VCPU_SHARE")]
    vcpu_share: f64,
    /// Start even though the data directory's store is missing, emptied or
    /// replaced, or cache instances of this data directory run with no
    /// record: the database is taken as found (new if missing) and those
    /// instances are stopped.
    #[arg(long)]
    reinitialise_store: bool,
    /// Serve the API with this certificate chain (PEM, server certificate
    /// first) instead of the self-signed one made in the data directory.
    #[arg(long, requires = "tls_key", env = "VCDN_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", env = "VCDN_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Serve the API in plain HTTP (tokens in clear): only on a loopback
    /// --api address.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    plain_http: bool,
    /// UDP port of telemetry discovery: the control plane is the tracker
    /// and takes every cache's edge.stats over telemetry; 0: no telemetry
    /// (every instance is polled).
    #[arg(long, default_value_t = 12555, env = "VCDN_TELEMETRY_DISCOVERY_PORT")]
    telemetry_discovery_port: u16,
    /// Where telemetry discovery broadcasts go (the caches' segment).
    #[arg(
        long,
        default_value = "127.255.255.255",
        env = "VCDN_TELEMETRY_BROADCAST"
    )]
    telemetry_broadcast: std::net::IpAddr,
    /// Never poll the instances' GET /stats: telemetry alone (an instance
    /// with no fresh edge.stats record for 30 s counts as unresponsive).
    /// The operator's settings (telemetry.stats_polling) can also turn
    /// polling off.
    #[arg(long)]
    no_stats_polling: bool,
    /// Run a Kafka data sink (a broker on 127.0.0.1, its data in
    /// DATA_DIR/kafka) and bill the caches' requests and bytes through it:
    /// their edge.stats records go to Kafka with acks from all replicas and
    /// are billed exactly once as they arrive. Needs the Kafka distribution
    /// that scripts/kafka.sh fetches.
    #[arg(long, env = "VCDN_KAFKA")]
    kafka: bool,
    /// Offer routing "srv6" (chunk addresses dispatched in the kernel):
    /// build the SR domain on this host (a PoP namespace with the
    /// dispatcher, a namespace per edge; needs root, IPv6 and the kernel's
    /// SRv6 BPF, or vcdn up says which is missing and stops).
    #[arg(long, env = "VCDN_SRV6")]
    srv6: bool,
    /// The Kafka broker's client port (with --kafka).
    #[arg(long, default_value_t = 9092, env = "VCDN_KAFKA_PORT")]
    kafka_port: u16,
    /// The Kafka controller's port (with --kafka).
    #[arg(long, default_value_t = 9093, env = "VCDN_KAFKA_CONTROLLER_PORT")]
    kafka_controller_port: u16,
    /// Failed authentications (API or portal login) one source may make in
    /// a minute; then it gets 429 until the minute is over, whatever it
    /// sends.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..), env = "VCDN_AUTH_FAILURES_PER_MINUTE")]
    auth_failures_per_minute: u32,
    /// A region whose instances are pods of a Kubernetes cluster instead
    /// of local processes: NAME=kubernetes:KUBECONFIG (a path, or
    /// in-cluster), optionally followed by ?namespace=NS (default vcdn),
    /// &node-selector=K=V,K=V (the nodes that are its hosts),
    /// &image=REF (default the image `vcdn image` builds from this binary)
    /// and &network=host (caches on their nodes' own network and address,
    /// one per node; default pod: pod IPs). Repeat for more regions.
    #[arg(long = "region-vim", value_name = "NAME=kubernetes:KUBECONFIG", value_parser = vcdn_control::kubernetes::KubeRegion::parse)]
    region_vims: Vec<vcdn_control::kubernetes::KubeRegion>,
    /// Also run a demo origin and make a demo customer.
    #[arg(long)]
    demo: bool,
    /// Where the demo origin listens.
    #[arg(long, default_value = "127.0.0.1:9000")]
    demo_origin: SocketAddr,
    /// The demo origin's decodable titles [default --video-dir: DATA_DIR/video].
    #[command(flatten)]
    video: crate::video_args::VideoArgs,
}

pub fn run(a: UpArgs) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    if a.vcpu_share.is_nan() || !(0.01..=64.0).contains(&a.vcpu_share) {
        return Err("--vcpu-share must be from 0.01 to 64".into());
    }
    let r = rt.block_on(async move {
        let t0 = std::time::Instant::now();
        let origin = if a.demo {
            let l = tokio::net::TcpListener::bind(a.demo_origin)
                .await
                .map_err(|e| format!("cannot listen for the demo origin on {}: {e}", a.demo_origin))?;
            let addr = l.local_addr().map_err(|e| e.to_string())?;
            // The titles are made on the first request for one, in the
            // background: `vcdn up` does not wait, and a demo nobody
            // watches (tests, experiments) never runs ffmpeg.
            let mut o = vcdn_origin::Origin::default();
            if let Some(lib) = a.video.library(Some(&a.data_dir.join("video")), true)? {
                o = o.with_video(lib);
            }
            tokio::spawn(vcdn_origin::run_with(l, o));
            Some(addr)
        } else {
            None
        };
        let mut up = vcdn_control::up(vcdn_control::UpOptions {
            data_dir: a.data_dir.clone(),
            database_url: a.database_url.clone(),
            api: a.api,
            dns: Some(a.dns),
            http: Some(a.http),
            router_admin: a.router_admin,
            operator_token: a.operator_token.clone(),
            capacity_model: a.capacity_model.clone(),
            cache_binary: std::env::current_exe().map_err(|e| format!("cannot find the vcdn binary: {e}"))?,
            instance_port: a.instance_port,
            admin_port: a.instance_admin_port,
            instance_tls_port: (a.instance_tls_port != 0).then_some(a.instance_tls_port),
            vcpu_share: a.vcpu_share,
            reinitialise_store: a.reinitialise_store,
            telemetry: (a.telemetry_discovery_port != 0).then_some(
                vcdn_control::telemetry::TelemetryOptions {
                    discovery_port: a.telemetry_discovery_port,
                    broadcast: a.telemetry_broadcast,
                },
            ),
            stats_polling: !a.no_stats_polling,
            srv6: a.srv6,
            auth_failures_per_minute: a.auth_failures_per_minute,
            region_vims: a.region_vims.clone(),
            kafka: a.kafka.then_some(vcdn_control::KafkaPorts {
                port: a.kafka_port,
                controller_port: a.kafka_controller_port,
            }),
            api_tls: match (&a.tls_cert, &a.tls_key, a.plain_http) {
                (_, _, true) => vcdn_control::pki::ApiTls::Plain,
                (Some(cert), Some(key), _) => vcdn_control::pki::ApiTls::Files {
                    cert: cert.clone(),
                    key: key.clone(),
                },
                _ => vcdn_control::pki::ApiTls::SelfSigned,
            },
        })
        .await?;
        let api = up.api_url.clone();
        let dns = up.dns.map_or("off".into(), |d| d.to_string());
        println!("vcdn up: control plane ready in {:.0} ms", t0.elapsed().as_secs_f64() * 1000.0);
        println!("  API            {api}/v1   (OpenAPI at {api}/v1/openapi.json; /metrics, /healthz)");
        match &up.api_fingerprint {
            Some(fp) => println!(
                "  API certificate {fp} ({})",
                match &a.tls_cert {
                    Some(c) => c.display().to_string(),
                    None => format!(
                        "self-signed, {}",
                        a.data_dir.join(vcdn_control::pki::API_CERT).display()
                    ),
                }
            ),
            None => println!("  API            plain HTTP on loopback (--plain-http)"),
        }
        println!("  DNS            {dns} (udp and tcp)");
        if let Some(h) = up.http {
            println!("  HTTP routing   http://{h}");
        }
        if a.srv6 {
            println!(
                "  SRv6           dispatcher {} in namespace {}; chunk addresses {}/48 routed from this host (routing \"srv6\" offered)",
                vcdn_srv6::domain::dispatcher_sid(),
                vcdn_srv6::domain::POP,
                vcdn_srv6::domain::chunk_block()
            );
        }
        println!("  router admin   https://{} (certificate of the internal CA, {})", up.router_admin, a.data_dir.join(vcdn_control::pki::CA_CERT).display());
        println!("  store          {} in {}", up.control.store.engine(), a.data_dir.display());
        if let Some(k) = &up.kafka {
            println!(
                "  Kafka          {} (data sink, controller 127.0.0.1:{}, data in {}; usage billed from edge.stats with acks=all)",
                k.bootstrap,
                a.kafka_controller_port,
                a.data_dir.join("kafka").display()
            );
        }
        println!("  operator token {}", up.operator_token);
        let mut token = String::from("<customer API key>");
        if let Some(o) = origin {
            println!("  demo origin    http://{o}");
            let key = demo_customer(&up, &a.data_dir, o).await?;
            println!("  demo customer  API key {key}");
            token = key;
        }
        let o = origin.map_or("http://<your origin host:port>".into(), |o| format!("http://{o}"));
        let trust_env = up
            .api_fingerprint
            .as_ref()
            .map_or(String::new(), |fp| format!(" VCDN_API_FINGERPRINT={fp}"));
        // curl trusts a self-signed certificate given as its own CA.
        let curl_trust = match (&up.api_fingerprint, &a.tls_cert) {
            (None, _) => String::new(),
            (Some(_), Some(_)) => " --cacert <your CA>".to_string(),
            (Some(_), None) => format!(
                " --cacert {}",
                a.data_dir.join(vcdn_control::pki::API_CERT).display()
            ),
        };
        println!(
            "
Order a first vCDN (regions: paris, lyon, marseille):
  export VCDN_API={api}{trust_env} VCDN_TOKEN={token}
  vcdn service create demo --origin {o} --hostname video.demo.example \\
      --flavor elastic --region paris=500 --region lyon=200 --min-mos 4.0 --lease 2h
  vcdn service show demo

Be a user in Paris (127.1.0.0/16) and in Lyon (127.2.0.0/16):
  dig @{ip} -p {port} -b 127.1.0.1 video.demo.example +short
  dig @{ip} -p {port} -b 127.2.0.1 video.demo.example +short
  curl -si --resolve video.demo.example:{ip_port}:<address from dig> http://video.demo.example:{ip_port}/size/1000 | grep -i x-cache
{watch}{cust}
Stop with Ctrl-C (caches keep serving; the next `vcdn up` adopts them).",
            ip = up.dns.map_or("127.0.0.1".into(), |d| d.ip().to_string()),
            port = up.dns.map_or(53, |d| d.port()),
            ip_port = a.instance_port,
            // A cache serves its one service whatever the Host, so a
            // browser opens it by address: page, dash.js and segments then
            // all come through that cache. Through the router instead, the
            // browser must resolve the service's hostname, and the first
            // request of a path is sent to the origin until the admission
            // filter has seen it.
            watch = if origin.is_some() {
                format!("
Watch the demo's video (a test pattern, made with ffmpeg in about a minute when first asked for) through the vCDN in a browser on this machine:
  http://<address from dig>:{port}/watch
  or through the router, with the hostname resolving to it (it redirects to a cache; the first
  request of a page goes to the origin until the admission filter has seen it: reload):
  chromium --host-resolver-rules='MAP video.demo.example {router_ip}' http://video.demo.example:{router_port}/watch
",
                    port = a.instance_port,
                    router_ip = up.http.map_or("127.0.0.1".into(), |h| h.ip().to_string()),
                    router_port = up.http.map_or(80, |h| h.port()),
                )
            } else {
                String::new()
            },
            cust = if origin.is_none() {
                format!("\nMake a customer first (operator token):\n  curl -s{curl_trust} -H 'Authorization: Bearer {}' -d '{{\"name\": \"acme\"}}' {api}/v1/customers\n", up.operator_token)
            } else {
                String::new()
            },
        );
        tracing::info!(api = %up.api, dns = ?up.dns, http = ?up.http, "vcdn up ready");
        // SIGINT (Ctrl-C) or SIGTERM stops `vcdn up` cleanly (the Kafka
        // broker, if any, with it). Taken over only now: while it starts,
        // Ctrl-C still stops it at once.
        vcdn_http::stop::StopSignal::install()?.recv().await;
        println!("vcdn up: stopping (cache instances keep running)");
        if let Some(k) = up.kafka.take() {
            k.stop().await;
        }
        if a.srv6 && vcdn_srv6::domain::Domain::remove_if_unused() {
            println!("vcdn up: no service routes with SRv6: the SR domain is removed");
        }
        Ok(())
    });
    // Whatever still runs on blocking threads is not waited for long.
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    r
}

/// The demo customer's key, made on first run and kept in the data dir.
async fn demo_customer(
    up: &vcdn_control::Up,
    dir: &std::path::Path,
    origin: SocketAddr,
) -> Result<String, String> {
    let f = dir.join("demo-customer-key");
    if let Ok(k) = std::fs::read_to_string(&f) {
        if !k.trim().is_empty() {
            return Ok(k.trim().to_string());
        }
    }
    let auth = format!("Bearer {}", up.operator_token);
    let r = vcdn_http::client::request_url(
        &up.api_url,
        &up.api_trust,
        "POST",
        "/v1/customers",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        // The demo origin is on loopback, which origin policies refuse:
        // the demo customer gets an exception for exactly its address.
        serde_json::json!({"name": "demo", "origin_allow": [origin.to_string()]})
            .to_string()
            .as_bytes(),
        std::time::Duration::from_secs(5),
    )
    .await
    .map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
    let key = v["api_key"]
        .as_str()
        .ok_or_else(|| format!("cannot make the demo customer: {}", r.text()))?
        .to_string();
    vcdn_control::control::write_secret(&f, &key)
        .map_err(|e| format!("cannot write {}: {e}", f.display()))?;
    Ok(key)
}
