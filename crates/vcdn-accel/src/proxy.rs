//! The proxy: one listening port, every role. A connection that starts with
//! the hop magic comes from a peer proxy (this proxy is a transport, or the
//! egress when the chain ends here); anything else is a client's HTTP/1.1
//! request (this proxy is the ingress and the lookup proxy).
//!
//! ```text
//! client ─HTTP─▶ ingress ─hop─▶ transport ─hop─▶ egress ─HTTP─▶ origin
//!                  (lookup)                        (origin policy)
//! ```

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::{Mutex, RwLock};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use vcdn_http::header::is_hop_by_hop;
use vcdn_http::request::{parse_request, BodyFraming, Limits, RequestHead};
use vcdn_http::response::{parse_response, reason, ResponseFraming};
use vcdn_http::serve::Response;
use vcdn_policy::origin::OriginPolicy;

use crate::conn::{write_all, Conn, Out};
use crate::estimate::{rounds, SizeEstimator};
use crate::metrics::{ErrorKind, Metrics};
use crate::pool::Pool;
use crate::splice::Pipe;
use crate::table::ChainTable;
use crate::wire::{self, ErrorCode, Framing, HopError, HopHeader, Kind, Preamble};

/// How bodies are relayed after the heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMode {
    Splice,
    Sockmap,
}

impl RelayMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RelayMode::Splice => "splice",
            RelayMode::Sockmap => "sockmap",
        }
    }
}

/// Everything `vcdn proxy` is started with.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// This proxy's location name.
    pub name: String,
    pub service: String,
    /// `http://host[:port][/base]`.
    pub origin: String,
    pub origin_policy: String,
    /// Key of the hop headers' tags (shared by the service's proxies).
    pub hop_key: Option<String>,
    pub peers: HashMap<String, SocketAddr>,
    /// Where chains end when there is no table (default: this proxy).
    pub egress: Option<String>,
    pub chains: Option<ChainTable>,
    /// Pre-opened connections kept per next hop; 0: none, and no
    /// connection is reused either (a fresh one per hop and exchange, as
    /// the paper's proxies).
    pub warm: usize,
    /// Bytes of the warm-up transfer on each new pooled hop connection (0: none).
    pub warmup_bytes: u64,
    pub relay: RelayMode,
    pub idle_exit: Option<Duration>,
    pub instance_id: Option<String>,
    pub admin_token: Option<String>,
    /// Serve the admin API over HTTPS with this configuration; without it
    /// the admin API is plain HTTP, refused off loopback.
    pub admin_tls: Option<Arc<vcdn_http::tls::rustls::ServerConfig>>,
    pub controller: Option<String>,
    pub controller_token: Option<String>,
    /// The controller's certificate fingerprint (an `https` controller
    /// with a self-signed certificate).
    pub controller_fingerprint: Option<String>,
    pub timeouts: Timeouts,
    /// Largest request body a client may send (413 beyond).
    pub max_body: u64,
    /// How long a failed hop is skipped by new requests.
    pub down_for: Duration,
    /// Set `net.ipv4.tcp_slow_start_after_idle=0` at start (it is per
    /// network namespace: in the host's own namespace it changes the host).
    pub tune_sysctl: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A client's request head must arrive within this (408 otherwise).
    pub header: Duration,
    /// Idle keep-alive client connections are closed after this.
    pub idle: Duration,
    pub connect: Duration,
    /// First byte of an answer from the next hop or the origin.
    pub response: Duration,
    /// No progress of a body for this long fails the transfer.
    pub stall: Duration,
    /// Exchanges in flight get this long to finish on SIGTERM.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            connect: Duration::from_secs(2),
            response: Duration::from_secs(30),
            stall: Duration::from_secs(30),
            drain: Duration::from_secs(10),
        }
    }
}

impl ProxyConfig {
    pub fn new(name: &str, service: &str, origin: &str) -> ProxyConfig {
        ProxyConfig {
            name: name.into(),
            service: service.into(),
            origin: origin.into(),
            origin_policy: String::new(),
            hop_key: None,
            peers: HashMap::new(),
            egress: None,
            chains: None,
            warm: 2,
            warmup_bytes: 256 * 1024,
            relay: RelayMode::Splice,
            idle_exit: None,
            instance_id: None,
            admin_token: None,
            admin_tls: None,
            controller: None,
            controller_token: None,
            controller_fingerprint: None,
            timeouts: Timeouts::default(),
            max_body: 1 << 30,
            down_for: Duration::from_secs(3),
            tune_sysctl: true,
        }
    }
}

/// The origin, parsed once; its name is resolved at every connect.
#[derive(Debug)]
struct OriginUrl {
    host_port: String,
    authority: String,
    base: String,
}

fn parse_origin(url: &str) -> Result<OriginUrl, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("origin {url:?} must be an http:// URL"))?;
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if auth.is_empty() || auth.contains('@') || !vcdn_http::request::valid_host(auth.as_bytes()) {
        return Err(format!("origin {url:?} has no valid host"));
    }
    let host_port = if auth
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !auth.ends_with(']')
    {
        auth.to_string()
    } else {
        format!("{auth}:80")
    };
    Ok(OriginUrl {
        host_port,
        authority: auth.to_string(),
        base: path.to_string(),
    })
}

/// The pool key of the origin (no location name can contain a space).
const ORIGIN: &str = "origin ";

/// A running proxy's shared state.
pub struct Proxy {
    pub cfg: ProxyConfig,
    origin: OriginUrl,
    policy: OriginPolicy,
    peers: RwLock<HashMap<String, SocketAddr>>,
    table: RwLock<Option<(ChainTable, Instant)>>,
    /// Hops that failed recently, until when they are skipped.
    down: Mutex<HashMap<String, Instant>>,
    pool: Pool,
    pub estimator: SizeEstimator,
    pub metrics: Metrics,
    /// The RTT measurement service (probes, reports to the controller),
    /// started with the proxy; connect times of hop connections feed it.
    rtt: std::sync::OnceLock<crate::rtt::RttService>,
    pub started: Instant,
    /// `net.ipv4.tcp_slow_start_after_idle` as found after trying to set it to 0.
    pub slow_start_after_idle: Option<u8>,
    exchanges: AtomicUsize,
    /// Milliseconds since start of the last connection's end or start.
    last_activity_ms: AtomicU64,
    shutdown: watch::Sender<bool>,
    /// Wakes the pool keeper (a peer was added or failed).
    refill: tokio::sync::Notify,
    log_budget: Mutex<(u64, u32)>,
    /// The verdict program and maps of `--relay sockmap` (loaded at start).
    sockmap: Option<Arc<crate::sockmap::Sockmap>>,
}

