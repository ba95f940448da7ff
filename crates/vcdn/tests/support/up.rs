//! `vcdn up` as a process that can be killed and started again on the same
//! data directory and ports, with the API calls tests make to it.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vcdn_http::client::{self, ClientResponse};
use vcdn_http::tls::Trust;

use super::{tempdir, TempDir};

pub const OP: &str = "operator-secret-0123456789abcdef0123";

/// A free port below the kernel's ephemeral range: `vcdn up` is killed and
/// started again on the same ports, so none of them may meanwhile become
/// the source port of some outgoing connection.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id().wrapping_mul(7919);
    loop {
        let port = 20_000
            + (base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) * 131) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
}

/// A `vcdn up` that can be killed and started again on the same data
/// directory and ports. On drop it is killed, and so is every cache
/// instance it started.
pub struct Up {
    pub child: Option<Child>,
    pub dir: TempDir,
    pub api: SocketAddr,
    pub origin: SocketAddr,
    pub instance_port: u16,
    pub instance_tls_port: u16,
    pub ports: [u16; 4],
    pub extra: Vec<String>,
    /// Started once with `--demo` (the demo customer and its key file).
    pub started: bool,
    /// What the last start printed, up to the `export VCDN_API=…` line.
    pub greeting: Vec<String>,
}

