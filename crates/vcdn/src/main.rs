//! The `vcdn` command: parses flags and calls the libraries.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use vcdn_cache::config::parse_size;
use vcdn_cache::ctl;
use vcdn_cache::CacheConfig;

mod calibrate_cmd;
mod chains_cmd;
mod image_cmd;
mod model_cmd;
mod name_cmd;
mod netem_cmd;
mod player_cmd;
mod proxy_cmd;
mod reactive_cmd;
mod router_cmd;
mod service_cmd;
mod sim_cmd;
mod srv6_cmd;
mod telemetry_cmd;
mod testbed_cmd;
mod up_cmd;
mod video_args;

#[derive(Parser)]
#[command(
    name = "vcdn",
    version,
    about = "CDN-as-a-Service: virtual CDNs on a telecom operator's cloud"
)]
struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true, env = "VCDN_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the control plane and router with embedded defaults (vcdn's main job).
    Up(up_cmd::UpArgs),
    /// Write the cache image (a one-layer docker-archive of this binary)
    /// that Kubernetes regions run.
    Image(image_cmd::ImageArgs),
    /// Order and manage vCDNs through the API (customers).
    Service(service_cmd::ServiceArgs),
    /// Manage customers and their API keys (operator).
    Customer(service_cmd::CustomerArgs),
    /// Measure what one vCPU of the cache sustains; write the capacity model.
    Calibrate(calibrate_cmd::CalibrateArgs),
    /// Play DASH sessions against a server and score them (start-up, stalls, MOS).
    Player(player_cmd::PlayerArgs),
    /// Run an edge cache in front of an origin or a parent cache.
    Cache(Box<CacheCmd>),
    /// Run the request router: geo-DNS, HTTP routing, admission filters.
    Router(router_cmd::RouterArgs),
    /// Content names: a video chunk's 64-bit id inside an IPv6 address.
    #[command(subcommand)]
    Name(name_cmd::NameCmd),
    /// Analytical models (optimal LRU filter size).
    #[command(subcommand)]
    Model(model_cmd::ModelCmd),
    /// The proxy chain (MOSTO) for a transfer between two locations, from
    /// an RTT matrix or a topology: JSON with the pair's Pareto front.
    Chains(chains_cmd::ChainsArgs),
    /// Simulate a country-scale elastic CDN (CDNSim): AS graph, live
    /// channels, on-demand caches with a boot time; prints QoE and loads.
    Sim(sim_cmd::SimCmd),
    /// Run the SRv6 server agent of an edge or origin host: the LRU filter
    /// in the kernel decides on each new connection to a chunk address.
    Srv6Agent(srv6_cmd::Srv6AgentArgs),
    /// Run the demo origin (synthetic objects and streams).
    Origin {
        #[arg(long, default_value = "127.0.0.1:9000", env = "VCDN_ORIGIN_LISTEN")]
        listen: SocketAddr,
        /// Seed of the synthetic DASH segment sizes.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Also serve the real titles of this DASH data set (NAME.mpd with
        /// NAME.segments.csv, e.g. shared/data/dash) at /dash/data/NAME.mpd.
        #[arg(long, env = "VCDN_ORIGIN_DASH_DATA")]
        dash_data: Option<std::path::PathBuf>,
        /// Answer every DASH segment (not manifests) this many milliseconds
        /// late: a slow origin, to see what viewers see (up to 60,000).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=60_000))]
        segment_delay_ms: u64,
        /// Serve on this inherited listening socket instead of --listen
        /// (what `vcdn reactive` hands over, as fd 3).
        #[arg(long)]
        listen_fd: Option<i32>,
        /// Exit after this many seconds without a request (fractions
        /// allowed); with `vcdn reactive` the next connection starts it again.
        #[arg(long)]
        idle_exit: Option<f64>,
        #[command(flatten)]
        video: video_args::VideoArgs,
    },
    /// Run the telemetry agent (ANDy): discovery, relaying local ports to
    /// topics, peer-to-peer delivery, the tracker.
    Agent(telemetry_cmd::AgentArgs),
    /// Telemetry: make keys, watch a topic live.
    #[command(subcommand)]
    Telemetry(telemetry_cmd::TelemetryCmd),
    /// Run a dynamic-content acceleration proxy (ingress, transport or egress of a chain).
    Proxy(proxy_cmd::ProxyArgs),
    /// Hold a listening socket and start a server on it at the first
    /// connection, again after it exits idle (reactive start).
    Reactive(reactive_cmd::ReactiveArgs),
    /// Relay TCP to a target through an emulated path: delay, shared bandwidth cap.
    Netem(netem_cmd::NetemArgs),
    /// Emulate a wide-area network: a namespace per node, packets delayed per link (root).
    Testbed(testbed_cmd::TestbedArgs),
    /// Start a demo origin and a cache in front of it, and show how to try them.
    Demo {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        #[arg(long, default_value = "127.0.0.1:8081")]
        admin: SocketAddr,
        #[arg(long, default_value = "127.0.0.1:9000")]
        origin: SocketAddr,
        /// The admin API's bearer token [default: generated for this run].
        #[arg(long)]
        admin_token: Option<String>,
    },
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
struct CacheCmd {
    #[command(subcommand)]
    ctl: Option<CacheSub>,
    #[command(flatten)]
    run: CacheArgs,
}