/// Relays that may run at once with `--relay sockmap` (map entries).
const SOCKMAP_RELAYS: u32 = 8192;

impl Proxy {
    /// A relaying task's pipe, with the sockmap when bodies go through it.
    fn with_sockmap(&self, mut pipe: Pipe) -> Pipe {
        pipe.sockmap = self.sockmap.clone();
        pipe
    }
}

/// Counts an exchange in flight while alive.
struct InFlight<'a>(&'a AtomicUsize);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A request body as it arrives at this proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqBody {
    None,
    Length(u64),
    /// The client's raw chunked coding.
    Chunked,
    /// Hop frames carrying the client's raw chunked coding.
    Frames,
}

/// Where an answer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    /// Back to the client as HTTP; `close` adds `Connection: close`.
    Client { close: bool },
    /// Back to the previous proxy as a preamble and frames.
    Hop,
}

/// How a delivered answer went.
struct Delivered {
    /// Body bytes (a Content-Length, or counted).
    body: u64,
    /// The client connection must close after it.
    close: bool,
}

/// Why an exchange failed.
#[derive(Debug)]
struct Failure {
    /// The next hop (location name) that failed, or none for the origin.
    hop: Option<String>,
    code: ErrorCode,
    message: String,
    /// Nothing was sent towards the next hop: a retry elsewhere is safe.
    nothing_sent: bool,
    /// Part of the answer already went out: nothing else can be said.
    answered: bool,
}

impl Failure {
    fn hop(hop: &str, message: String, nothing_sent: bool) -> Failure {
        Failure {
            hop: Some(hop.to_string()),
            code: ErrorCode::HopFailed,
            message,
            nothing_sent,
            answered: false,
        }
    }
    fn origin(message: String) -> Failure {
        Failure {
            hop: None,
            code: ErrorCode::Origin,
            message,
            nothing_sent: false,
            answered: false,
        }
    }
    fn answered(message: String) -> Failure {
        Failure {
            hop: None,
            code: ErrorCode::Origin,
            message,
            nothing_sent: false,
            answered: true,
        }
    }
}

/// Sets the congestion control (MOSTO used cubic) and no-delay on a hop socket.
fn tune_hop_socket(s: &TcpStream) {
    let _ = s.set_nodelay(true);
    let cc = b"cubic";
    // SAFETY: setsockopt with a valid buffer on a descriptor we own.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr().cast(),
            cc.len() as libc::socklen_t,
        );
    }
}

/// Tries (if `set`) to turn slow start after idle off, so pooled
/// connections keep their window; returns the value in force.
pub fn slow_start_after_idle_off(set: bool) -> Option<u8> {
    const P: &str = "/proc/sys/net/ipv4/tcp_slow_start_after_idle";
    if set {
        let _ = std::fs::write(P, "0");
    }
    let v = std::fs::read_to_string(P).ok()?.trim().parse().ok();
    if v != Some(0) && set {
        tracing::warn!(
            "net.ipv4.tcp_slow_start_after_idle is not 0 and could not be set: idle pooled connections fall back to slow start; run `sysctl -w net.ipv4.tcp_slow_start_after_idle=0` in this proxy's network namespace"
        );
    }
    v
}

impl Proxy {
    pub fn new(cfg: ProxyConfig) -> Result<Proxy, String> {
        if !wire::valid_name(&cfg.name) {
            return Err(format!("--name {:?}: 1-63 of A-Z a-z 0-9 . _ -", cfg.name));
        }
        if !wire::valid_name(&cfg.service) {
            return Err(format!(
                "--service {:?}: 1-63 of A-Z a-z 0-9 . _ -",
                cfg.service
            ));
        }
        for n in cfg.peers.keys().chain(cfg.egress.iter()) {
            if !wire::valid_name(n) {
                return Err(format!("location {n:?}: 1-63 of A-Z a-z 0-9 . _ -"));
            }
        }
        if let Some(k) = &cfg.hop_key {
            vcdn_http::auth::check_token_strength("--hop-key", k)?;
        }
        if let Some(t) = &cfg.chains {
            t.validate(&cfg.name)
                .map_err(|e| format!("--chains: {e}"))?;
        }
        let origin = parse_origin(&cfg.origin)?;
        let policy: OriginPolicy = cfg
            .origin_policy
            .parse()
            .map_err(|e| format!("--origin-policy: {e}"))?;
        let (shutdown, _) = watch::channel(false);
        Ok(Proxy {
            peers: RwLock::new(cfg.peers.clone()),
            table: RwLock::new(cfg.chains.clone().map(|t| (t, Instant::now()))),
            down: Mutex::new(HashMap::new()),
            pool: Pool::new(Duration::from_secs(60)),
            estimator: SizeEstimator::default(),
            metrics: Metrics::default(),
            rtt: std::sync::OnceLock::new(),
            started: Instant::now(),
            slow_start_after_idle: None,
            exchanges: AtomicUsize::new(0),
            last_activity_ms: AtomicU64::new(0),
            shutdown,
            refill: tokio::sync::Notify::new(),
            log_budget: Mutex::new((0, 0)),
            sockmap: None,
            origin,
            policy,
            cfg,
        })
    }

    // ---- state the admin API reads and changes ----

    pub fn peers(&self) -> HashMap<String, SocketAddr> {
        self.peers.read().clone()
    }

    /// Replaces the peer set; connections to removed peers are dropped and
    /// new ones pre-opened.
    pub fn set_peers(&self, peers: HashMap<String, SocketAddr>) -> Result<(), String> {
        if let Some(n) = peers.keys().find(|n| !wire::valid_name(n)) {
            return Err(format!("peer name {n:?}: 1-63 of A-Z a-z 0-9 . _ -"));
        }
        let old = std::mem::replace(&mut *self.peers.write(), peers);
        let new = self.peers.read();
        for (name, addr) in old {
            if new.get(&name) != Some(&addr) {
                self.pool.forget(&name);
            }
        }
        if let Some(r) = self.rtt.get() {
            r.set_peers(new.iter().map(|(k, v)| (k.clone(), *v)).collect());
        }
        drop(new);
        // A new peer set is news about every peer: one marked down because
        // it was not started yet when this proxy pre-opened its pools gets
        // another chance now (a dead one is marked again at its next
        // failure).
        self.down.lock().clear();
        self.refill.notify_one();
        Ok(())
    }

