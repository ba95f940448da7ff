//! vcdn's control plane: CDN-as-a-Service (Frangoudis et al., "CDN-as-a-
//! Service Provision over a Telecom Operator's Cloud", §III and §V).
//!
//! A customer orders a vCDN through the [`api`]; the [`planner`] (service
//! orchestrator) dimensions it from the capacity model and places
//! instances on hosts; the [`deployer`] and a [`vim`] driver (resource
//! orchestrator) start them and wire the request router; the
//! [`supervisor`] (instance manager) heals, scales and ends them with the
//! lease. [`store`] keeps it all (SQLite or PostgreSQL); [`pricing`] bills.
//!
//! [`up`] starts everything on one host with embedded defaults.

pub mod accel;
pub mod api;
pub mod billing;
pub mod certificates;
pub mod chain_controller;
pub mod control;
pub mod defaults;
pub mod deployer;
pub mod kubernetes;
pub mod order;
pub mod origin;
pub mod pki;
pub mod planner;
pub mod portal;
pub mod pricing;
pub mod prometheus;
pub mod settings;
pub mod store;
pub mod supervisor;
pub mod telemetry;
pub mod timeseries;
pub mod types;
pub mod validate;
pub mod vim;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use control::{Control, ControlConfig};
use vcdn_model::capacity::CapacityModel;
use vcdn_router::config::{CoverageZone, RegionInfo};

/// What `vcdn up` is told.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub data_dir: PathBuf,
    /// PostgreSQL URL; SQLite in `data_dir` without one.
    pub database_url: Option<String>,
    pub api: SocketAddr,
    pub dns: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
    pub router_admin: SocketAddr,
    pub operator_token: Option<String>,
    pub capacity_model: Option<PathBuf>,
    /// The `vcdn` binary the local VIM runs as `vcdn cache`.
    pub cache_binary: PathBuf,
    pub instance_port: u16,
    pub admin_port: u16,
    /// Port caches serve HTTPS on (`vcdn cache --tls-listen`); none: HTTP only.
    pub instance_tls_port: Option<u16>,
    /// CPU time one vCPU gets (see [`ControlConfig::vcpu_share`]).
    pub vcpu_share: f64,
    /// Start even though the data directory's store is missing, emptied or
    /// replaced, or its instances run with no store (see [`store::OpenOptions`]).
    pub reinitialise_store: bool,
    /// HTTPS with a self-signed certificate (default), the operator's, or
    /// plain HTTP on loopback.
    pub api_tls: pki::ApiTls,
    /// Telemetry discovery (the control plane is the tracker and consumes
    /// the caches' records); none: no telemetry, every instance polled.
    pub telemetry: Option<telemetry::TelemetryOptions>,
    /// False: never poll `GET /stats` (telemetry alone).
    pub stats_polling: bool,
    /// Run a Kafka data sink and bill through it (`vcdn up --kafka`);
    /// needs telemetry.
    pub kafka: Option<KafkaPorts>,
    /// Offer `routing: "srv6"` (`vcdn up --srv6`): build the SR domain on
    /// this host (`vcdn_srv6::domain`) and be its dispatcher.
    pub srv6: bool,
    /// See [`ControlConfig::auth_failures_per_minute`].
    pub auth_failures_per_minute: u32,
    /// Regions whose instances are pods of a Kubernetes cluster
    /// (`--region-vim`); every other region runs local processes.
    pub region_vims: Vec<kubernetes::KubeRegion>,
}

/// `vcdn up --kafka`'s broker ports (on 127.0.0.1; its data in
/// `DATA_DIR/kafka`).
#[derive(Debug, Clone, Copy)]
pub struct KafkaPorts {
    pub port: u16,
    pub controller_port: u16,
}

/// A running control plane and router.
pub struct Up {
    pub control: Arc<Control>,
    pub api: SocketAddr,
    /// `https://ADDR` (or `http://` with plain HTTP).
    pub api_url: String,
    /// The API certificate's fingerprint (None: plain HTTP).
    pub api_fingerprint: Option<String>,
    /// How a client of this process trusts its API.
    pub api_trust: vcdn_http::tls::Trust,
    pub dns: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
    pub router_admin: SocketAddr,
    pub operator_token: String,
    /// The Kafka data sink (`--kafka`): stop it before exiting, so that
    /// its broker goes too.
    pub kafka: Option<telemetry::Sink>,
}