#[derive(Subcommand)]
enum CacheSub {
    /// Talk to a running cache's control API.
    Ctl(CtlArgs),
}

#[derive(Args)]
struct CacheArgs {
    /// Address to serve clients on [default: 127.0.0.1:8080].
    #[arg(long, env = "VCDN_LISTEN")]
    listen: Option<SocketAddr>,
    /// Address to serve clients on over TLS (HTTP/1.1, and HTTP/2 by
    /// ALPN), e.g. 0.0.0.0:443 [default: no TLS].
    #[arg(long, env = "VCDN_TLS_LISTEN")]
    tls_listen: Option<SocketAddr>,
    /// Directory of certificates for --tls-listen: NAME.crt (PEM chain) and
    /// NAME.key (PEM key), optional NAME.ocsp (DER OCSP response); NAME is
    /// the host name, or _wildcard.example.com for *.example.com. More are
    /// pushed live with PUT /tls/certificates/NAME on the admin API.
    #[arg(long, env = "VCDN_TLS_CERT_DIR")]
    tls_cert_dir: Option<PathBuf>,
    /// Origin or parent cache, http://host:port[/base] or https://host[:port][/base].
    #[arg(long, env = "VCDN_UPSTREAM")]
    upstream: Option<String>,
    /// Address of the control API, /metrics and /healthz.
    #[arg(long, env = "VCDN_ADMIN")]
    admin: Option<SocketAddr>,
    /// Bearer token the control API requires.
    #[arg(long, env = "VCDN_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Serve the control API over HTTPS with this certificate chain (PEM).
    /// Without it the control API is plain HTTP, allowed only on loopback.
    #[arg(long, requires = "admin_tls_key", env = "VCDN_ADMIN_TLS_CERT")]
    admin_tls_cert: Option<PathBuf>,
    /// The private key of --admin-tls-cert (PEM).
    #[arg(long, requires = "admin_tls_cert", env = "VCDN_ADMIN_TLS_KEY")]
    admin_tls_key: Option<PathBuf>,
    /// Who this process is to the control plane that started it (shown in
    /// /healthz and /stats).
    #[arg(long, env = "VCDN_INSTANCE_ID")]
    instance_id: Option<String>,
    /// Memory tier size, e.g. 256M [default: 256M].
    /// It bounds all memory for objects: the memory tier and the bodies
    /// being fetched into it.
    #[arg(long, env = "VCDN_MEMORY", value_parser = parse_size)]
    memory: Option<u64>,
    /// Directory of the disk tier (kept across restarts): new, empty, or
    /// one a vcdn cache created.
    #[arg(long, env = "VCDN_DISK")]
    disk: Option<PathBuf>,
    /// Disk tier size, e.g. 10G [default: 1G].
    #[arg(long, env = "VCDN_DISK_SIZE", value_parser = parse_size)]
    disk_size: Option<u64>,
    /// Serving threads [default: one per available CPU].
    #[arg(long, env = "VCDN_THREADS")]
    threads: Option<usize>,
    /// LRU admission filter of this many content ids: content not
    /// requested recently is redirected (302) to the origin, not proxied.
    #[arg(long, env = "VCDN_ADMISSION_FILTER")]
    admission_filter: Option<usize>,
    /// Where filtered requests go [default: the upstream].
    #[arg(long, env = "VCDN_ADMISSION_REDIRECT")]
    admission_redirect: Option<String>,
    /// A chunk /64 this cache answers on (the SRv6 data path; repeat or
    /// separate with commas): a request on a chunk address must name that
    /// chunk, else 421. The service's segment template goes in --config
    /// as chunk_template [default: none].
    #[arg(
        long = "chunk-prefix",
        env = "VCDN_CHUNK_PREFIXES",
        value_delimiter = ','
    )]
    chunk_prefixes: Vec<String>,
    /// Also serve chunk addresses on this address, e.g. [::]:80 (needs
    /// --chunk-prefix) [default: only --listen].
    #[arg(long, env = "VCDN_CHUNK_LISTEN")]
    chunk_listen: Option<SocketAddr>,
    /// Bind --chunk-listen in this network namespace (a name under
    /// /run/netns, or a path): the edge's namespace that its SRv6 agent
    /// delivers into, while the admin API and upstream stay in this one.
    #[arg(long, env = "VCDN_CHUNK_NETNS", requires = "chunk_listen")]
    chunk_netns: Option<String>,
    /// Run the edge's SRv6 agent with this SID: the LRU filter in the
    /// kernel decides on each SYN to a chunk address whether this cache
    /// serves it (routes in --chunk-netns; needs root).
    #[arg(long, env = "VCDN_SRV6_SID", requires = "srv6_dispatchers")]
    srv6_sid: Option<std::net::Ipv6Addr>,
    /// A trusted dispatcher's SID (repeat or separate with commas).
    #[arg(
        long = "srv6-dispatcher",
        env = "VCDN_SRV6_DISPATCHERS",
        value_delimiter = ','
    )]
    srv6_dispatchers: Vec<std::net::Ipv6Addr>,
    /// The agent's filter: auto, none (accept all: an origin gateway) or a
    /// size [default: auto].
    #[arg(long, env = "VCDN_SRV6_FILTER", requires = "srv6_sid")]
    srv6_filter: Option<String>,
    /// The device the SID is reached by [default: eth0].
    #[arg(long, env = "VCDN_SRV6_DEVICE", requires = "srv6_sid")]
    srv6_device: Option<String>,
    /// The route to clients that gets the reply program [default: ::/0].
    #[arg(long, env = "VCDN_SRV6_CLIENTS", requires = "srv6_sid")]
    srv6_clients: Option<String>,
    /// Origin policy applied to every upstream address the cache connects
    /// to, e.g. "deny non-public, allow 127.0.0.1:9000" [default: allow all].
    #[arg(long, env = "VCDN_ORIGIN_POLICY")]
    origin_policy: Option<String>,
    /// PEM bundle of the CA certificates an https:// upstream is verified
    /// against [default: the system roots].
    #[arg(long, env = "VCDN_ORIGIN_CA_FILE")]
    origin_ca_file: Option<PathBuf>,
    /// Name sent in SNI and verified in an https:// upstream's certificate
    /// instead of the URL's host (for an origin addressed by IP, or to pin
    /// the name).
    #[arg(long, env = "VCDN_ORIGIN_TLS_NAME")]
    origin_tls_name: Option<String>,
    /// The deployment's telemetry key file (vcdn up hands each instance
    /// one): with it the cache publishes edge.stats and edge.events over
    /// the telemetry agent [default: no telemetry].
    #[arg(long, env = "VCDN_TELEMETRY_KEYS")]
    telemetry_keys: Option<PathBuf>,
    /// Telemetry node id and record source [default: the instance id
    /// without its nonce].
    #[arg(long, env = "VCDN_TELEMETRY_NODE")]
    telemetry_node: Option<String>,
    /// UDP port of telemetry discovery [default: 12555].
    #[arg(long, env = "VCDN_TELEMETRY_DISCOVERY_PORT")]
    telemetry_discovery_port: Option<u16>,
    /// Broadcast address of telemetry discovery [default: 127.255.255.255].
    #[arg(long, env = "VCDN_TELEMETRY_BROADCAST")]
    telemetry_broadcast: Option<std::net::IpAddr>,
    /// How often edge.stats is published, ms [default: 100].
    #[arg(long, env = "VCDN_TELEMETRY_INTERVAL_MS")]
    telemetry_interval_ms: Option<u64>,
    /// Also send the telemetry records to the Kafka data sink when one
    /// answers (acks from all replicas: billing; vcdn up --kafka sets it).
    #[arg(long, env = "VCDN_TELEMETRY_KAFKA")]
    telemetry_kafka: bool,
    /// TOML file with any of these settings (flags win).
    #[arg(long, env = "VCDN_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Args)]
