//! Test support: start real `vcdn` processes on loopback and talk to them.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vcdn_http::client::{self, ClientResponse};

pub mod bed;
pub mod browser;
pub mod up;

pub const TOKEN: &str = "test-token-0123456789abcdef01234567";

/// A running `vcdn` process, killed when dropped.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// Where a cache started with `--tls-listen` serves TLS.
    pub tls: Option<SocketAddr>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A small capacity model: one vCPU keeps MOS >= 4 for 20 HD sessions
/// (so an elastic service scales out at a few dozen viewers).
pub fn small_capacity_model(dir: &Path) -> String {
    let p = dir.join("capacity.toml");
    std::fs::write(
        &p,
        "source = \"test\"\n[[throughput]]\nobject_bytes = 425000\nrequests_per_s = 20\n[[video]]\nbitrate_kbps = 1700\nchunk_s = 2.0\npoints = [{ sessions = 10, mos = 4.8 }, { sessions = 20, mos = 4.0 }, { sessions = 40, mos = 2.0 }]\n",
    )
    .unwrap();
    p.to_string_lossy().into_owned()
}

/// Start `vcdn ARGS` and wait (at most 10 s) for it to print its addresses.
pub fn spawn(args: &[&str]) -> Proc {
    spawn_env(args, &[])
}

/// [`spawn`] with these environment variables.
pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(args)
        .envs(env.iter().copied())
        .env("VCDN_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("vcdn starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let want_admin = args.contains(&"--admin");
    let want_tls = args.contains(&"--tls-listen");
    let (mut addr, mut admin, mut tls) = (None, None, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while addr.is_none() || (want_admin && admin.is_none()) || (want_tls && tls.is_none()) {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("vcdn {args:?} did not start"));
        let parse = |l: &str| -> Option<SocketAddr> {
            // http:// or https:// (an admin API over TLS).
            l.split("://")
                .nth(1)?
                .split([' ', ')'])
                .next()?
                .trim_end_matches('/')
                .parse()
                .ok()
        };
        if line.contains("TLS on https://") {
            tls = line
                .split("https://")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|a| a.parse().ok());
        } else if line.contains("admin on") {
            admin = parse(&line);
        } else if line.contains("listening on") {
            addr = parse(&line);
        }
    }
    Proc {
        child,
        addr: addr.expect("address"),
        admin,
        tls,
    }
}

pub fn origin() -> Proc {
    spawn(&["origin", "--listen", "127.0.0.1:0"])
}

/// A cache in front of `upstream` with an admin API and two serving threads
/// (unless `extra` says `--threads`), plus extra flags.
pub fn cache(upstream: SocketAddr, extra: &[&str]) -> Proc {
    cache_on("127.0.0.1:0", upstream, extra)
}

/// [`cache`], listening on `listen`.
pub fn cache_on(listen: &str, upstream: SocketAddr, extra: &[&str]) -> Proc {
    let up = format!("http://{upstream}");
    let mut args = vec![
        "cache",
        "--listen",
        listen,
        "--upstream",
        &up,
        "--admin",
        "127.0.0.1:0",
        "--admin-token",
        TOKEN,
    ];
    if !extra.contains(&"--threads") {
        args.extend_from_slice(&["--threads", "2"]);
    }
    args.extend_from_slice(extra);
    spawn(&args)
}

pub async fn get(addr: SocketAddr, path: &str) -> ClientResponse {
    get_with(addr, path, &[]).await
}