    pub fn table(&self) -> Option<(ChainTable, Duration)> {
        self.table
            .read()
            .as_ref()
            .map(|(t, at)| (t.clone(), at.elapsed()))
    }

    pub fn set_table(&self, t: ChainTable) -> Result<(), String> {
        t.validate(&self.cfg.name)?;
        *self.table.write() = Some((t, Instant::now()));
        Ok(())
    }

    /// The RTT measurement service (none before `start`).
    pub fn rtt(&self) -> Option<&crate::rtt::RttService> {
        self.rtt.get()
    }

    pub fn pooled(&self) -> usize {
        self.pool.total()
    }

    pub fn exchanges_in_flight(&self) -> usize {
        self.exchanges.load(Ordering::SeqCst)
    }

    pub fn down_hops(&self) -> Vec<String> {
        let now = Instant::now();
        self.down
            .lock()
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(n, _)| n.clone())
            .collect()
    }

    pub fn is_stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Stops accepting; exchanges in flight finish (see [`run_until_stopped`]).
    pub fn begin_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    fn egress(&self) -> String {
        if let Some((t, _)) = &*self.table.read() {
            return t.egress.clone();
        }
        self.cfg
            .egress
            .clone()
            .unwrap_or_else(|| self.cfg.name.clone())
    }

    fn is_down(&self, hop: &str) -> bool {
        self.down
            .lock()
            .get(hop)
            .is_some_and(|until| *until > Instant::now())
    }

    fn mark_down(&self, hop: &str) {
        if self.peers.read().contains_key(hop) {
            self.down
                .lock()
                .insert(hop.to_string(), Instant::now() + self.cfg.down_for);
            self.pool.forget(hop);
        }
    }

    /// At most 10 warnings per second about what peers send.
    fn log_refusal(&self, peer: SocketAddr, what: &str) {
        let sec = self.started.elapsed().as_secs();
        let mut b = self.log_budget.lock();
        if b.0 != sec {
            *b = (sec, 0);
        }
        b.1 += 1;
        if b.1 <= 10 {
            tracing::warn!(%peer, "hop header refused: {what}");
        }
    }

    // ---- the chain ----

    /// The chain for a transfer of `r` rounds, without hops that are down:
    /// this proxy first, the egress last; just this proxy means "straight
    /// to the origin".
    fn choose_chain(&self, r: u32) -> Vec<String> {
        let me = &self.cfg.name;
        let mut chain = match &*self.table.read() {
            Some((t, _)) => t.pick(r).to_vec(),
            None => {
                let e = self.egress();
                if &e == me {
                    vec![me.clone()]
                } else {
                    vec![me.clone(), e]
                }
            }
        };
        chain.retain(|n| n == me || !self.is_down(n));
        chain
    }

    // ---- connections ----

    async fn connect_peer(&self, name: &str) -> Result<Conn, String> {
        let Some(addr) = self.peers.read().get(name).copied() else {
            return Err(format!("{name} is not in this proxy's peer set"));
        };
        let t0 = Instant::now();
        let s =
            match tokio::time::timeout(self.cfg.timeouts.connect, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(format!("cannot connect to {name} ({addr}): {e}")),
                Err(_) => return Err(format!("connecting to {name} ({addr}) timed out")),
            };
        // A connect is one SYN/SYN-ACK round trip: an RTT sample for free.
        if let Some(r) = self.rtt.get() {
            r.observe(name, t0.elapsed());
        }
        tune_hop_socket(&s);
        self.metrics.hop_opened.fetch_add(1, Ordering::Relaxed);
        Ok(Conn::new(s))
    }

    /// Returns a connection that finished an exchange to its pool; with
    /// `--warm 0` (the paper's proxies) every exchange has connections of
    /// its own, so it is closed instead.
    fn keep(&self, key: &str, c: Conn) {
        if self.cfg.warm > 0 {
            self.pool.put(key, c);
        }
    }

    /// A pooled connection to `name`, or a new one; says which.
    async fn hop_conn(&self, name: &str) -> Result<(Conn, bool), String> {
        if let Some(c) = self.pool.take(name) {
            self.metrics.hop_reused.fetch_add(1, Ordering::Relaxed);
            return Ok((c, true));
        }
        Ok((self.connect_peer(name).await?, false))
    }

    /// Resolves the origin now and connects to the first address the origin
    /// policy allows that answers.
    async fn connect_origin(&self) -> Result<Conn, String> {
        let t = self.cfg.timeouts.connect;
        let hp = &self.origin.host_port;
        let addrs: Vec<SocketAddr> =
            match tokio::time::timeout(t, tokio::net::lookup_host(hp)).await {
                Ok(Ok(a)) => a.collect(),
                Ok(Err(e)) => return Err(format!("origin {hp} does not resolve: {e}")),
                Err(_) => return Err(format!("resolving origin {hp} timed out")),
            };
        let mut why = format!("origin {hp} has no address");
        for a in addrs {
            if let Err(r) = self.policy.check(a) {
                why = r.to_string();
                continue;
            }
            match tokio::time::timeout(t, TcpStream::connect(a)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    self.metrics.origin_opened.fetch_add(1, Ordering::Relaxed);
                    return Ok(Conn::new(s));
                }
                Ok(Err(e)) => why = format!("cannot connect to origin {a}: {e}"),
                Err(_) => why = format!("connecting to origin {a} timed out"),
            }
        }
        Err(why)
    }

    /// Opens a hop connection for the pool and, if asked, runs a warm-up
    /// transfer on it so that the peer's congestion window towards this
    /// proxy (the direction answers flow) is open before a client needs it.
    async fn open_warm(&self, name: &str) -> Result<Conn, String> {
        let mut c = self.connect_peer(name).await?;
        let n = self.cfg.warmup_bytes.min(wire::MAX_WARMUP);
        if n == 0 {
            return Ok(c);
        }
        let key = self.cfg.hop_key.as_deref().unwrap_or("").as_bytes();
        let h = HopHeader {
            kind: Kind::Warmup,
            service: self.cfg.service.clone(),
            chain: vec![name.to_string()],
            body: Framing::Length(n),
            head_len: 0,
        };
        let t = self.cfg.timeouts.stall;
        let warm = async {
            write_all(&c.stream, &h.encode(b"", key), t).await?;
            let mut left = n + wire::RESPONSE_LEN as u64;
            while left > 0 {
                if c.buf.is_empty() && c.fill(t).await? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "closed during warm-up",
                    ));
                }
                let k = (c.buf.len() as u64).min(left) as usize;
                let _ = c.buf.split_to(k);
                left -= k as u64;
            }
            io::Result::Ok(())
        };
        warm.await
            .map_err(|e| format!("warm-up with {name} failed: {e}"))?;
        self.metrics.warmups.fetch_add(1, Ordering::Relaxed);
        Ok(c)
    }

    /// Keeps `--warm` idle connections open to every peer that is up.
    async fn keep_pools(self: Arc<Self>) {
        let mut shut = self.shutdown.subscribe();
        loop {
            let peers: Vec<String> = self.peers.read().keys().cloned().collect();
            for key in self.pool.keys() {
                if key != ORIGIN && !peers.contains(&key) {
                    self.pool.forget(&key);
                }
            }
            for p in peers {
                if p == self.cfg.name || self.is_down(&p) {
                    continue;
                }
                let have = self.pool.prune(&p, self.cfg.warm);
                for _ in have..self.cfg.warm {
                    match self.open_warm(&p).await {
                        Ok(c) => self.pool.put(&p, c),
                        Err(e) => {
                            tracing::debug!("pre-opening to {p}: {e}");
                            self.mark_down(&p);
                            break;
                        }
                    }
                }
            }
            self.pool.prune(ORIGIN, 0);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = self.refill.notified() => {}
                _ = shut.changed() => return,
            }
        }
    }

    // ---- heads ----

    /// The request head sent towards the origin: the origin's authority as
    /// Host, its base path before the target, hop-by-hop fields dropped
    /// (Transfer-Encoding kept: it frames the body), X-Forwarded-For added.
    fn origin_head(&self, head: &RequestHead, client: SocketAddr) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(&head.method_raw);
        out.push(b' ');
        out.extend_from_slice(self.origin.base.as_bytes());
        out.extend_from_slice(head.path_and_query());
        out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        out.extend_from_slice(self.origin.authority.as_bytes());
        out.extend_from_slice(b"\r\n");
        let named: Vec<Vec<u8>> = head
            .headers
            .get_all(b"connection")
            .flat_map(|v| vcdn_http::header::list_items(v).map(|i| i.to_ascii_lowercase()))
            .collect();
        for (n, v) in head.headers.iter() {
            let lower = n.to_ascii_lowercase();
            if lower == b"host"
                || lower == b"x-forwarded-for"
                || (is_hop_by_hop(&lower) && lower != b"transfer-encoding")
                || named.contains(&lower)
            {
                continue;
            }
            out.extend_from_slice(n);
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        if let Some(host) = head.headers.get(b"host") {
            out.extend_from_slice(b"X-Forwarded-Host: ");
            out.extend_from_slice(host);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("X-Forwarded-For: {}\r\n\r\n", client.ip()).as_bytes());
        out
    }

    // ---- serving ----

    /// Serves one accepted connection: a peer's hop connection or a client.
    async fn serve(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        let mut c = Conn::new(stream);
        let t = self.cfg.timeouts.idle;
        while c.buf.len() < wire::MAGIC.len() && wire::MAGIC.starts_with(&c.buf) {
            match c.fill(t).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        if c.buf.starts_with(wire::MAGIC) {
            self.metrics.accepted_hop.fetch_add(1, Ordering::Relaxed);
            tune_hop_socket(&c.stream);
            self.hop_loop(c, peer).await;
        } else {
            self.metrics.accepted_client.fetch_add(1, Ordering::Relaxed);
            let _ = c.stream.set_nodelay(true);
            self.client_loop(c, peer).await;
        }
    }

    fn in_flight(&self) -> InFlight<'_> {
        self.exchanges.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.exchanges)
    }

    async fn reply(&self, c: &Conn, r: Response) {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nConnection: close\r\n",
            r.status,
            reason(r.status)
        );
        for (n, v) in &r.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        let vcdn_http::serve::Body::Full(b) = r.body else {
            return;
        };
        out.push_str(&format!("Content-Length: {}\r\n\r\n", b.len()));
        let mut v = out.into_bytes();
        v.extend_from_slice(&b);
        let _ = write_all(&c.stream, &v, Duration::from_secs(2)).await;
    }

    /// The ingress: HTTP/1.1 requests of one client connection.
    async fn client_loop(&self, mut c: Conn, peer: SocketAddr) {
        let mut pipe = match Pipe::new().map(|p| self.with_sockmap(p)) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("cannot make a pipe: {e}");
                return self
                    .reply(&c, Response::problem(503, "the proxy is out of resources"))
                    .await;
            }
        };
        let mut shut = self.shutdown.subscribe();
        let limits = Limits::default();
        loop {
            // Read a complete head: the idle timeout before its first
            // byte, the header timeout (slowloris) once it has started.
            let started = Instant::now();
            let head = loop {
                let frozen = Bytes::copy_from_slice(&c.buf);
                match parse_request(&frozen, &limits) {
                    Ok(Some((h, n))) => {
                        let _ = c.buf.split_to(n);
                        break h;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.metrics.error(ErrorKind::BadRequest);
                        return self
                            .reply(&c, Response::problem(e.status(), &e.to_string()))
                            .await;
                    }
                }
                let wait = if c.buf.is_empty() {
                    self.cfg.timeouts.idle
                } else {
                    self.cfg.timeouts.header.saturating_sub(started.elapsed())
                };
                tokio::select! {
                    r = c.fill(wait) => match r {
                        Ok(0) => return,
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::TimedOut && !c.buf.is_empty() => {
                            self.metrics.error(ErrorKind::BadRequest);
                            return self.reply(&c, Response::problem(408, "the request head did not arrive in time")).await;
                        }
                        Err(_) => return,
                    },
                    _ = shut.changed(), if c.buf.is_empty() => return,
                }
            };
            let body = match head.body {
                BodyFraming::None => ReqBody::None,
                BodyFraming::Length(n) if n > self.cfg.max_body => {
                    self.metrics.error(ErrorKind::BadRequest);
                    let m = format!(
                        "request body of {n} bytes is larger than this proxy's limit of {} bytes",
                        self.cfg.max_body
                    );
                    return self.reply(&c, Response::problem(413, &m)).await;
                }
                BodyFraming::Length(0) => ReqBody::None,
                BodyFraming::Length(n) => ReqBody::Length(n),
                BodyFraming::Chunked => ReqBody::Chunked,
            };
            if head.expect_continue
                && write_all(
                    &c.stream,
                    b"HTTP/1.1 100 Continue\r\n\r\n",
                    self.cfg.timeouts.stall,
                )
                .await
                .is_err()
            {
                return;
            }
            let _guard = self.in_flight();
            self.metrics.requests.fetch_add(1, Ordering::Relaxed);
            let keep = self.ingress(&mut c, &head, body, peer, &mut pipe).await;
            if !keep || !head.keep_alive {
                return;
            }
        }
    }

    /// One exchange as the ingress: estimate, look up, forward, fall back.
    /// Returns whether the client connection may carry another request.
    async fn ingress(
        &self,
        c: &mut Conn,
        head: &RequestHead,
        body: ReqBody,
        peer: SocketAddr,
        pipe: &mut Pipe,
    ) -> bool {
        let estimate = self.estimator.estimate(head.path());
        let r = rounds(estimate);
        let mut chain = self.choose_chain(r);
        let origin_head = self.origin_head(head, peer);
        let close = !head.keep_alive;
        let mut retried = false;
        loop {
            self.metrics.chose(chain.len(), r);
            let sink = Sink::Client { close };
            let res = if chain.len() == 1 {
                self.via_origin(c, &origin_head, body, sink, pipe).await
            } else {
                self.via_hop(c, &chain, &origin_head, body, sink, pipe)
                    .await
            };
            match res {
                Ok(d) => {
                    self.estimator.record(head.path(), d.body);
                    return !d.close;
                }
                Err(f) => {
                    if let Some(h) = &f.hop {
                        self.metrics.error(ErrorKind::HopFailed);
                        self.mark_down(h);
                    } else if !f.answered {
                        self.metrics.error(ErrorKind::OriginFailed);
                    }
                    let retry_ok =
                        f.nothing_sent || (body == ReqBody::None && head.method.is_idempotent());
                    if f.hop.is_some() && !f.answered && !retried && retry_ok {
                        let failed = f.hop.clone().unwrap_or_default();
                        tracing::warn!("{}; retrying without {failed}", f.message);
                        self.metrics.error(ErrorKind::Fallback);
                        retried = true;
                        chain.retain(|n| n != &failed);
                        continue;
                    }
                    if f.answered {
                        self.metrics.error(ErrorKind::Truncated);
                        tracing::warn!("answer cut short: {}", f.message);
                    } else {
                        tracing::warn!("exchange failed: {}", f.message);
                        self.reply(c, Response::problem(502, &f.message)).await;
                    }
                    return false;
                }
            }
        }
    }

    /// Sends an exchange to the next hop of `chain` (chain[0] is this
    /// proxy) and delivers its answer to `sink` on `down`.
    async fn via_hop(
        &self,
        down: &mut Conn,
        chain: &[String],
        head: &[u8],
        body: ReqBody,
        sink: Sink,
        pipe: &mut Pipe,
    ) -> Result<Delivered, Failure> {
        let next = &chain[1];
        let key = self.cfg.hop_key.as_deref().unwrap_or("").as_bytes();
        let h = HopHeader {
            kind: Kind::Exchange,
            service: self.cfg.service.clone(),
            chain: chain[1..].to_vec(),
            body: match body {
                ReqBody::None => Framing::None,
                ReqBody::Length(n) => Framing::Length(n),
                ReqBody::Chunked | ReqBody::Frames => Framing::Frames,
            },
            head_len: head.len() as u32,
        };
        let pre = h.encode(head, key);
        let t = self.cfg.timeouts.stall;
        // A pooled connection the peer closed meanwhile fails at once; one
        // more try on a fresh connection is safe while nothing of the body
        // has been read from the client.
        let mut attempt = 0;
        let (mut up, preamble) = loop {
            attempt += 1;
            let (mut up, reused) = if attempt == 1 {
                self.hop_conn(next).await
            } else {
                self.connect_peer(next).await.map(|c| (c, false))
            }
            .map_err(|e| Failure::hop(next, e, true))?;
            let sent = async {
                write_all(&up.stream, &pre, t).await?;
                let mut sent = 0u64;
                match body {
                    ReqBody::None => {}
                    ReqBody::Length(n) => {
                        down.relay(&up.stream, n, pipe, t).await?;
                        sent = n;
                    }
                    ReqBody::Chunked => {
                        sent = down.copy_chunked(&up.stream, Out::Frames, pipe, t).await?
                    }
                    ReqBody::Frames => {
                        sent = down.copy_frames(&up.stream, Out::Frames, pipe, t).await?
                    }
                }
                io::Result::Ok(sent)
            }
            .await;
            let sent = match sent {
                Ok(s) => s,
                Err(e) if reused && body == ReqBody::None && attempt == 1 => {
                    tracing::debug!("pooled connection to {next} failed ({e}); trying a new one");
                    continue;
                }
                Err(e) => return Err(Failure::hop(next, format!("sending to {next}: {e}"), false)),
            };
            self.metrics.hop_bytes(next, pre.len() as u64 + sent, 0);
            match self.read_preamble(&mut up, next).await {
                Ok(p) => break (up, p),
                Err(e) if reused && body == ReqBody::None && attempt == 1 => {
                    tracing::debug!("pooled connection to {next} failed ({e}); trying a new one");
                }
                Err(e) => return Err(Failure::hop(next, e, false)),
            }
        };
        let (head_len, framing, close) = match preamble {
            Preamble::Error { code, hop, message } => {
                let failed = if hop.is_empty() { None } else { Some(hop) };
                return Err(Failure {
                    nothing_sent: false,
                    answered: false,
                    message: format!("{next} answered: {message}"),
                    hop: if code == ErrorCode::HopFailed {
                        failed
                    } else {
                        None
                    },
                    code,
                });
            }
            Preamble::Response {
                head_len,
                body,
                close,
            } => (head_len, body, close),
        };
        let rhead = up.take(head_len as usize, t).await.map_err(|e| {
            Failure::hop(
                next,
                format!("reading the answer's head from {next}: {e}"),
                false,
            )
        })?;
        let t = self.cfg.timeouts.stall;
        let out = if sink == Sink::Hop {
            Out::Frames
        } else {
            Out::Raw
        };
        let delivered = async {
            let close = self
                .send_head(&down.stream, rhead, framing, close, sink)
                .await?;
            let body = match framing {
                Framing::None => 0,
                Framing::Length(n) => up.relay(&down.stream, n, pipe, t).await.map(|_| n)?,
                Framing::Frames => up.copy_frames(&down.stream, out, pipe, t).await?,
            };
            io::Result::Ok(Delivered { body, close })
        }
        .await;
        let d = delivered
            .map_err(|e| Failure::answered(format!("relaying the answer from {next}: {e}")))?;
        if sink != Sink::Hop {
            self.metrics
                .client_bytes_out
                .fetch_add(d.body, Ordering::Relaxed);
        }
        self.metrics
            .hop_bytes(next, 0, d.body + u64::from(head_len));
        self.keep(next, up);
        Ok(d)
    }

    /// Reads a response preamble (or an error frame) from a next hop.
    async fn read_preamble(&self, up: &mut Conn, next: &str) -> Result<Preamble, String> {
        let t = self.cfg.timeouts.response;
        let first = up
            .take(1, t)
            .await
            .map_err(|e| format!("{next} failed before answering: {e}"))?;
        let t = self.cfg.timeouts.stall;
        let bad = |e: io::Error| format!("{next} sent a broken preamble: {e}");
        if first[0] == b'E' {
            let b = up.take(2, t).await.map_err(bad)?;
            let hop = up.take(b[1] as usize, t).await.map_err(bad)?;
            let l = up.take(2, t).await.map_err(bad)?;
            let len = (u16::from_be_bytes([l[0], l[1]]) as usize).min(wire::MAX_ERROR);
            let msg = up.take(len, t).await.map_err(bad)?;
            return Ok(wire::parse_error(b[0], &hop, &msg));
        }
        let rest = up.take(wire::RESPONSE_LEN - 1, t).await.map_err(bad)?;
        let mut fixed = [0u8; wire::RESPONSE_LEN];
        fixed[0] = first[0];
        fixed[1..].copy_from_slice(&rest);
        match wire::parse_response(&fixed) {
            Ok(Some(p)) => Ok(p),
            Ok(None) => Err(format!("{next} sent a broken preamble")),
            Err(e) => Err(format!("{next}: {e}")),
        }
    }

    /// Writes an answer's head to `sink`: as HTTP to a client (with
    /// `Connection: close` when the connection ends after it), or as a
    /// preamble to the previous proxy. Returns whether the client
    /// connection must close after the answer.
    async fn send_head(
        &self,
        down: &TcpStream,
        mut rhead: BytesMut,
        framing: Framing,
        close: bool,
        sink: Sink,
    ) -> io::Result<bool> {
        let t = self.cfg.timeouts.stall;
        let client_close = matches!(sink, Sink::Client { close: true }) || close;
        match sink {
            Sink::Client { .. } => {
                if client_close && rhead.len() >= 2 {
                    let at = rhead.len() - 2;
                    let tail = rhead.split_off(at);
                    rhead.extend_from_slice(b"Connection: close\r\n");
                    rhead.extend_from_slice(&tail);
                }
                write_all(down, &rhead, t).await?;
                self.metrics
                    .client_bytes_out
                    .fetch_add(rhead.len() as u64, Ordering::Relaxed);
            }
            Sink::Hop => {
                let mut v = wire::encode_response(rhead.len() as u32, framing, close).to_vec();
                v.extend_from_slice(&rhead);
                write_all(down, &v, t).await?;
            }
        }
        Ok(client_close)
    }

    /// Sends an exchange to the origin (this proxy is the egress, or the
    /// ingress going direct) and delivers the answer to `sink`.
    async fn via_origin(
        &self,
        down: &mut Conn,
        head: &[u8],
        body: ReqBody,
        sink: Sink,
        pipe: &mut Pipe,
    ) -> Result<Delivered, Failure> {
        let t = self.cfg.timeouts.stall;
        let mut attempt = 0;
        let is_head = head.starts_with(b"HEAD ");
        let (mut up, resp, n) = loop {
            attempt += 1;
            let (mut up, reused) = match self.pool.take(ORIGIN) {
                Some(c) if attempt == 1 => {
                    self.metrics.origin_reused.fetch_add(1, Ordering::Relaxed);
                    (c, true)
                }
                _ => (self.connect_origin().await.map_err(Failure::origin)?, false),
            };
            let sent = async {
                write_all(&up.stream, head, t).await?;
                match body {
                    ReqBody::None => Ok(0),
                    ReqBody::Length(n) => down.relay(&up.stream, n, pipe, t).await.map(|_| n),
                    ReqBody::Chunked => down.copy_chunked(&up.stream, Out::Raw, pipe, t).await,
                    ReqBody::Frames => down.copy_frames(&up.stream, Out::Raw, pipe, t).await,
                }
            }
            .await;
            let retry = reused && body == ReqBody::None && attempt == 1;
            let sent = match sent {
                Ok(s) => s,
                Err(_) if retry => continue,
                Err(e) => return Err(Failure::origin(format!("sending to the origin: {e}"))),
            };
            self.metrics
                .hop_bytes("origin", head.len() as u64 + sent, 0);
            match self.read_origin_head(&mut up).await {
                Ok((resp, n)) => break (up, resp, n),
                Err(_) if retry => continue,
                Err(e) => return Err(Failure::origin(e)),
            }
        };
        let framing = resp
            .framing(is_head)
            .map_err(|e| Failure::origin(format!("the origin's answer is unusable: {e}")))?;
        let _ = up.buf.split_to(n);
        let rhead = clean_response_head(&resp);
        let (hop_framing, close) = match framing {
            ResponseFraming::Empty => (Framing::None, false),
            ResponseFraming::Length(0) => (Framing::None, false),
            ResponseFraming::Length(n) => (Framing::Length(n), false),
            ResponseFraming::Chunked => (Framing::Frames, false),
            ResponseFraming::UntilClose => (Framing::Frames, true),
        };
        let out = if sink == Sink::Hop {
            Out::Frames
        } else {
            Out::Raw
        };
        let res = async {
            let close = self
                .send_head(&down.stream, rhead, hop_framing, close, sink)
                .await?;
            let body = match framing {
                ResponseFraming::Empty => 0,
                ResponseFraming::Length(n) => {
                    up.relay(&down.stream, n, pipe, t).await.map(|_| n)?
                }
                ResponseFraming::Chunked => up.copy_chunked(&down.stream, out, pipe, t).await?,
                ResponseFraming::UntilClose => up.copy_until_close(&down.stream, out, t).await?,
            };
            io::Result::Ok(Delivered { body, close })
        }
        .await;
        let d = res.map_err(|e| Failure::answered(format!("relaying the origin's answer: {e}")))?;
        if sink != Sink::Hop {
            self.metrics
                .client_bytes_out
                .fetch_add(d.body, Ordering::Relaxed);
        }
        self.metrics.hop_bytes("origin", 0, d.body + n as u64);
        if resp.keep_alive() && framing != ResponseFraming::UntilClose {
            self.keep(ORIGIN, up);
        }
        Ok(d)
    }

    /// Reads the origin's final response head (interim 1xx skipped).
    async fn read_origin_head(
        &self,
        up: &mut Conn,
    ) -> Result<(vcdn_http::ResponseHead, usize), String> {
        let limits = Limits::default();
        let started = Instant::now();
        loop {
            let frozen = Bytes::copy_from_slice(&up.buf);
            match parse_response(&frozen, &limits) {
                Ok(Some((h, n))) if (100..200).contains(&h.status) && h.status != 101 => {
                    let _ = up.buf.split_to(n);
                    continue;
                }
                Ok(Some((h, _))) if h.status == 101 => {
                    return Err(
                        "the origin switched protocols, which a proxy chain does not carry".into(),
                    )
                }
                Ok(Some(x)) => return Ok(x),
                Ok(None) => {}
                Err(e) => return Err(format!("the origin sent a broken answer: {e}")),
            }
            let left = self.cfg.timeouts.response.saturating_sub(started.elapsed());
            match up.fill(left).await {
                Ok(0) => return Err("the origin closed the connection before answering".into()),
                Ok(_) => {}
                Err(e) => return Err(format!("the origin did not answer: {e}")),
            }
        }
    }

    /// A peer's hop connection: exchanges one after another.
    async fn hop_loop(&self, mut c: Conn, peer: SocketAddr) {
        let mut pipe = match Pipe::new().map(|p| self.with_sockmap(p)) {
            Ok(p) => p,
            Err(_) => return,
        };
        let mut shut = self.shutdown.subscribe();
        loop {
            let prefix = tokio::select! {
                r = c.take(wire::PREFIX_LEN, self.cfg.timeouts.idle) => match r { Ok(p) => p, Err(_) => return },
                _ = shut.changed(), if c.buf.is_empty() => return,
            };
            let _guard = self.in_flight();
            let (h, head) = match self.read_hop_header(&mut c, &prefix).await {
                Ok(x) => x,
                Err(e) => {
                    self.metrics.error(ErrorKind::HeaderRefused);
                    self.log_refusal(peer, &e);
                    let _ = write_all(
                        &c.stream,
                        &wire::encode_error(ErrorCode::Refused, "", &e),
                        Duration::from_secs(2),
                    )
                    .await;
                    return;
                }
            };
            if h.kind == Kind::Warmup {
                let Framing::Length(n) = h.body else { return };
                if self.send_padding(&c.stream, n).await.is_err() {
                    return;
                }
                self.metrics.warmups.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let body = match h.body {
                Framing::None => ReqBody::None,
                Framing::Length(n) => ReqBody::Length(n),
                Framing::Frames => ReqBody::Frames,
            };
            let res = if h.chain.len() == 1 {
                self.via_origin(&mut c, &head, body, Sink::Hop, &mut pipe)
                    .await
            } else {
                let chain: Vec<String> = h.chain.clone();
                self.via_hop(&mut c, &chain, &head, body, Sink::Hop, &mut pipe)
                    .await
            };
            if let Err(f) = res {
                if f.answered {
                    self.metrics.error(ErrorKind::Truncated);
                    tracing::warn!("answer cut short: {}", f.message);
                    return;
                }
                match &f.hop {
                    Some(hop) if f.code == ErrorCode::HopFailed => {
                        self.metrics.error(ErrorKind::HopFailed);
                        self.mark_down(hop);
                    }
                    _ => self.metrics.error(ErrorKind::OriginFailed),
                }
                tracing::warn!("exchange from {peer} failed: {}", f.message);
                let frame = wire::encode_error(f.code, f.hop.as_deref().unwrap_or(""), &f.message);
                let _ = write_all(&c.stream, &frame, Duration::from_secs(2)).await;
                return;
            }
        }
    }

    /// Reads and checks the rest of a hop header after its prefix.
    async fn read_hop_header(
        &self,
        c: &mut Conn,
        prefix: &[u8],
    ) -> Result<(HopHeader, Vec<u8>), String> {
        let p: [u8; wire::PREFIX_LEN] = prefix.try_into().expect("prefix length");
        let t = self.cfg.timeouts.header;
        let n = wire::parse_prefix(&p).map_err(|e| e.to_string())?;
        let fields = c.take(n, t).await.map_err(|e| format!("hop header: {e}"))?;
        let h = wire::parse_fields(&fields).map_err(|e| e.to_string())?;
        let head = c
            .take(h.head_len as usize, t)
            .await
            .map_err(|e| format!("hop header: {e}"))?;
        let tag = c
            .take(wire::TAG_LEN, t)
            .await
            .map_err(|e| format!("hop header: {e}"))?;
        let mut signed = Vec::with_capacity(wire::PREFIX_LEN + n);
        signed.extend_from_slice(prefix);
        signed.extend_from_slice(&fields);
        let key = self.cfg.hop_key.as_deref().unwrap_or("").as_bytes();
        wire::verify(key, &signed, &head, &tag).map_err(|e: HopError| e.to_string())?;
        if h.service != self.cfg.service {
            return Err(format!(
                "wrong service {:?}: this proxy serves {:?}",
                h.service, self.cfg.service
            ));
        }
        if h.chain[0] != self.cfg.name {
            return Err(format!(
                "the chain names {:?} first, but this proxy is {:?}",
                h.chain[0], self.cfg.name
            ));
        }
        if let Some(next) = h.chain.get(1) {
            if !self.peers.read().contains_key(next) {
                return Err(format!(
                    "unknown next hop {next:?}: not in this proxy's peer set"
                ));
            }
        }
        Ok((h, head.to_vec()))
    }

    async fn send_padding(&self, to: &TcpStream, n: u64) -> io::Result<()> {
        static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
        let t = self.cfg.timeouts.stall;
        write_all(to, &wire::encode_response(0, Framing::Length(n), false), t).await?;
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len() as u64) as usize;
            write_all(to, &ZEROS[..k], t).await?;
            left -= k as u64;
        }
        Ok(())
    }
}