#[command(
    after_help = "The admin API of a cache started with --admin-tls-cert (as vcdn up starts them) is HTTPS: \
give its CA (vcdn up's internal CA is DATA_DIR/ca.crt) or its certificate's fingerprint, e.g.
  vcdn cache ctl --admin 127.10.0.1:9080 --ca-file DATA_DIR/ca.crt --token TOKEN stats
  vcdn cache ctl --admin https://127.10.0.1:9080 --fingerprint sha256:AB12... --token TOKEN stats
A bare address is HTTPS when --ca-file or --fingerprint is given, plain HTTP otherwise (loopback only)."
)]
struct CtlArgs {
    /// The cache's admin address, IP:PORT, or a URL http://IP:PORT or
    /// https://IP:PORT.
    #[arg(long, default_value = "127.0.0.1:8081", env = "VCDN_ADMIN")]
    admin: String,
    /// The admin bearer token.
    #[arg(long, env = "VCDN_ADMIN_TOKEN", hide_env_values = true)]
    token: String,
    /// Trust the HTTPS admin API's certificate if this PEM bundle of CA
    /// certificates issued it.
    #[arg(long, env = "VCDN_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Trust the HTTPS admin API's certificate by its SHA-256 fingerprint
    /// (wins over --ca-file).
    #[arg(long, env = "VCDN_ADMIN_FINGERPRINT")]
    fingerprint: Option<String>,
    #[command(subcommand)]
    cmd: CtlCmd,
}