pub async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> ClientResponse {
    client::request(addr, "GET", path, headers, b"", Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> ClientResponse {
    client::request(addr, method, path, headers, body, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

pub fn x_cache(r: &ClientResponse) -> String {
    r.header("x-cache").unwrap_or("").to_string()
}

/// Requests the demo origin has served for `path`.
pub async fn origin_count(origin: SocketAddr, path: &str) -> u64 {
    let r = get(origin, "/_origin/requests").await;
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    v[path].as_u64().unwrap_or(0)
}

/// An admin API call with the token.
pub async fn admin(cache: &Proc, method: &str, path: &str, body: &str) -> ClientResponse {
    let auth = format!("Bearer {TOKEN}");
    request(
        cache.admin.expect("admin"),
        method,
        path,
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )
    .await
}

/// The expected bytes of the demo origin's synthetic object of size n.
pub fn synth(n: usize) -> Vec<u8> {
    (0..n as u64).map(vcdn_origin::byte_at).collect()
}

/// Send raw bytes on a new connection and read until the server closes
/// it or `timeout` passes.
pub fn raw(addr: SocketAddr, data: &[u8], timeout: Duration) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(timeout)).expect("timeout");
    s.write_all(data).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Status code of the first response in a raw reply.
pub fn status_of(raw: &str) -> u16 {
    raw.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// `dig +short` from a source address (the router locates clients by it):
/// the A records, sorted.
pub fn resolve(dns: SocketAddr, source: &str, name: &str) -> Vec<String> {
    let out = Command::new("dig")
        .args(["+short", "+time=2", "+tries=1", "-p"])
        .arg(dns.port().to_string())
        .args(["-b", source])
        .arg(format!("@{}", dns.ip()))
        .arg(name)
        .output()
        .expect("dig runs (apt install bind9-dnsutils)");
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// A service's instances in one region, as the API shows them.
pub fn region_instances(v: &serde_json::Value, region: &str) -> Vec<serde_json::Value> {
    v["graph"]["regions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["region"] == region)
        .flat_map(|r| r["instances"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Poll `f` every 20 ms until it is true, at most `secs` seconds.
pub async fn eventually<F, Fut>(secs: u64, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A test's scratch directory, removed when dropped so that test runs leave
/// nothing behind in the system's temporary directory. Declare it before the
/// processes that write into it: they are then stopped before it goes.
pub struct TempDir(pub PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TempDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn tempdir(name: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("vcdn-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tempdir");
    TempDir(d)
}

pub fn write_config(dir: &Path, text: &str) -> String {
    let p = dir.join("cache.toml");
    std::fs::write(&p, text).expect("config");
    p.to_string_lossy().into_owned()
}

/// Resident memory of a process, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A CA and an admin certificate it issued for `127.0.0.1`, written to
/// `dir`: (the CA, certificate file, key file).
pub fn admin_cert(dir: &Path) -> (vcdn_http::tls::Ca, String, String) {
    let ca = vcdn_http::tls::Ca::create("admin test CA", 2).expect("CA");
    let made = ca
        .issue(&["127.0.0.1".into(), "localhost".into()], 2)
        .expect("certificate");
    let (cp, kp) = (dir.join("admin.crt"), dir.join("admin.key"));
    std::fs::write(&cp, &made.cert_pem).expect("write");
    std::fs::write(&kp, &made.key_pem).expect("write");
    (
        ca,
        cp.to_string_lossy().into_owned(),
        kp.to_string_lossy().into_owned(),
    )
}

/// An admin API served over TLS with a certificate of `ca`, checked as its
/// users meet it: `/healthz` and `/metrics` (with `metric`) open over
/// HTTPS, `/stats` wants the token, curl trusting the CA gets in; plain
/// HTTP on the port gets no HTTP answer, and a client trusting another CA
/// refuses the certificate.
pub async fn assert_admin_https_only(admin: SocketAddr, ca: &vcdn_http::tls::Ca, metric: &str) {
    use vcdn_http::tls::{parse_chain, Trust};
    let trust = Trust::Bundle(parse_chain(ca.cert_pem.as_bytes()).unwrap());
    let url = format!("https://{admin}");
    let get = |path: &'static str, token: Option<&'static str>, trust: Trust| {
        let url = url.clone();
        async move {
            let auth = token.map(|t| format!("Bearer {t}"));
            let headers: Vec<(&str, &str)> =
                auth.iter().map(|a| ("Authorization", a.as_str())).collect();
            client::request_url(
                &url,
                &trust,
                "GET",
                path,
                &headers,
                b"",
                Duration::from_secs(5),
            )
            .await
        }
    };
    let r = get("/healthz", None, trust.clone()).await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    let r = get("/metrics", None, trust.clone()).await.unwrap();
    assert!(
        r.status() == 200 && r.text().contains(metric),
        "{}",
        r.text()
    );
    assert_eq!(
        get("/stats", None, trust.clone()).await.unwrap().status(),
        401
    );
    let r = get("/stats", Some(TOKEN), trust.clone()).await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    // curl, trusting the CA.
    let dir = tempdir(&format!("admin-ca-{}", admin.port()));
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca.cert_pem).unwrap();
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5", "-H"])
        .arg(format!("Authorization: Bearer {TOKEN}"))
        .arg("--cacert")
        .arg(&ca_file)
        .arg(format!("{url}/stats"))
        .output()
        .expect("curl runs");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && body.contains('{'), "{body}");
    // Plain HTTP on the TLS port: no HTTP answer, no token taken.
    let mut s = TcpStream::connect(admin).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(
        format!("GET /stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        !got.starts_with(b"HTTP/"),
        "plain HTTP answered on the TLS admin port: {}",
        String::from_utf8_lossy(&got)
    );
    // A client trusting another CA refuses the certificate.
    let other = vcdn_http::tls::Ca::create("another CA", 1).unwrap();
    let e = get(
        "/healthz",
        None,
        Trust::Bundle(parse_chain(other.cert_pem.as_bytes()).unwrap()),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("not trusted"), "{e}");
}

/// Waits at most `secs` for `child` to exit and returns its status; panics
/// saying `what` when it does not.
pub fn exited_within(
    child: &mut std::process::Child,
    secs: u64,
    what: &str,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `vcdn ARGS` expecting it to refuse to start (within 10 s): its
/// stderr.
pub fn refused_to_start(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(args)
        .env("VCDN_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vcdn starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            assert!(!st.success(), "vcdn {args:?} exited successfully: {err}");
            return err;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vcdn {args:?} started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