/// The origin's response head without hop-by-hop fields (Transfer-Encoding
/// kept: the body is passed on in its chunked coding).
fn clean_response_head(resp: &vcdn_http::ResponseHead) -> BytesMut {
    let mut out = BytesMut::with_capacity(256);
    out.extend_from_slice(
        format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status)).as_bytes(),
    );
    let named: Vec<Vec<u8>> = resp
        .headers
        .get_all(b"connection")
        .flat_map(|v| vcdn_http::header::list_items(v).map(|i| i.to_ascii_lowercase()))
        .collect();
    for (n, v) in resp.headers.iter() {
        let lower = n.to_ascii_lowercase();
        if (is_hop_by_hop(&lower) && lower != b"transfer-encoding") || named.contains(&lower) {
            continue;
        }
        out.extend_from_slice(n);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Where a started proxy listens.
pub struct Running {
    pub proxy: Arc<Proxy>,
    pub listen: SocketAddr,
    pub admin: Option<SocketAddr>,
}

/// Starts the proxy on `listener` (and the admin API on `admin`), returns
/// at once; [`run_until_stopped`] then serves until SIGTERM or idle exit.
pub async fn start(
    mut cfg: ProxyConfig,
    listener: std::net::TcpListener,
    admin: Option<SocketAddr>,
) -> Result<Running, String> {
    if let (Some(a), None) = (admin, &cfg.admin_tls) {
        vcdn_http::admin_tls::check_plain(a)?;
    }
    if cfg.hop_key.is_none() && (!cfg.peers.is_empty() || cfg.egress.is_some()) {
        tracing::warn!("no --hop-key: hop headers from peers will be refused and none can be sent");
    }
    cfg.warm = cfg.warm.min(crate::pool::MAX_IDLE_PER_KEY);
    let mut proxy = Proxy::new(cfg)?;
    if proxy.cfg.relay == RelayMode::Sockmap {
        let map = crate::sockmap::Sockmap::new(SOCKMAP_RELAYS).map_err(|e| {
            format!("--relay sockmap: {e} (needs CAP_BPF and CAP_NET_ADMIN); use --relay splice")
        })?;
        proxy.sockmap = Some(Arc::new(map));
    }
    proxy.slow_start_after_idle = slow_start_after_idle_off(proxy.cfg.tune_sysctl);
    let mut rc = crate::rtt::RttConfig::new(&proxy.cfg.name, &proxy.cfg.service);
    rc.peers = proxy
        .cfg
        .peers
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    if let Some(url) = &proxy.cfg.controller {
        let token = proxy
            .cfg
            .controller_token
            .clone()
            .ok_or("--controller needs --controller-token (or VCDN_PROXY_CONTROLLER_TOKEN)")?;
        rc.controller = Some(crate::rtt::Controller {
            url: url.clone(),
            token,
            fingerprint: proxy.cfg.controller_fingerprint.clone(),
        });
    }
    let rtt = crate::rtt::RttService::start(rc).map_err(|e| format!("--controller: {e}"))?;
    let _ = proxy.rtt.set(rtt);
    let proxy = Arc::new(proxy);
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let listen = listener.local_addr().map_err(|e| e.to_string())?;
    let listener = TcpListener::from_std(listener).map_err(|e| e.to_string())?;
    let admin = match admin {
        Some(a) => {
            let l = TcpListener::bind(a)
                .await
                .map_err(|e| format!("cannot listen on admin {a}: {e}"))?;
            let addr = l.local_addr().map_err(|e| e.to_string())?;
            let h = crate::admin::handler(proxy.clone());
            let serve = vcdn_http::serve::ServeConfig {
                tls: proxy.cfg.admin_tls.clone(),
                ..Default::default()
            };
            tokio::spawn(vcdn_http::serve::serve(l, serve, h));
            Some(addr)
        }
        None => None,
    };
    tokio::spawn(accept_loop(proxy.clone(), listener));
    tokio::spawn(proxy.clone().keep_pools());
    Ok(Running {
        proxy,
        listen,
        admin,
    })
}

async fn accept_loop(p: Arc<Proxy>, listener: TcpListener) {
    let mut shut = p.shutdown.subscribe();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((s, peer)) => {
                    let p2 = p.clone();
                    p.metrics.open_connections.fetch_add(1, Ordering::SeqCst);
                    p.touch();
                    tokio::spawn(async move {
                        p2.clone().serve(s, peer).await;
                        p2.metrics.open_connections.fetch_sub(1, Ordering::SeqCst);
                        p2.touch();
                    });
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shut.changed() => return,
        }
    }
}