#[derive(Subcommand)]
enum CtlCmd {
    /// Liveness and a few figures.
    Health,
    /// Totals: requests by result, hit ratio, bytes, tiers.
    Stats,
    /// List objects with their statistics.
    Objects {
        #[arg(long)]
        prefix: Option<String>,
    },
    /// One object, with its headers and freshness.
    Object { id: String },
    /// Remove objects: one URL, a prefix, or everything.
    Purge {
        #[arg(long, conflicts_with_all = ["prefix", "all"], required_unless_present_any = ["prefix", "all"])]
        url: Option<String>,
        #[arg(long, conflicts_with = "all")]
        prefix: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Fetch a URL into the cache now.
    Prefetch { url: String },
    /// The Prometheus metrics.
    Metrics,
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VCDN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

/// Unmaps this executable's code once a server is up. Start-up ran code
/// an idle server never runs again (argument parsing, configuration,
/// set-up), and the kernel maps code 64 KiB around each page touched, so a
/// server built into this multi-purpose binary would hold megabytes of code
/// resident for nothing. Code pages are never written, so dropping their
/// mappings loses nothing: what runs again is mapped again from the page
/// cache (a minor fault). Only the executable (`r-xp`) mapping is touched;
/// the read-only data that the loader relocated must stay.
fn drop_startup_code() {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let exe = exe.to_string_lossy();
    for line in maps.lines().filter(|l| l.ends_with(&*exe)) {
        let mut f = line.split_whitespace();
        let (Some(range), Some("r-xp")) = (f.next(), f.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        // SAFETY: a private, never written, file-backed mapping of our own
        // code: after MADV_DONTNEED its pages fault in again from the file
        // with the same contents.
        unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED) };
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_json);
    let result = match cli.cmd {
        Cmd::Cache(c) => match *c {
            CacheCmd {
                ctl: Some(CacheSub::Ctl(c)),
                ..
            } => run_ctl(c),
            CacheCmd { run, .. } => run_cache(run),
        },
        Cmd::Origin {
            listen,
            seed,
            dash_data,
            segment_delay_ms,
            listen_fd,
            idle_exit,
            video,
        } => run_origin(
            OriginListen {
                addr: listen,
                fd: listen_fd,
                idle_exit,
            },
            seed,
            dash_data.as_deref(),
            std::time::Duration::from_millis(segment_delay_ms),
            &video,
        ),
        Cmd::Router(a) => router_cmd::run(a),
        Cmd::Srv6Agent(a) => srv6_cmd::run(a),
        Cmd::Netem(a) => netem_cmd::run(a),
        Cmd::Proxy(a) => proxy_cmd::run(a),
        Cmd::Agent(a) => telemetry_cmd::run(telemetry_cmd::agent(a)),
        Cmd::Telemetry(c) => telemetry_cmd::run(telemetry_cmd::telemetry(c)),
        Cmd::Testbed(a) => testbed_cmd::run(a),
        Cmd::Reactive(a) => reactive_cmd::run(a),
        Cmd::Up(a) => up_cmd::run(a),
        Cmd::Image(a) => image_cmd::run(a),
        Cmd::Player(a) => player_cmd::run(a),
        Cmd::Calibrate(a) => calibrate_cmd::run(a),
        Cmd::Service(a) => service_cmd::run_service(a),
        Cmd::Customer(a) => service_cmd::run_customer(a),
        Cmd::Name(c) => name_cmd::run(c),
        Cmd::Model(c) => model_cmd::run(c),
        Cmd::Chains(a) => chains_cmd::run(a),
        Cmd::Sim(a) => sim_cmd::main(a),
        Cmd::Demo {
            listen,
            admin,
            origin,
            admin_token,
        } => run_demo(listen, admin, origin, admin_token),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vcdn: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cache_config(a: CacheArgs) -> Result<CacheConfig, String> {
    let mut c = match &a.config {
        Some(p) => CacheConfig::from_file(p).map_err(|e| e.to_string())?,
        None => CacheConfig::default(),
    };
    if let Some(v) = a.listen {
        c.listen = v;
    }
    if let Some(v) = a.upstream {
        c.upstream = v;
    }
    if a.tls_listen.is_some() {
        c.tls_listen = a.tls_listen;
    }
    if a.tls_cert_dir.is_some() {
        c.tls_cert_dir = a.tls_cert_dir;
    }
    if a.admin.is_some() {
        c.admin = a.admin;
    }
    if a.admin_token.is_some() {
        c.admin_token = a.admin_token;
    }
    if a.admin_tls_cert.is_some() {
        c.admin_tls_cert = a.admin_tls_cert;
        c.admin_tls_key = a.admin_tls_key;
    }
    if a.instance_id.is_some() {
        c.instance_id = a.instance_id;
    }
    if let Some(v) = a.memory {
        c.memory = v;
    }
    if a.disk.is_some() {
        c.disk = a.disk;
    }
    if let Some(v) = a.disk_size {
        c.disk_size = v;
    }
    if let Some(v) = a.threads {
        c.threads = v;
    }
    if a.admission_filter.is_some() {
        c.admission_filter = a.admission_filter;
    }
    if a.admission_redirect.is_some() {
        c.admission_redirect = a.admission_redirect;
    }
    if !a.chunk_prefixes.is_empty() {
        c.chunk_prefixes = a.chunk_prefixes;
    }
    if a.chunk_listen.is_some() {
        c.chunk_listen = a.chunk_listen;
    }
    if a.chunk_netns.is_some() {
        c.chunk_netns = a.chunk_netns;
    }
    if let Some(sid) = a.srv6_sid {
        let d = vcdn_cache::config::CacheSrv6::new(sid, a.srv6_dispatchers);
        c.srv6 = Some(vcdn_cache::config::CacheSrv6 {
            filter: a.srv6_filter.unwrap_or(d.filter.clone()),
            device: a.srv6_device.unwrap_or(d.device.clone()),
            clients: a.srv6_clients.unwrap_or(d.clients.clone()),
            ..d
        });
    }
    if let Some(v) = a.origin_policy {
        c.origin_policy = v;
    }
    if a.origin_ca_file.is_some() {
        c.origin_ca_file = a.origin_ca_file;
    }
    if a.origin_tls_name.is_some() {
        c.origin_tls_name = a.origin_tls_name;
    }
    if a.telemetry_keys.is_some() {
        c.telemetry_keys = a.telemetry_keys;
    }
    if a.telemetry_node.is_some() {
        c.telemetry_node = a.telemetry_node;
    }
    if let Some(v) = a.telemetry_discovery_port {
        c.telemetry_discovery_port = v;
    }
    if let Some(v) = a.telemetry_broadcast {
        c.telemetry_broadcast = v;
    }
    if let Some(v) = a.telemetry_interval_ms {
        c.telemetry_interval_ms = v;
    }
    if a.telemetry_kafka {
        c.telemetry_kafka = true;
    }
    Ok(c)
}

fn run_cache(a: CacheArgs) -> Result<(), String> {
    let cfg = cache_config(a)?;
    // SIGTERM and SIGINT are taken by this thread (sigwait below): the
    // serving threads, started after this, inherit the blocked mask.
    let signals = block_term_signals();
    let running = vcdn_cache::start(cfg)?;
    announce(&running);
    drop_startup_code();
    let mut sig: libc::c_int = 0;
    // SAFETY: waiting on a signal set this function initialised.
    unsafe { libc::sigwait(&signals, &mut sig) };
    tracing::info!(
        signal = sig,
        "shutting down: GOAWAY to HTTP/2 clients, draining"
    );
    running.drain();
    Ok(())
}

/// Block SIGTERM and SIGINT in the calling thread (and the threads it
/// starts); returns the set for `sigwait`.
fn block_term_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local set, then masking the calling
    // thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn announce(r: &vcdn_cache::Running) {
    let c = &r.cache.cfg;
    tracing::info!(
        listen = %r.listen,
        admin = ?r.admin,
        upstream = %c.upstream,
        memory = c.memory,
        disk = ?c.disk,
        "vcdn cache ready"
    );
    println!(
        "vcdn cache listening on http://{} (upstream {})",
        r.listen, c.upstream
    );
    if let Some(t) = r.tls_listen {
        println!(
            "vcdn cache serving TLS on https://{t} ({} certificates; HTTP/1.1 and h2 by ALPN)",
            r.cache.certs.names().len()
        );
    }
    if let Some(a) = r.admin {
        let scheme = if c.admin_tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        println!("vcdn cache admin on {scheme}://{a} (/healthz, /metrics, /stats, /objects, /purge, /prefetch, /tls/certificates)");
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))
}

/// Where the origin serves, and whether it exits when idle.
struct OriginListen {
    addr: SocketAddr,
    fd: Option<i32>,
    idle_exit: Option<f64>,
}

fn run_origin(
    listen: OriginListen,
    seed: u64,
    dash_data: Option<&std::path::Path>,
    segment_delay: std::time::Duration,
    video: &video_args::VideoArgs,
) -> Result<(), String> {
    let mut origin = vcdn_origin::Origin::new(seed).with_segment_delay(segment_delay);
    if let Some(lib) = video.library(None, false)? {
        origin = origin.with_video(lib);
    }
    if let Some(dir) = dash_data {
        let t = vcdn_origin::titles::Titles::load(dir).map_err(|e| e.to_string())?;
        let names = t.names().join(", ");
        println!(
            "serving {} segments of {names} at {}NAME.mpd",
            t.objects(),
            vcdn_origin::titles::PREFIX
        );
        origin = origin.with_titles(t);
    }
    runtime()?.block_on(async {
        let l = match listen.fd {
            Some(fd) => vcdn_accel::reactive::inherited_listener(fd)
                .and_then(tokio::net::TcpListener::from_std)
                .map_err(|e| format!("--listen-fd {fd}: {e}"))?,
            None => tokio::net::TcpListener::bind(listen.addr)
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", listen.addr))?,
        };
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        println!("vcdn origin listening on http://{addr}");
        match listen.idle_exit {
            Some(s) => {
                let idle = std::time::Duration::try_from_secs_f64(s)
                    .map_err(|e| format!("--idle-exit {s}: {e}"))?;
                vcdn_origin::run_until_idle(l, origin, idle).await;
                tracing::info!(idle_s = s, "idle: exiting");
            }
            None => vcdn_origin::run_with(l, origin).await,
        }
        Ok(())
    })
}

fn run_demo(
    listen: SocketAddr,
    admin: SocketAddr,
    origin: SocketAddr,
    token: Option<String>,
) -> Result<(), String> {
    let token = token.unwrap_or_else(|| vcdn_control::control::random_hex(16));
    let std_l = std::net::TcpListener::bind(origin)
        .map_err(|e| format!("cannot listen on {origin}: {e}"))?;
    std_l.set_nonblocking(true).map_err(|e| e.to_string())?;
    let origin_addr = std_l.local_addr().map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("vcdn-origin".into())
        .spawn(move || {
            if let Ok(rt) = runtime() {
                rt.block_on(async move {
                    if let Ok(l) = tokio::net::TcpListener::from_std(std_l) {
                        vcdn_origin::run(l).await;
                    }
                });
            }
        })
        .map_err(|e| e.to_string())?;
    let cfg = CacheConfig {
        listen,
        upstream: format!("http://{origin_addr}"),
        admin: Some(admin),
        admin_token: Some(token.clone()),
        ..CacheConfig::default()
    };
    let running = vcdn_cache::start(cfg)?;
    let (l, a) = (running.listen, running.admin.unwrap_or(admin));
    println!(
        "vcdn demo: an edge cache on http://{l} in front of a demo origin on http://{origin_addr}

Try it:
  curl -si http://{l}/size/43 | grep -i x-cache       # MISS: fetched from the origin
  curl -si http://{l}/size/43 | grep -i x-cache       # HIT: served from the cache
  curl -s  http://{l}/size/1048576 -o /dev/null -w '%{{size_download}} bytes\\n'
  curl -si -H 'Range: bytes=0-9' http://{l}/size/1000 # 206 Partial Content
  curl -sN http://{l}/stream?chunks=20                # a chunked stream, cloned to every client

Operate it (admin token: {token}):
  vcdn cache ctl --admin http://{a} --token {token} stats
  vcdn cache ctl --admin http://{a} --token {token} objects
  vcdn cache ctl --admin http://{a} --token {token} purge --prefix /size/
  curl -s http://{a}/metrics | grep vcdn_cache_requests_total

Stop with Ctrl-C."
    );
    running.join();
    Ok(())
}

fn run_ctl(c: CtlArgs) -> Result<(), String> {
    let cmd = match c.cmd {
        CtlCmd::Health => ctl::Command::Health,
        CtlCmd::Stats => ctl::Command::Stats,
        CtlCmd::Objects { prefix } => ctl::Command::Objects { prefix },
        CtlCmd::Object { id } => ctl::Command::Object { id },
        CtlCmd::Purge { url: Some(u), .. } => ctl::Command::PurgeUrl(u),
        CtlCmd::Purge {
            prefix: Some(p), ..
        } => ctl::Command::PurgePrefix(p),
        CtlCmd::Purge { .. } => ctl::Command::PurgeAll,
        CtlCmd::Prefetch { url } => ctl::Command::Prefetch(url),
        CtlCmd::Metrics => ctl::Command::Metrics,
    };
    let (trust, trusted) = ctl_trust(c.fingerprint.as_deref(), c.ca_file.as_deref())?;
    let url = if c.admin.contains("://") {
        c.admin.clone()
    } else {
        let a: SocketAddr = c
            .admin
            .parse()
            .map_err(|_| format!("--admin {:?}: expected IP:PORT or a URL", c.admin))?;
        vcdn_http::admin_tls::url(a, trusted)
    };
    let out = runtime()?.block_on(async {
        let admin = vcdn_http::client::Endpoint::new(&url, &trust)
            .await
            .map_err(|e| format!("--admin {url}: {e}"))?;
        ctl::run(&admin, &c.token, cmd).await
    })?;
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = writeln!(std::io::stdout(), "{out}");
    Ok(())
}

/// Whom `vcdn cache ctl` trusts as an HTTPS admin API, and whether it was
/// told (a bare address is then HTTPS).
fn ctl_trust(
    fingerprint: Option<&str>,
    ca_file: Option<&std::path::Path>,
) -> Result<(vcdn_http::tls::Trust, bool), String> {
    use vcdn_http::tls::{self, Trust};
    if let Some(f) = fingerprint.filter(|f| !f.trim().is_empty()) {
        let fp = tls::parse_fingerprint(f).ok_or_else(|| {
            format!("--fingerprint {f:?} is not a SHA-256 fingerprint (sha256: and 64 hex digits)")
        })?;
        return Ok((Trust::Fingerprint(fp), true));
    }
    if let Some(p) = ca_file {
        let pem = std::fs::read(p).map_err(|e| format!("--ca-file {}: {e}", p.display()))?;
        let cas = tls::parse_chain(&pem).map_err(|e| format!("--ca-file {}: {e}", p.display()))?;
        return Ok((Trust::Bundle(cas), true));
    }
    Ok((Trust::System, false))
}