impl Drop for Up {
    fn drop(&mut self) {
        self.kill();
        for pid in instance_pids(self.instance_port) {
            // SAFETY: signalling a process id.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// A `vcdn cache` process: its pid and command-line flags.
#[derive(Debug)]
pub struct CacheProc {
    pub pid: u32,
    pub flags: HashMap<String, String>,
}

/// Live (not zombie) `vcdn SUBCOMMAND` processes: pid and arguments.
pub fn vcdn_processes(subcommand: &str) -> Vec<(u32, Vec<String>)> {
    live_processes()
        .into_iter()
        .filter(|(_, args)| args.get(1).map(String::as_str) == Some(subcommand))
        .collect()
}

/// Every live (not zombie) process: pid and arguments.
pub fn live_processes() -> Vec<(u32, Vec<String>)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let c = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            if stat.rsplit(')').next()?.trim_start().starts_with('Z') {
                return None;
            }
            let args: Vec<String> = c
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

/// `vcdn cache` processes listening on `port` (on any address).
pub fn caches(port: u16) -> Vec<CacheProc> {
    let suffix = format!(":{port}");
    vcdn_processes("cache")
        .into_iter()
        .filter_map(|(pid, args)| {
            let flags: HashMap<String, String> = args
                .windows(2)
                .filter(|w| w[0].starts_with("--"))
                .map(|w| (w[0].clone(), w[1].clone()))
                .collect();
            flags
                .get("--listen")
                .is_some_and(|l| l.ends_with(&suffix))
                .then_some(CacheProc { pid, flags })
        })
        .collect()
}

pub fn instance_pids(port: u16) -> Vec<u32> {
    caches(port).into_iter().map(|c| c.pid).collect()
}

impl Up {
    pub fn start(name: &str, extra: &[&str]) -> Up {
        Up::start_with_origin(name, SocketAddr::from(([127, 0, 0, 1], free_port())), extra)
    }

    /// With the demo origin on `origin` (one instances elsewhere reach).
    pub fn start_with_origin(name: &str, origin: SocketAddr, extra: &[&str]) -> Up {
        let mut up = Up {
            child: None,
            dir: tempdir(name),
            api: SocketAddr::from(([127, 0, 0, 1], free_port())),
            origin,
            instance_port: free_port(),
            instance_tls_port: free_port(),
            ports: [free_port(), free_port(), free_port(), free_port()],
            extra: extra.iter().map(|s| s.to_string()).collect(),
            started: false,
            greeting: Vec::new(),
        };
        up.launch().expect("vcdn up starts");
        up
    }

    /// Starts `vcdn up`; returns what it printed on stderr if it exits
    /// before it is ready.
    pub fn launch(&mut self) -> Result<(), String> {
        use std::io::BufRead;
        // The instances' admin port (the last) is in their records: it stays.
        let [dns, http, router, admin] = self.ports;
        let mut child = Command::new(env!("CARGO_BIN_EXE_vcdn"))
            .arg("up")
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--api", &self.api.to_string()])
            .args(["--dns", &format!("127.0.0.1:{dns}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(["--router-admin", &format!("127.0.0.1:{router}")])
            .args(["--operator-token", OP])
            .args(if self.started {
                vec![]
            } else {
                vec![
                    "--demo".to_string(),
                    "--demo-origin".into(),
                    self.origin.to_string(),
                ]
            })
            .args(["--instance-port", &self.instance_port.to_string()])
            .args(["--instance-tls-port", &self.instance_tls_port.to_string()])
            .args(["--instance-admin-port", &admin.to_string()])
            .args(&self.extra)
            .env("VCDN_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("vcdn up runs");
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut err = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (etx, erx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut s);
            eprint!("{s}");
            let _ = etx.send(s);
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        self.greeting.clear();
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) if l.contains("export VCDN_API=") => {
                    self.greeting.push(l);
                    break;
                }
                Ok(l) => self.greeting.push(l),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = child.wait();
                    return Err(erx.recv_timeout(Duration::from_secs(5)).unwrap_or_default());
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("vcdn up did not print its greeting within 20 s");
                }
            }
        }
        self.child = Some(child);
        self.started = true;
        Ok(())
    }

    /// Starts it again after a kill. Its API and router ports are not part
    /// of any record: should another process have taken one meanwhile, it
    /// moves to free ones.
    pub fn relaunch(&mut self) {
        for _ in 0..3 {
            match self.launch() {
                Ok(()) => return,
                Err(e) if e.contains("Address already in use") => {
                    self.api = SocketAddr::from(([127, 0, 0, 1], free_port()));
                    for p in &mut self.ports[..3] {
                        *p = free_port();
                    }
                }
                Err(e) => panic!("vcdn up does not start again: {e}"),
            }
        }
        panic!("vcdn up does not start again: its ports stay taken");
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn demo_key(&self) -> String {
        std::fs::read_to_string(self.dir.join("demo-customer-key"))
            .expect("demo customer key")
            .trim()
            .to_string()
    }

    /// The API as its clients reach it: HTTPS trusting the fingerprint
    /// `vcdn up` wrote in the data directory (plain HTTP when started so).
    pub fn api_client(&self) -> Api {
        Api::of(self.api, &self.dir)
    }

    pub async fn call(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        call(&self.api_client(), token, method, path, body)
            .await
            .expect("API answers")
    }

    /// GET `path` on an instance's admin API as the control plane calls
    /// it: HTTPS trusting only the internal CA (`DIR/ca.crt`), with the
    /// instance token.
    pub async fn instance_admin(
        &self,
        admin: &str,
        path: &str,
    ) -> Result<vcdn_http::client::ClientResponse, vcdn_http::client::ClientError> {
        let ca = std::fs::read(self.dir.join("ca.crt")).expect("vcdn up wrote ca.crt");
        let trust = Trust::Bundle(vcdn_http::tls::parse_chain(&ca).expect("ca.crt is PEM"));
        let token = std::fs::read_to_string(self.dir.join("instance-token"))
            .expect("vcdn up wrote instance-token");
        vcdn_http::client::request_url(
            &format!("https://{admin}"),
            &trust,
            "GET",
            path,
            &[("Authorization", &format!("Bearer {}", token.trim()))],
            b"",
            std::time::Duration::from_secs(5),
        )
        .await
    }

    /// Orders, with the demo customer's key, an elastic service `name`
    /// (hostname `NAME.example`) in `region` for `users` viewers at MOS 4
    /// and waits until it is active; returns its id.
    pub async fn order(&self, name: &str, region: &str, users: u32) -> String {
        let spec = serde_json::json!({"name": name, "origin": format!("http://{}", self.origin),
            "hostname": format!("{name}.example"), "flavor": "elastic",
            "regions": [{"region": region, "peak_users": users}], "quality": {"min_mos": 4.0}});
        let (st, s) = self
            .call(&self.demo_key(), "POST", "/v1/services", Some(spec))
            .await;
        assert_eq!(st, 201, "{s}");
        let id = s["id"].as_str().unwrap().to_string();
        let path = format!("/v1/services/{id}");
        assert!(
            super::eventually(15, || async {
                self.call(OP, "GET", &path, None).await.1["state"] == "active"
            })
            .await,
            "the service did not become active"
        );
        id
    }

    pub async fn services(&self) -> Vec<Value> {
        let (st, v) = self.call(OP, "GET", "/v1/services", None).await;
        assert_eq!(st, 200, "{v}");
        v["services"].as_array().cloned().unwrap_or_default()
    }
}

/// A control API's URL and whom its clients trust.
#[derive(Clone, Debug)]
pub struct Api {
    pub url: String,
    pub trust: Trust,
}

impl Api {
    /// `vcdn up`'s API on `addr` with data directory `dir`: HTTPS pinned to
    /// `DIR/api.fingerprint`, or plain HTTP if it wrote none.
    pub fn of(addr: SocketAddr, dir: &std::path::Path) -> Api {
        match std::fs::read_to_string(dir.join("api.fingerprint")) {
            Ok(fp) => Api {
                url: format!("https://{addr}"),
                trust: Trust::Fingerprint(
                    vcdn_http::tls::parse_fingerprint(&fp).expect("api.fingerprint is one"),
                ),
            },
            Err(_) => Api {
                url: format!("http://{addr}"),
                trust: Trust::System,
            },
        }
    }

    /// The fingerprint to export as VCDN_API_FINGERPRINT, if HTTPS.
    pub fn fingerprint(&self, dir: &std::path::Path) -> Option<String> {
        std::fs::read_to_string(dir.join("api.fingerprint"))
            .ok()
            .map(|f| f.trim().to_string())
    }

    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<ClientResponse, client::ClientError> {
        client::request_url(
            &self.url,
            &self.trust,
            method,
            path,
            headers,
            body,
            Duration::from_secs(30),
        )
        .await
    }

    /// A GET without credentials (/healthz, /metrics).
    pub async fn get(&self, path: &str) -> ClientResponse {
        self.request("GET", path, &[], b"")
            .await
            .expect("API answers")
    }
}

pub async fn call(
    api: &Api,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    let auth = format!("Bearer {token}");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let r = api
        .request(
            method,
            path,
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &auth),
            ],
            body.as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok((
        r.status(),
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    ))
}