impl Proxy {
    fn touch(&self) {
        self.last_activity_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::SeqCst);
    }
}

/// Serves until SIGTERM/SIGINT (or `--idle-exit`), then stops accepting and
/// lets exchanges in flight finish, at most the drain timeout. `stop` is
/// installed before the proxy starts (see [`vcdn_http::stop`]).
pub async fn run_until_stopped(p: Arc<Proxy>, mut stop: vcdn_http::stop::StopSignal) {
    let idle = p.cfg.idle_exit;
    let idle_wait = async {
        let Some(idle) = idle else {
            return std::future::pending::<()>().await;
        };
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let last = Duration::from_millis(p.last_activity_ms.load(Ordering::SeqCst));
            if p.metrics.open_connections.load(Ordering::SeqCst) == 0
                && p.started.elapsed().saturating_sub(last) >= idle
            {
                tracing::info!("no connection for {idle:?}: exiting (--idle-exit)");
                return;
            }
        }
    };
    tokio::select! {
        sig = stop.recv() => tracing::info!("{sig}: finishing exchanges in flight"),
        _ = idle_wait => {}
    }
    p.begin_shutdown();
    let deadline = Instant::now() + p.cfg.timeouts.drain;
    while p.exchanges_in_flight() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_urls() {
        let o = parse_origin("http://127.0.0.1:9000/base/").unwrap();
        assert_eq!(
            (o.host_port.as_str(), o.base.as_str()),
            ("127.0.0.1:9000", "/base")
        );
        assert_eq!(
            parse_origin("http://example.com").unwrap().host_port,
            "example.com:80"
        );
        assert!(parse_origin("https://x").is_err());
        assert!(parse_origin("http://u@x/").is_err());
    }
}