/// Starts the store, the router, the control plane, its supervisor and
/// its API on the current tokio runtime.
pub async fn up(o: UpOptions) -> Result<Up, String> {
    std::fs::create_dir_all(&o.data_dir)
        .map_err(|e| format!("cannot create data directory {}: {e}", o.data_dir.display()))?;
    // The API's TLS is checked before anything starts.
    match &o.api_tls {
        pki::ApiTls::Plain => pki::check_plain(o.api)?,
        pki::ApiTls::Files { cert, key } => {
            pki::operator_certificate(cert, key)?;
        }
        pki::ApiTls::SelfSigned => {}
    }
    let operator_token = match &o.operator_token {
        Some(t) if !t.is_empty() => {
            vcdn_http::auth::check_token_strength("--operator-token", t)?;
            t.clone()
        }
        _ => {
            let f = o.data_dir.join("operator-token");
            match std::fs::read_to_string(&f) {
                Ok(t) if !t.trim().is_empty() => {
                    vcdn_http::auth::check_token_strength(&f.display().to_string(), t.trim())?;
                    t.trim().to_string()
                }
                _ => {
                    let t = format!("op_{}", control::random_hex(16));
                    control::write_secret(&f, &t)
                        .map_err(|e| format!("cannot write {}: {e}", f.display()))?;
                    t
                }
            }
        }
    };
    let capacity = match &o.capacity_model {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read capacity model {}: {e}", p.display()))?;
            CapacityModel::from_toml(&text).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => CapacityModel::default(),
    };
    let vim = vim::LocalVim::new(o.cache_binary.clone(), &o.data_dir)
        .map_err(|e| format!("cannot start the local VIM: {e}"))?;
    let running_instances = vim::Vim::marked(&vim)
        .iter()
        .filter_map(|m| m.pid)
        .collect();
    let store = store::Store::open(
        &o.data_dir,
        &store::OpenOptions {
            database_url: o.database_url.clone(),
            reinitialise: o.reinitialise_store,
            running_instances,
        },
    )
    .await
    .map_err(|e| match &o.database_url {
        Some(url) => format!("cannot open the store at {url}: {e}"),
        None => format!("cannot open the store in {}: {e}", o.data_dir.display()),
    })?;
    // The router learns regions and coverage from the store's regions.
    let mut regions: Vec<types::Region> = store.list("region").await.map_err(|e| e.to_string())?;
    if regions.is_empty() {
        regions = defaults::Defaults::embedded().regions;
    }
    if let Some(r) = o
        .region_vims
        .iter()
        .find(|v| !regions.iter().any(|r| r.name == v.region))
    {
        let known: Vec<&str> = regions.iter().map(|r| r.name.as_str()).collect();
        return Err(format!(
            "--region-vim {}: no such region; regions are: {}",
            r.region,
            known.join(", ")
        ));
    }
    let mut kube: Vec<(String, Arc<dyn vim::Vim>)> = Vec::new();
    for r in &o.region_vims {
        let (r, owner) = (r.clone(), vim::owner_label(&o.data_dir));
        let v = tokio::task::spawn_blocking(move || kubernetes::KubeVim::connect(r, &owner))
            .await
            .map_err(|e| e.to_string())??;
        kube.push((v.region().to_string(), Arc::new(v)));
    }
    let vim = vim::Vims::new(Arc::new(vim), kube);
    let mut rcfg = vcdn_router::RouterConfig::default();
    for r in &regions {
        rcfg.regions.push(RegionInfo {
            name: r.name.clone(),
            lat: r.lat,
            lon: r.lon,
        });
        for c in &r.clients {
            rcfg.coverage.push(CoverageZone {
                cidr: c.clone(),
                region: r.name.clone(),
            });
        }
    }
    rcfg.default_region = regions.first().map(|r| r.name.clone());
    if o.srv6 {
        // Said now, in the operator's words, not at the first order.
        vcdn_srv6::domain::Domain::ensure().map_err(|e| {
            format!(
                "--srv6: cannot build the SR domain on this host: {e}. Services could not \
                 order routing \"srv6\"; start without --srv6 to offer DNS and HTTP routing only"
            )
        })?;
        rcfg.srv6 = Some(vcdn_router::config::Srv6Config {
            sid: vcdn_srv6::domain::dispatcher_sid(),
            device: vcdn_srv6::domain::POP_LAN.into(),
            netns: Some(vcdn_srv6::domain::POP.into()),
            region: None,
            flows: 65_536,
            idle_s: 40,
        });
    }
    let router_token = control::random_hex(16);
    // The router's admin API is HTTPS with a certificate of the internal
    // CA (made anew at each start), which the control plane trusts.
    let internal_ca = Arc::new(pki::internal_ca(&o.data_dir)?);
    let router_tls = pki::router_admin_tls(&internal_ca, o.router_admin)?;
    let internal_trust = vcdn_http::tls::Trust::Bundle(
        vcdn_http::tls::parse_chain(internal_ca.ca.cert_pem.as_bytes())
            .map_err(|e| e.to_string())?,
    );
    let (router, l) = vcdn_router::start(
        rcfg,
        vcdn_router::RouterOptions {
            dns: o.dns,
            http: o.http,
            admin: Some(o.router_admin),
            admin_token: Some(router_token.clone()),
            admin_tls: Some(router_tls),
            // The caches' admin APIs are HTTPS with certificates of the
            // internal CA, which the health checks trust alone.
            cache_admin_trust: Some(internal_trust.clone()),
        },
    )
    .await?;
    let router_admin = l.admin.ok_or("router admin did not start")?;
    // Bound before the control plane opens, so that its address is among
    // the platform's own, which no origin may name.
    let listener = tokio::net::TcpListener::bind(o.api)
        .await
        .map_err(|e| format!("cannot listen for the API on {}: {e}", o.api))?;
    let api = listener.local_addr().map_err(|e| e.to_string())?;
    let api_cert = pki::api_certificate(&o.data_dir, api, &o.api_tls)?;
    let api_fingerprint = api_cert.as_ref().map(|b| b.info.fingerprint.clone());
    let mut platform_listeners = vec![
        (api, "the control API".to_string()),
        (router_admin, "the router's admin API".to_string()),
    ];
    platform_listeners.extend(l.dns.map(|a| (a, "the router's DNS".to_string())));
    platform_listeners.extend(l.http.map(|a| (a, "the router's HTTP routing".to_string())));
    // The deployment's telemetry keys are made once and kept, like the
    // internal CA: restarted caches keep theirs, adopted ones stay valid.
    let telemetry = match o.telemetry {
        Some(opts) => {
            let keys = telemetry::deployment_keys(&o.data_dir)?;
            Some(telemetry::Telemetry::start(&keys, opts).await?)
        }
        None => None,
    };
    if telemetry.is_none() && !o.stats_polling {
        return Err(
            "--no-stats-polling needs telemetry (the supervisor would see no instance)".into(),
        );
    }
    // The data sink: its broker starts in the background; billing
    // consumes from it as soon as it serves.
    let (kafka, kafka_billing) = match (o.kafka, &telemetry) {
        (None, _) => (None, None),
        (Some(_), None) => {
            return Err(
                "--kafka needs telemetry (a --telemetry-discovery-port other than 0)".into(),
            )
        }
        (Some(k), Some(t)) => {
            let sink = t
                .start_sink(&telemetry::KafkaOptions {
                    data_dir: o.data_dir.join("kafka"),
                    host: "127.0.0.1".into(),
                    port: k.port,
                    controller_port: k.controller_port,
                })
                .await?;
            let billing = Arc::new(billing::KafkaBilling {
                bootstrap: sink.bootstrap.clone(),
                keys: t.keyring(),
                counters: Default::default(),
            });
            (Some(sink), Some(billing))
        }
    };
    let cfg = ControlConfig {
        telemetry,
        kafka_billing,
        stats_polling: o.stats_polling,
        data_dir: o.data_dir.clone(),
        operator_token: operator_token.clone(),
        router: deployer::RouterLink {
            admin: router_admin,
            token: router_token,
            trust: Some(internal_trust),
        },
        dns: l.dns,
        http_routing: l.http,
        instance_port: o.instance_port,
        admin_port: o.admin_port,
        instance_tls_port: o.instance_tls_port,
        capacity,
        vcpu_share: o.vcpu_share,
        tick: Duration::from_millis(100),
        autoscaler: Default::default(),
        platform_listeners,
        api_https: api_cert.is_some(),
        api_fingerprint: api_fingerprint.clone(),
        internal_ca: Some(internal_ca),
        srv6: o.srv6,
        auth_failures_per_minute: o.auth_failures_per_minute,
    };
    let control = Control::open(cfg, store, Arc::new(vim))
        .await
        .map_err(|e| e.to_string())?;
    control.reconcile().await;
    if let Some(t) = &control.cfg.telemetry {
        tokio::spawn(telemetry::publish_router_decisions(
            Arc::downgrade(t),
            router.clone(),
        ));
    }
    if control.cfg.kafka_billing.is_some() {
        tokio::spawn(billing::run(Arc::downgrade(&control)));
    }
    tokio::spawn(supervisor::run(control.clone()));
    tokio::spawn(chain_controller::run(control.clone()));
    tokio::spawn(certificates::run(control.clone()));
    let api_trust = match &api_fingerprint {
        Some(fp) => vcdn_http::tls::Trust::Fingerprint(
            vcdn_http::tls::parse_fingerprint(fp).ok_or("bad API fingerprint")?,
        ),
        None => vcdn_http::tls::Trust::System,
    };
    tokio::spawn(vcdn_http::serve::serve(
        listener,
        vcdn_http::serve::ServeConfig {
            tls: api_cert.map(pki::server_config),
            ..Default::default()
        },
        api::handler(control.clone()),
    ));
    Ok(Up {
        control,
        api,
        api_url: format!(
            "{}://{api}",
            if api_fingerprint.is_some() {
                "https"
            } else {
                "http"
            }
        ),
        api_fingerprint,
        api_trust,
        dns: l.dns,
        http: l.http,
        router_admin,
        operator_token,
        kafka,
    })
}
