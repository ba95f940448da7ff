//! The request router, tested as users see it: `dig` from different
//! loopback source addresses (one region each) and with EDNS Client Subnet,
//! HTTP requests that follow redirects to real caches, caches killed and
//! restarted, services changed through the admin API, and a Zipf request
//! stream through real caches with and without the LRU admission filter.

mod support;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;
use vcdn_http::client::{self, ClientResponse};

const RTOKEN: &str = "router-token-0123456789abcdef0123456";

/// A running `vcdn router`.
struct RouterProc {
    child: Child,
    dns: SocketAddr,
    http: SocketAddr,
    admin: SocketAddr,
}

impl Drop for RouterProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_router(dir: &std::path::Path, config: &str) -> RouterProc {
    start_router_with(dir, config, &[])
}

/// [`start_router`] with extra flags.
fn start_router_with(dir: &std::path::Path, config: &str, extra: &[&str]) -> RouterProc {
    start_router_as(dir, config, extra, &[])
}

/// [`start_router_with`] run through `wrapper` (e.g. `setpriv …`).
fn start_router_as(
    dir: &std::path::Path,
    config: &str,
    extra: &[&str],
    wrapper: &[&str],
) -> RouterProc {
    use std::io::BufRead;
    let path = dir.join("router.toml");
    std::fs::write(&path, config).expect("router config");
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(env!("CARGO_BIN_EXE_vcdn"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_vcdn")),
    };
    let mut child = cmd
        .args([
            "router",
            "--dns",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .args(["--admin-token", RTOKEN, "--config"])
        .arg(&path)
        .args(extra)
        .env("VCDN_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("router starts");
    let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let (mut dns, mut http, mut admin) = (None, None, None);
    for line in out.lines().map_while(Result::ok) {
        let addr = |s: &str| -> Option<SocketAddr> {
            line.split(s).nth(1)?.split([' ', ')']).next()?.parse().ok()
        };
        if line.contains("DNS on") {
            dns = addr("udp/");
        } else if line.contains("HTTP routing on") {
            http = addr("http://");
        } else if line.contains("admin on") {
            admin = addr("http://");
        }
        if dns.is_some() && http.is_some() && admin.is_some() {
            break;
        }
    }
    RouterProc {
        child,
        dns: dns.expect("router printed its DNS address"),
        http: http.expect("router printed its HTTP address"),
        admin: admin.expect("router printed its admin address"),
    }
}

/// What `dig` printed: status, header flags and answer records.
#[derive(Debug)]
struct Dig {
    status: String,
    flags: String,
    answers: Vec<String>,
    authority: Vec<String>,
    subnet: Option<String>,
}

fn dig(server: SocketAddr, args: &[&str]) -> Dig {
    let out = Command::new("dig")
        .args([
            "+norec",
            "+time=2",
            "+tries=1",
            "-p",
            &server.port().to_string(),
        ])
        .arg(format!("@{}", server.ip()))
        .args(args)
        .output()
        .expect("dig runs (apt install bind9-dnsutils)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut d = Dig {
        status: String::new(),
        flags: String::new(),
        answers: vec![],
        authority: vec![],
        subnet: None,
    };
    let mut section = "";
    for line in text.lines() {
        if let Some(s) = line.split("status: ").nth(1) {
            d.status = s.split(',').next().unwrap_or("").to_string();
        } else if let Some(f) = line.strip_prefix(";; flags: ") {
            d.flags = f.split(';').next().unwrap_or("").to_string();
        } else if let Some(s) = line.strip_prefix("; CLIENT-SUBNET: ") {
            d.subnet = Some(s.trim().to_string());
        } else if line.starts_with(";; ANSWER SECTION") {
            section = "answer";
        } else if line.starts_with(";; AUTHORITY SECTION") {
            section = "authority";
        } else if line.starts_with(";;") || line.is_empty() {
            if !line.is_empty() {
                section = "";
            }
        } else if !line.starts_with(';') {
            let rec = line.split_whitespace().collect::<Vec<_>>().join(" ");
            match section {
                "answer" => d.answers.push(rec),
                "authority" => d.authority.push(rec),
                _ => {}
            }
        }
    }
    assert!(!d.status.is_empty(), "dig got no answer: {text}");
    d
}

/// The A records' addresses of an answer.
fn addresses(d: &Dig) -> Vec<String> {
    let mut v: Vec<String> = d
        .answers
        .iter()
        .filter(|r| r.contains(" IN A ") || r.contains(" IN AAAA "))
        .map(|r| r.rsplit(' ').next().unwrap_or("").to_string())
        .collect();
    v.sort();
    v
}

/// A cache bound on a region address (any port).
fn region_cache(ip: &str, origin: SocketAddr, extra: &[&str]) -> Proc {
    let listen = format!("{ip}:0");
    let admin = format!("{ip}:0");
    let up = format!("http://{origin}");
    let mut args = vec![
        "cache",
        "--listen",
        &listen,
        "--upstream",
        &up,
        "--admin",
        &admin,
        "--admin-token",
        TOKEN,
        "--threads",
        "1",
    ];
    args.extend_from_slice(extra);
    spawn(&args)
}

fn cache_entry(c: &Proc) -> String {
    format!(
        "{{ address = \"{}\", admin = \"{}\" }}",
        c.addr,
        c.admin.expect("admin")
    )
}

fn base_config(origin: SocketAddr, paris: &[&Proc], lyon: &[&Proc], admission: &str) -> String {
    let list = |cs: &[&Proc]| {
        cs.iter()
            .map(|c| cache_entry(c))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        r#"
[dns]
zone = "cdn.example"
hostmaster = "hostmaster.cdn.example"
ns = [{{ name = "ns1.cdn.example", address = "127.0.0.1" }}]
answers = 8

[health]
interval_ms = 100
timeout_ms = 300

[[coverage]]
cidr = "127.1.0.0/16"
region = "paris"
[[coverage]]
cidr = "127.2.0.0/16"
region = "lyon"

[[regions]]
name = "paris"
lat = 48.85
lon = 2.35
[[regions]]
name = "lyon"
lat = 45.76
lon = 4.83
[[regions]]
name = "lille"
lat = 50.63
lon = 3.06

[[coverage]]
cidr = "127.3.0.0/16"
region = "lille"

[[services]]
name = "demo"
hostname = "video.demo.example"
origin = "http://{origin}"
admission = {admission}
[[services.regions]]
region = "paris"
caches = [{}]
[[services.regions]]
region = "lyon"
caches = [{}]
"#,
        list(paris),
        list(lyon)
    )
}

async fn route(router: &RouterProc, from: &str, host: &str, path: &str) -> ClientResponse {
    // The router sees the client's source address: bind one per region.
    let local: std::net::IpAddr = from.parse().expect("ip");
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind(SocketAddr::new(local, 0))
        .expect("bind source address");
    let mut s = sock.connect(router.http).await.expect("connect router");
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .expect("router answers")
        .expect("read");
    let buf = bytes::Bytes::from(buf);
    let (head, _) = vcdn_http::response::parse_response(&buf, &Default::default())
        .expect("valid response")
        .expect("complete head");
    ClientResponse {
        head,
        body: Default::default(),
    }
}

fn location(r: &ClientResponse) -> String {
    r.header("location").unwrap_or("").to_string()
}

/// Follows a `Location: http://host:port/path` with a plain GET.
async fn follow(loc: &str) -> ClientResponse {
    let rest = loc.strip_prefix("http://").expect("http location");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr: SocketAddr = authority.parse().expect("address in location");
    client::request(addr, "GET", path, &[], b"", Duration::from_secs(10))
        .await
        .expect("follow")
}

#[tokio::test]
async fn dns_answers_by_region_zone_data_and_client_subnet() {
    let origin = origin();
    let p1 = region_cache("127.10.0.1", origin.addr, &[]);
    let p2 = region_cache("127.10.0.2", origin.addr, &[]);
    let l1 = region_cache("127.11.0.1", origin.addr, &[]);
    let dir = tempdir("router-dns");
    let r = start_router(
        &dir,
        &base_config(origin.addr, &[&p1, &p2], &[&l1], "{ filter = \"none\" }"),
    );

    // Users in Paris get Paris's caches, users in Lyon Lyon's.
    let paris = dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"]);
    assert_eq!(paris.status, "NOERROR");
    assert!(paris.flags.contains("aa"), "authoritative: {paris:?}");
    assert_eq!(addresses(&paris), vec!["127.10.0.1", "127.10.0.2"]);
    assert!(paris.answers[0].contains(" 20 IN A "), "TTL 20: {paris:?}");
    let lyon = dig(r.dns, &["-b", "127.2.0.5", "video.demo.example", "A"]);
    assert_eq!(addresses(&lyon), vec!["127.11.0.1"]);
    // The same over TCP.
    let tcp = dig(
        r.dns,
        &["+tcp", "-b", "127.2.0.5", "VIDEO.Demo.Example", "A"],
    );
    assert_eq!(addresses(&tcp), vec!["127.11.0.1"]);

    // A resolver in Paris asking for a Lyon client: ECS wins, the scope
    // echoed is the coverage zone's /16.
    let ecs = dig(
        r.dns,
        &[
            "-b",
            "127.1.0.5",
            "+subnet=127.2.3.0/24",
            "video.demo.example",
            "A",
        ],
    );
    assert_eq!(addresses(&ecs), vec!["127.11.0.1"]);
    assert_eq!(ecs.subnet.as_deref(), Some("127.2.3.0/24/16"));
    // Lille has no caches: the nearest region with some (Paris, 204 km,
    // rather than Lyon, 560 km).
    let lille = dig(r.dns, &["-b", "127.3.0.5", "video.demo.example", "A"]);
    assert_eq!(addresses(&lille), vec!["127.10.0.1", "127.10.0.2"]);

    // Zone data and negative answers.
    let soa = dig(r.dns, &["cdn.example", "SOA"]);
    assert!(
        soa.answers[0].contains("SOA ns1.cdn.example. hostmaster.cdn.example."),
        "{soa:?}"
    );
    let ns = dig(r.dns, &["cdn.example", "NS"]);
    assert_eq!(ns.answers, vec!["cdn.example. 3600 IN NS ns1.cdn.example."]);
    let glue = dig(r.dns, &["ns1.cdn.example", "A"]);
    assert_eq!(addresses(&glue), vec!["127.0.0.1"]);
    let nx = dig(r.dns, &["nothing.cdn.example", "A"]);
    assert_eq!(nx.status, "NXDOMAIN");
    assert!(
        nx.authority[0].contains(" SOA "),
        "negative answer carries the SOA: {nx:?}"
    );
    let nodata = dig(r.dns, &["video.demo.example", "AAAA"]);
    assert_eq!(
        (nodata.status.as_str(), nodata.answers.len()),
        ("NOERROR", 0)
    );
    assert!(nodata.authority[0].contains(" SOA "));
    let mx = dig(r.dns, &["video.demo.example", "MX"]);
    assert_eq!((mx.status.as_str(), mx.answers.len()), ("NOERROR", 0));
    let refused = dig(r.dns, &["www.example.org", "A"]);
    assert_eq!(refused.status, "REFUSED");
    let chaos = dig(r.dns, &["-c", "CH", "version.bind", "TXT"]);
    assert_eq!(chaos.status, "REFUSED");
    let badvers = dig(r.dns, &["+edns=1", "+noednsneg", "video.demo.example", "A"]);
    assert_eq!(badvers.status, "BADVERS");
}

#[tokio::test]
async fn large_answers_are_truncated_and_complete_over_tcp() {
    let origin = origin();
    let real = region_cache("127.10.0.1", origin.addr, &[]);
    // 60 cache addresses whose health is the real cache's: an answer of
    // 60 A records (about 1 KB) does not fit 512 bytes.
    let many: Vec<String> = (1..=60)
        .map(|i| {
            format!(
                "{{ address = \"127.12.0.{i}:80\", admin = \"{}\" }}",
                real.admin.expect("admin")
            )
        })
        .collect();
    let config = format!(
        r#"
[dns]
answers = 60
[[coverage]]
cidr = "127.1.0.0/16"
region = "paris"
[[services]]
name = "big"
hostname = "big.example"
origin = "http://{}"
[[services.regions]]
region = "paris"
caches = [{}]
"#,
        origin.addr,
        many.join(", ")
    );
    let dir = tempdir("router-tc");
    let r = start_router(&dir, &config);
    let udp = dig(
        r.dns,
        &[
            "+ignore",
            "+bufsize=512",
            "-b",
            "127.1.0.5",
            "big.example",
            "A",
        ],
    );
    assert!(udp.flags.contains("tc"), "truncated: {udp:?}");
    assert!(udp.answers.is_empty());
    // dig retries over TCP by itself without +ignore.
    let full = dig(
        r.dns,
        &["+bufsize=512", "-b", "127.1.0.5", "big.example", "A"],
    );
    assert_eq!(addresses(&full).len(), 60);
    // With a 1232-byte EDNS buffer the whole answer fits in UDP.
    let edns = dig(
        r.dns,
        &[
            "+ignore",
            "+bufsize=1232",
            "-b",
            "127.1.0.5",
            "big.example",
            "A",
        ],
    );
    assert!(!edns.flags.contains("tc"));
    assert_eq!(edns.answers.len(), 60);
}

#[tokio::test]
async fn malformed_packets_do_not_hurt_the_server() {
    let origin = origin();
    let c = region_cache("127.10.0.1", origin.addr, &[]);
    let dir = tempdir("router-fuzz");
    let r = start_router(
        &dir,
        &base_config(origin.addr, &[&c], &[&c], "{ filter = \"none\" }"),
    );
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    sock.set_nonblocking(true).expect("nonblocking");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut answered_formerr = 0;
    for i in 0..3000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 300) as usize;
        let mut p: Vec<u8> = (0..len).map(|k| (x >> (k % 57)) as u8 ^ k as u8).collect();
        if len >= 12 && i % 2 == 0 {
            p[2] &= 0x7F; // a query, not a response
            p[3] = 0;
            p[4] = 0;
            p[5] = 1;
        }
        sock.send_to(&p, r.dns).expect("send");
        // Drain answers as we go (the socket buffer is finite).
        let mut buf = [0u8; 2048];
        while let Ok(n) = sock.recv(&mut buf) {
            if n >= 4 && buf[3] & 0x0F == 1 {
                answered_formerr += 1;
            }
            if i % 100 != 0 {
                break;
            }
        }
    }
    assert!(
        answered_formerr > 0,
        "malformed queries are answered FORMERR"
    );
    // Still answering, correctly.
    let ok = dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"]);
    assert_eq!(addresses(&ok), vec!["127.10.0.1"]);
    // Garbage over TCP: the connection is closed, the server lives.
    let mut s = std::net::TcpStream::connect(r.dns).expect("tcp");
    use std::io::Write;
    let _ = s.write_all(&[0, 5, 1, 2, 3, 4, 5, 0xff, 0xff]);
    drop(s);
    let ok = dig(
        r.dns,
        &["+tcp", "-b", "127.1.0.5", "video.demo.example", "A"],
    );
    assert_eq!(addresses(&ok), vec!["127.10.0.1"]);
}

/// A DNS query for `name` and `qtype`, as bytes on the wire.
fn raw_query(name: &str, qtype: u16) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

/// The rcode of `query` asked over TCP from `from`.
fn rcode_over_tcp(server: SocketAddr, from: &str, query: &[u8]) -> std::io::Result<u8> {
    use std::io::{Read, Write};
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::new(from.parse().unwrap(), 0).into())?;
    s.connect_timeout(&server.into(), Duration::from_secs(2))?;
    let mut s: std::net::TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut framed = (query.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(query);
    s.write_all(&framed)?;
    let mut head = [0u8; 6];
    s.read_exact(&mut head)?;
    Ok(head[5] & 0x0F)
}

#[tokio::test]
async fn zone_transfers_are_refused_and_idle_tcp_clients_cannot_lock_others_out() {
    let origin = origin();
    let p1 = region_cache("127.10.0.1", origin.addr, &[]);
    let dir = tempdir("router-tcp");
    let r = start_router(
        &dir,
        &base_config(origin.addr, &[&p1], &[], "{ filter = \"none\" }"),
    );
    // AXFR and IXFR: REFUSED (not NOERROR with nothing in it), over TCP and
    // UDP; other meta-types (MAILB): NOTIMP.
    let udp = std::net::UdpSocket::bind("127.1.0.5:0").expect("udp");
    udp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    for (qtype, want) in [(252u16, 5u8), (251, 5), (253, 4)] {
        for name in ["cdn.example", "video.demo.example"] {
            let q = raw_query(name, qtype);
            let tcp = rcode_over_tcp(r.dns, "127.1.0.5", &q).expect("TCP answer");
            assert_eq!(tcp, want, "qtype {qtype} for {name} over TCP");
            udp.send_to(&q, r.dns).expect("send");
            let mut buf = [0u8; 1500];
            let n = udp.recv(&mut buf).expect("UDP answer");
            assert!(n >= 12);
            assert_eq!(buf[3] & 0x0F, want, "qtype {qtype} for {name} over UDP");
        }
    }

    // 1,100 idle connections from 100 addresses (more than the router's
    // 1,024 slots), and 40 more from one address (more than its share).
    let mut idle = Vec::new();
    for i in 0..1140u32 {
        let from = if i < 1100 {
            format!("127.5.{}.{}", i % 100, 1 + i / 100)
        } else {
            "127.6.0.1".to_string()
        };
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        s.bind(&SocketAddr::new(from.parse().unwrap(), 0).into())
            .expect("bind");
        s.connect(&r.dns.into()).expect("connect");
        idle.push(s);
    }
    // Someone else still gets answers over TCP (within the 2 s read
    // timeout), and so does the client that opened too many.
    for from in ["127.1.0.5", "127.1.0.6", "127.6.0.1"] {
        let code = rcode_over_tcp(r.dns, from, &raw_query("video.demo.example", 1));
        assert_eq!(code.ok(), Some(0), "TCP query from {from}");
    }
    let ok = dig(
        r.dns,
        &["+tcp", "-b", "127.1.0.5", "video.demo.example", "A"],
    );
    assert_eq!(addresses(&ok), vec!["127.10.0.1"]);
    drop(idle);
}

#[tokio::test]
async fn a_dead_cache_leaves_answers_within_a_second_and_returns() {
    let origin = origin();
    let p1 = region_cache("127.10.0.1", origin.addr, &[]);
    let p2 = region_cache("127.10.0.2", origin.addr, &[]);
    let (p2_addr, p2_admin) = (p2.addr, p2.admin.expect("admin"));
    let dir = tempdir("router-health");
    let r = start_router(
        &dir,
        &base_config(origin.addr, &[&p1, &p2], &[&p1], "{ filter = \"none\" }"),
    );
    assert_eq!(
        addresses(&dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"])).len(),
        2
    );

    p2.kill();
    let killed = Instant::now();
    loop {
        let a = addresses(&dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"]));
        if a == vec!["127.10.0.1"] {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "dead cache still answered after 1 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone_after = killed.elapsed();
    // HTTP routing avoids it too: every path goes to the live cache.
    for i in 0..20 {
        let resp = route(
            &r,
            "127.1.0.9",
            "video.demo.example",
            &format!("/size/{}", 100 + i),
        )
        .await;
        assert!(
            location(&resp).starts_with(&format!("http://{}/", p1.addr)),
            "{}",
            location(&resp)
        );
    }
    // Back on the same addresses: back in the answers.
    let _p2 = spawn(&[
        "cache",
        "--listen",
        &p2_addr.to_string(),
        "--upstream",
        &format!("http://{}", origin.addr),
        "--admin",
        &p2_admin.to_string(),
        "--admin-token",
        TOKEN,
        "--threads",
        "1",
    ]);
    assert!(
        eventually(5, || async {
            addresses(&dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"])).len() == 2
        })
        .await,
        "restarted cache did not return"
    );
    eprintln!("dead cache left the answers after {gone_after:?}");
}

/// Caches whose admin APIs are HTTPS (`admin_https = true`): the health
/// checks trust the CA of `--cache-admin-ca-file`, and a cache whose
/// certificate another CA issued is out of the answers.
#[tokio::test]
async fn health_checks_reach_https_admin_apis_and_refuse_a_certificate_of_another_ca() {
    let origin = origin();
    let dir = tempdir("router-admin-https");
    let ca = vcdn_http::tls::Ca::create("caches' admin CA", 1).unwrap();
    let cache = |ip: &str| {
        let made = ca.issue(&[ip.to_string()], 1).unwrap();
        let (cp, kp) = (dir.join(format!("{ip}.crt")), dir.join(format!("{ip}.key")));
        std::fs::write(&cp, &made.cert_pem).unwrap();
        std::fs::write(&kp, &made.key_pem).unwrap();
        region_cache(
            ip,
            origin.addr,
            &[
                "--admin-tls-cert",
                cp.to_str().unwrap(),
                "--admin-tls-key",
                kp.to_str().unwrap(),
            ],
        )
    };
    let (p1, p2) = (cache("127.10.0.1"), cache("127.10.0.2"));
    let mut config = base_config(origin.addr, &[&p1, &p2], &[&p1], "{ filter = \"none\" }");
    for c in [&p1, &p2] {
        let admin = c.admin.expect("admin");
        config = config.replace(
            &format!("admin = \"{admin}\" }}"),
            &format!("admin = \"{admin}\", admin_https = true }}"),
        );
    }
    assert!(config.contains("admin_https = true"), "{config}");
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca.cert_pem).unwrap();
    let r = start_router_with(
        &dir,
        &config,
        &["--cache-admin-ca-file", ca_file.to_str().unwrap()],
    );
    let answers = || addresses(&dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"]));
    // Caches start as healthy: still both after several polls (100 ms
    // apart; a refused poll takes a cache out at once).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(answers().len(), 2, "{:?}", answers());
    drop(r);
    // Trusting another CA: neither cache passes its health check.
    let other = vcdn_http::tls::Ca::create("someone else", 1).unwrap();
    let other_file = dir.join("other.pem");
    std::fs::write(&other_file, &other.cert_pem).unwrap();
    let r = start_router_with(
        &dir,
        &config,
        &["--cache-admin-ca-file", other_file.to_str().unwrap()],
    );
    let cached = || {
        addresses(&dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"]))
            .into_iter()
            .filter(|a| a.starts_with("127.10."))
            .count()
    };
    assert!(
        eventually(5, || async { cached() == 0 }).await,
        "caches with untrusted admin certificates still answered"
    );
}

#[tokio::test]
async fn http_routing_follows_region_hash_and_filter() {
    let origin = origin();
    let p1 = region_cache("127.10.0.1", origin.addr, &[]);
    let p2 = region_cache("127.10.0.2", origin.addr, &[]);
    let l1 = region_cache("127.11.0.1", origin.addr, &[]);
    let dir = tempdir("router-http");
    let r = start_router(
        &dir,
        &base_config(
            origin.addr,
            &[&p1, &p2],
            &[&l1],
            "{ filter = \"lru\", size = 1000 }",
        ),
    );

    // First request for a chunk: unknown to the filter → straight to the
    // origin, path and query kept.
    let first = route(
        &r,
        "127.1.0.9",
        "video.demo.example",
        "/size/2000?max_age=60",
    )
    .await;
    assert_eq!(first.status(), 302);
    assert_eq!(
        location(&first),
        format!("http://{}/size/2000?max_age=60", origin.addr)
    );
    assert_eq!(first.header("x-vcdn-route"), Some("origin-filter"));
    // An absolute-form target names the service, whatever Host says
    // (RFC 9112 §3.2.2), as the cache reads it too.
    let absolute = route(
        &r,
        "127.1.0.9",
        "other.example",
        "http://video.demo.example/size/2001",
    )
    .await;
    assert_eq!(absolute.status(), 302);
    assert_eq!(
        location(&absolute),
        format!("http://{}/size/2001", origin.addr)
    );
    // Second: popular now → a Paris cache, always the same one.
    let second = route(
        &r,
        "127.1.0.9",
        "video.demo.example",
        "/size/2000?max_age=60",
    )
    .await;
    let loc = location(&second);
    assert!(
        loc == format!("http://{}/size/2000?max_age=60", p1.addr)
            || loc == format!("http://{}/size/2000?max_age=60", p2.addr),
        "{loc}"
    );
    for _ in 0..5 {
        let again = route(
            &r,
            "127.1.0.77",
            "video.demo.example",
            "/size/2000?max_age=60",
        )
        .await;
        assert_eq!(location(&again), loc);
    }
    let got = follow(&loc).await;
    assert_eq!(got.status(), 200);
    assert_eq!(got.body.len(), 2000);
    assert_eq!(x_cache(&got), "MISS");
    assert_eq!(x_cache(&follow(&loc).await), "HIT");
    // Paths spread over both Paris caches.
    let mut used = std::collections::HashSet::new();
    for i in 0..40 {
        let path = format!("/size/{}", 3000 + i);
        route(&r, "127.1.0.9", "video.demo.example", &path).await;
        used.insert(
            location(&route(&r, "127.1.0.9", "video.demo.example", &path).await)
                .split('/')
                .nth(2)
                .unwrap_or("")
                .to_string(),
        );
    }
    assert_eq!(used.len(), 2, "both Paris caches used: {used:?}");
    // Lyon users go to Lyon's cache.
    route(
        &r,
        "127.2.0.9",
        "video.demo.example",
        "/size/2000?max_age=60",
    )
    .await;
    let lyon = route(
        &r,
        "127.2.0.9",
        "video.demo.example",
        "/size/2000?max_age=60",
    )
    .await;
    assert!(
        location(&lyon).starts_with(&format!("http://{}/", l1.addr)),
        "{}",
        location(&lyon)
    );

    // Mistakes get problem documents.
    let unknown = route(&r, "127.1.0.9", "nope.example", "/x").await;
    assert_eq!(unknown.status(), 404);
    let post = raw(
        r.http,
        b"POST /x HTTP/1.1\r\nHost: video.demo.example\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        Duration::from_secs(5),
    );
    assert_eq!(status_of(&post), 405, "{post}");

    // Decisions are counted.
    let metrics = client::request(r.admin, "GET", "/metrics", &[], b"", Duration::from_secs(5))
        .await
        .expect("metrics")
        .text();
    assert!(metrics.contains("vcdn_router_http_routed_total{target=\"origin\",reason=\"filter\"}"));
    assert!(metrics.contains("decision=\"edge\"}"), "{metrics}");

    // No healthy cache anywhere: everything goes to the origin.
    drop((p1, p2, l1));
    assert!(
        eventually(3, || async {
            let x = route(&r, "127.1.0.9", "video.demo.example", "/size/2000").await;
            x.header("x-vcdn-route") == Some("origin-no-cache")
        })
        .await
    );
    let dns = dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"]);
    assert_eq!(
        addresses(&dns),
        vec!["127.0.0.1"],
        "origin's address when no cache lives"
    );
}

#[tokio::test]
async fn services_change_at_run_time_through_the_admin_api() {
    let origin = origin();
    let c = region_cache("127.10.0.1", origin.addr, &[]);
    let dir = tempdir("router-admin");
    let r = start_router(
        &dir,
        &base_config(origin.addr, &[&c], &[&c], "{ filter = \"none\" }"),
    );
    let auth = format!("Bearer {RTOKEN}");
    let call = |method: &'static str, path: String, body: String| {
        let auth = auth.clone();
        let admin = r.admin;
        async move {
            client::request(
                admin,
                method,
                &path,
                &[("Authorization", &auth)],
                body.as_bytes(),
                Duration::from_secs(5),
            )
            .await
            .expect("admin call")
        }
    };
    assert_eq!(dig(r.dns, &["live.example", "A"]).status, "REFUSED");
    // The scheme is case-insensitive (RFC 9110 §11.1).
    let lower = format!("bearer {RTOKEN}");
    let listed = client::request(
        r.admin,
        "GET",
        "/services",
        &[("Authorization", &lower)],
        b"",
        Duration::from_secs(5),
    )
    .await
    .expect("admin call");
    assert_eq!(listed.status(), 200, "{}", listed.text());
    let svc = format!(
        r#"{{"hostname": "live.example", "origin": "http://{}",
            "regions": [{{"region": "paris", "caches": [{{"address": "{}", "admin": "{}"}}]}}]}}"#,
        origin.addr,
        c.addr,
        c.admin.expect("admin")
    );
    let created = call("PUT", "/services/live".into(), svc.clone()).await;
    assert_eq!(created.status(), 201, "{}", created.text());
    assert_eq!(
        call("PUT", "/services/live".into(), svc).await.status(),
        200
    );
    let a = dig(r.dns, &["-b", "127.1.0.5", "live.example", "A"]);
    assert_eq!(addresses(&a), vec!["127.10.0.1"]);
    let list = call("GET", "/services".into(), String::new()).await.text();
    assert!(
        list.contains("\"live\"") && list.contains("\"demo\""),
        "{list}"
    );

    // Bad input: problem documents that say what is wrong.
    let bad = call(
        "PUT",
        "/services/x".into(),
        "{\"hostname\": \"a b\"}".into(),
    )
    .await;
    assert_eq!(bad.status(), 422);
    assert_eq!(bad.header("content-type"), Some("application/problem+json"));
    let clash = call(
        "PUT",
        "/services/other".into(),
        format!(
            r#"{{"hostname": "live.example", "origin": "http://{}", "regions": []}}"#,
            origin.addr
        ),
    )
    .await;
    assert_eq!(clash.status(), 422);
    assert!(
        clash.text().contains("used by two services"),
        "{}",
        clash.text()
    );
    let noauth = client::request(
        r.admin,
        "GET",
        "/services",
        &[],
        b"",
        Duration::from_secs(5),
    )
    .await
    .expect("call");
    assert_eq!(noauth.status(), 401);

    assert_eq!(
        call("DELETE", "/services/live".into(), String::new())
            .await
            .status(),
        204
    );
    assert_eq!(
        call("DELETE", "/services/live".into(), String::new())
            .await
            .status(),
        404
    );
    assert_eq!(dig(r.dns, &["live.example", "A"]).status, "REFUSED");
}

#[tokio::test]
async fn a_cache_reached_directly_applies_the_filter_itself() {
    let origin = origin();
    let c = cache(origin.addr, &["--admission-filter", "100"]);
    let first = get(c.addr, "/size/700?max_age=60").await;
    assert_eq!(first.status(), 302);
    assert_eq!(x_cache(&first), "BYPASS");
    assert_eq!(
        location(&first),
        format!("http://{}/size/700?max_age=60", origin.addr)
    );
    assert_eq!(
        origin_count(origin.addr, "/size/700").await,
        0,
        "bypassed, not proxied"
    );
    assert_eq!(x_cache(&get(c.addr, "/size/700?max_age=60").await), "MISS");
    assert_eq!(x_cache(&get(c.addr, "/size/700?max_age=60").await), "HIT");
    let stats = admin(&c, "GET", "/stats", "").await.text();
    assert!(stats.contains("\"bypass\":1"), "{stats}");
}

/// Zipf(α) ranks 1..=n from a seeded generator (inverse CDF).
fn zipf(alpha: f64, n: usize, len: usize, mut seed: u64) -> Vec<usize> {
    let mut cdf = Vec::with_capacity(n);
    let mut acc = 0.0;
    for i in 1..=n {
        acc += 1.0 / (i as f64).powf(alpha);
        cdf.push(acc);
    }
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let u = (seed >> 11) as f64 / (1u64 << 53) as f64 * acc;
            cdf.partition_point(|&c| c < u) + 1
        })
        .collect()
}

/// Sends the stream through the router; requests redirected to a cache are
/// fetched from it. Returns the global hit rate (edge hits / requests).
async fn global_hit_rate(r: &RouterProc, host: &str, stream: &[usize]) -> f64 {
    let mut hits = 0;
    for &rank in stream {
        let resp = route(
            r,
            "127.1.0.9",
            host,
            &format!("/size/{}?max_age=3600&etag=1", 600 + rank),
        )
        .await;
        if resp.header("x-vcdn-route") == Some("edge")
            && x_cache(&follow(&location(&resp)).await) == "HIT"
        {
            hits += 1;
        }
    }
    hits as f64 / stream.len() as f64
}

#[tokio::test]
async fn the_lru_filter_raises_the_edge_hit_rate_of_a_zipf_stream() {
    // The paper's claim (Table III), through real caches: with Zipf(0.8)
    // popularity and an edge holding ~1-2 % of the catalogue, an LRU filter
    // sized by the guideline (11) gives a higher global hit rate than
    // admitting everything.
    let (n, alpha, len) = (2000, 0.8, 8000);
    let origin = origin();
    let plain = region_cache("127.10.0.1", origin.addr, &["--memory", "64K"]);
    let filtered = region_cache("127.10.0.2", origin.addr, &["--memory", "64K"]);
    let dir = tempdir("router-zipf");
    let config = base_config(origin.addr, &[&plain], &[&plain], "{ filter = \"none\" }");
    let r = start_router(&dir, &config);
    let stream = zipf(alpha, n, len, 0x5eed);
    let without = global_hit_rate(&r, "video.demo.example", &stream).await;

    // The edge's capacity in objects, as the cache reports it.
    let health = get(plain.admin.expect("admin"), "/healthz").await;
    let v: serde_json::Value = serde_json::from_slice(&health.body).expect("json");
    let c2 = v["memory_objects"].as_u64().expect("objects") as f64;
    let d2 = c2 / n as f64;
    let d1 = 1.938 * d2.powf(0.342 * alpha + 0.422); // guideline (11), Table II
    let size = (d1 * n as f64).round() as usize;
    let svc = format!(
        r#"{{"hostname": "filtered.example", "origin": "http://{}",
            "admission": {{"filter": "lru", "size": {size}}},
            "regions": [{{"region": "paris", "caches": [{{"address": "{}", "admin": "{}"}}]}}]}}"#,
        origin.addr,
        filtered.addr,
        filtered.admin.expect("admin")
    );
    let put = client::request(
        r.admin,
        "PUT",
        "/services/filtered",
        &[("Authorization", &format!("Bearer {RTOKEN}"))],
        svc.as_bytes(),
        Duration::from_secs(5),
    )
    .await
    .expect("put");
    assert_eq!(put.status(), 201, "{}", put.text());
    let with = global_hit_rate(&r, "filtered.example", &stream).await;
    eprintln!(
        "Zipf({alpha}) N={n} C2={c2} (δ2={d2:.4}) filter C1={size} (δ1={d1:.4}): \
         global hit rate {without:.3} without filter, {with:.3} with"
    );
    assert!(
        with > without * 1.05,
        "filter {with:.3} vs none {without:.3}"
    );
}

/// Writes a minimal MaxMind DB (format 2.0, IPv4 tree, 24-bit records) whose
/// networks carry GeoIP2 City `location.latitude/longitude`, as the real
/// GeoLite2-City.mmdb does.
fn write_mmdb(path: &std::path::Path, networks: &[(&str, f64, f64)]) {
    #[derive(Clone, Copy)]
    enum Rec {
        Empty,
        Node(usize),
        Data(usize),
    }
    let mut nodes: Vec<[Rec; 2]> = vec![[Rec::Empty, Rec::Empty]];
    let mut data = Vec::new();
    for &(cidr, lat, lon) in networks {
        let (ip, len) = cidr.split_once('/').expect("cidr");
        let ip: std::net::Ipv4Addr = ip.parse().expect("ipv4");
        let len: u32 = len.parse().expect("len");
        let offset = data.len();
        data.push(0xE1); // map, 1 entry
        data.push(0x48);
        data.extend_from_slice(b"location");
        data.push(0xE2); // map, 2 entries
        for (key, v) in [("latitude", lat), ("longitude", lon)] {
            data.push(0x40 | key.len() as u8);
            data.extend_from_slice(key.as_bytes());
            data.push(0x68); // double
            data.extend_from_slice(&v.to_be_bytes());
        }
        let bits = u32::from(ip);
        let mut node = 0;
        for depth in 0..len {
            let bit = ((bits >> (31 - depth)) & 1) as usize;
            if depth == len - 1 {
                nodes[node][bit] = Rec::Data(offset);
            } else {
                node = match nodes[node][bit] {
                    Rec::Node(n) => n,
                    _ => {
                        nodes.push([Rec::Empty, Rec::Empty]);
                        nodes[node][bit] = Rec::Node(nodes.len() - 1);
                        nodes.len() - 1
                    }
                };
            }
        }
    }
    let count = nodes.len();
    let mut out = Vec::new();
    for n in &nodes {
        for r in n {
            let v = match *r {
                Rec::Empty => count,
                Rec::Node(i) => i,
                Rec::Data(off) => count + 16 + off,
            };
            out.extend_from_slice(&(v as u32).to_be_bytes()[1..]);
        }
    }
    out.extend_from_slice(&[0u8; 16]);
    out.extend_from_slice(&data);
    out.extend_from_slice(b"\xAB\xCD\xEFMaxMind.com");
    out.push(0xE9); // map, 9 entries
    let key = |o: &mut Vec<u8>, k: &str| {
        o.push(0x40 | k.len() as u8);
        o.extend_from_slice(k.as_bytes());
    };
    let u16v = |o: &mut Vec<u8>, v: u16| {
        o.push(0xA2);
        o.extend_from_slice(&v.to_be_bytes());
    };
    key(&mut out, "node_count");
    out.push(0xC4);
    out.extend_from_slice(&(count as u32).to_be_bytes());
    key(&mut out, "record_size");
    u16v(&mut out, 24);
    key(&mut out, "ip_version");
    u16v(&mut out, 4);
    key(&mut out, "database_type");
    key(&mut out, "Test-City");
    key(&mut out, "languages");
    out.extend_from_slice(&[0x00, 0x04]); // array, 0 entries
    key(&mut out, "binary_format_major_version");
    u16v(&mut out, 2);
    key(&mut out, "binary_format_minor_version");
    u16v(&mut out, 0);
    key(&mut out, "build_epoch");
    out.extend_from_slice(&[0x08, 0x02]); // uint64, 8 bytes
    out.extend_from_slice(&1_700_000_000u64.to_be_bytes());
    key(&mut out, "description");
    out.push(0xE0);
    std::fs::write(path, out).expect("mmdb");
}

#[tokio::test]
async fn clients_outside_coverage_go_to_the_nearest_region_by_geoip() {
    let origin = origin();
    let p1 = region_cache("127.10.0.1", origin.addr, &[]);
    let l1 = region_cache("127.11.0.1", origin.addr, &[]);
    let dir = tempdir("router-geoip");
    let mmdb = dir.join("city.mmdb");
    // 127.5/16 is in Grenoble (nearest: Lyon), 127.6/16 in Rouen (Paris).
    write_mmdb(
        &mmdb,
        &[("127.5.0.0/16", 45.19, 5.72), ("127.6.0.0/16", 49.44, 1.10)],
    );
    let config = format!(
        "geoip = \"{}\"\n{}",
        mmdb.display(),
        base_config(origin.addr, &[&p1], &[&l1], "{ filter = \"none\" }")
    );
    let r = start_router(&dir, &config);
    let grenoble = dig(r.dns, &["-b", "127.5.0.5", "video.demo.example", "A"]);
    assert_eq!(addresses(&grenoble), vec!["127.11.0.1"], "{grenoble:?}");
    let rouen = dig(r.dns, &["-b", "127.6.0.5", "video.demo.example", "A"]);
    assert_eq!(addresses(&rouen), vec!["127.10.0.1"]);
    // The ECS scope is the database network's prefix.
    let ecs = dig(r.dns, &["+subnet=127.5.9.0/24", "video.demo.example", "A"]);
    assert_eq!(ecs.subnet.as_deref(), Some("127.5.9.0/24/16"));
    assert_eq!(addresses(&ecs), vec!["127.11.0.1"]);
    // Coverage zones still win over GeoIP.
    let paris = dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"]);
    assert_eq!(addresses(&paris), vec!["127.10.0.1"]);
}

#[tokio::test]
async fn an_unsized_filter_sizes_itself_from_the_request_stream() {
    let origin = origin();
    let c = region_cache("127.10.0.1", origin.addr, &["--memory", "64K"]);
    let dir = tempdir("router-sizing");
    let config = format!(
        "sizing_interval_ms = 200\n{}",
        base_config(origin.addr, &[&c], &[&c], "{ filter = \"lru\" }")
    );
    let r = start_router(&dir, &config);
    let auth = format!("Bearer {RTOKEN}");
    let filter_capacity = || async {
        let v: serde_json::Value = serde_json::from_slice(
            &client::request(
                r.admin,
                "GET",
                "/caches",
                &[("Authorization", &auth)],
                b"",
                Duration::from_secs(5),
            )
            .await
            .expect("caches")
            .body,
        )
        .expect("json");
        v["caches"][0]["filter_capacity"].as_u64().expect("filter")
    };
    assert_eq!(
        filter_capacity().await,
        100_000,
        "generous until popularity is known"
    );
    // Zipf(0.9) over 2,000 chunks; what reaches the edge fills the cache,
    // so it reports its capacity in objects.
    for &rank in &zipf(0.9, 2000, 6000, 7) {
        let resp = route(
            &r,
            "127.1.0.9",
            "video.demo.example",
            &format!("/size/{}", 600 + rank),
        )
        .await;
        if resp.header("x-vcdn-route") == Some("edge") {
            follow(&location(&resp)).await;
        }
    }
    let resized = eventually(5, || async { filter_capacity().await != 100_000 }).await;
    if !resized {
        let caches = client::request(
            r.admin,
            "GET",
            "/caches",
            &[("Authorization", &auth)],
            b"",
            Duration::from_secs(5),
        )
        .await
        .expect("caches")
        .text();
        let m = client::request(r.admin, "GET", "/metrics", &[], b"", Duration::from_secs(5))
            .await
            .expect("m")
            .text();
        panic!("the filter was not resized: {caches}\n{m}");
    }
    let size = filter_capacity().await;
    let metrics = client::request(r.admin, "GET", "/metrics", &[], b"", Duration::from_secs(5))
        .await
        .expect("metrics")
        .text();
    let alpha: f64 = metrics
        .lines()
        .find(|l| l.starts_with("vcdn_router_popularity_alpha"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("alpha estimate in /metrics");
    eprintln!("estimated alpha {alpha:.3}, filter resized to {size}");
    assert!((0.7..1.1).contains(&alpha), "alpha estimate {alpha}");
    // A few times the edge's ~40 objects, well under the catalogue.
    assert!((40..2000).contains(&size), "filter size {size}");
}

#[tokio::test]
async fn an_overloaded_cache_leaves_the_answers_until_its_load_drops() {
    let origin = origin();
    let busy = region_cache("127.10.0.1", origin.addr, &[]);
    let other = region_cache("127.10.0.2", origin.addr, &[]);
    let dir = tempdir("router-overload");
    // The first cache counts as overloaded at 3 open connections.
    let entry = format!(
        "{{ address = \"{}\", admin = \"{}\", max_connections = 3 }}",
        busy.addr,
        busy.admin.expect("admin")
    );
    let config = base_config(
        origin.addr,
        &[&busy, &other],
        &[&other],
        "{ filter = \"none\" }",
    )
    .replacen(&cache_entry(&busy), &entry, 1);
    let r = start_router(&dir, &config);
    let answer = || addresses(&dig(r.dns, &["-b", "127.1.0.5", "video.demo.example", "A"]));
    assert_eq!(answer(), vec!["127.10.0.1", "127.10.0.2"]);
    let held: Vec<std::net::TcpStream> = (0..3)
        .map(|_| std::net::TcpStream::connect(busy.addr).expect("connect"))
        .collect();
    let loaded = Instant::now();
    assert!(
        eventually(2, || async { answer() == vec!["127.10.0.2"] }).await,
        "overloaded cache still answered"
    );
    assert!(
        loaded.elapsed() < Duration::from_secs(1),
        "took {:?}",
        loaded.elapsed()
    );
    drop(held);
    assert!(
        eventually(3, || async { answer().len() == 2 }).await,
        "cache did not return when its load dropped"
    );
}

fn vcdn(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vcdn"))
        .args(args)
        .output()
        .expect("vcdn runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn name_and_model_commands() {
    let (ok, addr, _) = vcdn(&[
        "name",
        "encode",
        "--prefix",
        "2001:db8:1:2::/64",
        "--video",
        "42",
        "--chunk",
        "7",
        "--quality",
        "3",
        "--duration",
        "4",
    ]);
    assert!(ok);
    let addr = addr.trim();
    let (ok, fields, _) = vcdn(&["name", "decode", addr]);
    assert!(ok);
    for f in [
        "prefix: 2001:db8:1:2::/64",
        "video: 42",
        "chunk: 7",
        "quality: 3",
        "duration: 4.00s",
    ] {
        assert!(fields.contains(f), "{f} missing in {fields}");
    }
    let (ok, _, err) = vcdn(&[
        "name",
        "encode",
        "--prefix",
        "2001:db8::/48",
        "--video",
        "1",
        "--chunk",
        "1",
        "--quality",
        "1",
        "--duration",
        "2",
    ]);
    assert!(!ok && err.contains("/64"), "{err}");
    // The paper's example: α = 0.9, δ2 = 0.01 → δ1* ≈ 0.067.
    let (ok, d1, err) = vcdn(&[
        "model",
        "filter-size",
        "--alpha",
        "0.9",
        "--cache-ratio",
        "0.01",
    ]);
    assert!(ok, "{err}");
    let d1: f64 = d1.trim().parse().expect("a number");
    assert!((d1 - 0.067).abs() < 0.002, "{d1}");
    assert!(err.contains("guideline"), "{err}");
    let (ok, _, err) = vcdn(&[
        "model",
        "filter-size",
        "--alpha",
        "0.9",
        "--cache-ratio",
        "1.5",
    ]);
    assert!(!ok && err.contains("--cache-ratio"), "{err}");
}

/// With the deployment's telemetry keys, a standalone router publishes its
/// routing decisions (counts per service, region and cache, not one
/// datagram per request) to the consumers a tracker names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_with_telemetry_keys_publishes_its_routing_decisions() {
    use std::sync::Arc;
    use vcdn_telemetry::agent::{Agent, AgentConfig};
    use vcdn_telemetry::keys::KeyFile;
    use vcdn_telemetry::message::{Authority, AuthorityKind, Role, Subscription};
    use vcdn_telemetry::record::{self, TOPIC_ROUTER_DECISIONS};

    let origin = origin();
    let p1 = region_cache("127.10.0.1", origin.addr, &[]);
    let l1 = region_cache("127.11.0.1", origin.addr, &[]);
    let dir = tempdir("router-telemetry");
    let full = KeyFile::generate();
    let member = dir.join("telemetry-keys.json");
    full.member_only().save(&member).unwrap();
    let keys = Arc::new(full.keyring().unwrap());
    let port = support::up::free_port();
    let mut t = AgentConfig::loopback("tracker", vec![Role::Tracker]);
    t.discovery_port = port;
    let tracker = Agent::start(t, keys.clone()).await.unwrap();
    tracker.become_authority(
        AuthorityKind::Tracker,
        Authority {
            epoch: 1,
            bootstrap: None,
            cluster_id: None,
            controller: None,
            generation: 0,
        },
    );
    let inbox = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut c = AgentConfig::loopback("watcher", vec![Role::P2pConsumer]);
    c.discovery_port = port;
    c.subscribe = vec![Subscription {
        topic: TOPIC_ROUTER_DECISIONS.into(),
        port: inbox.local_addr().unwrap().port(),
        host: None,
    }];
    let _watcher = Agent::start(c, keys.clone()).await.unwrap();
    let port_s = port.to_string();
    let r = start_router_with(
        &dir,
        &base_config(origin.addr, &[&p1], &[&l1], "{ filter = \"none\" }"),
        &[
            "--telemetry-keys",
            member.to_str().unwrap(),
            "--telemetry-discovery-port",
            &port_s,
            "--telemetry-interval-ms",
            "200",
        ],
    );
    for _ in 0..3 {
        let a = route(&r, "127.1.0.9", "video.demo.example", "/size/10").await;
        assert_eq!(a.status(), 302);
    }
    let mut buf = vec![0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = None;
    while seen.is_none() && Instant::now() < deadline {
        let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_millis(300), inbox.recv_from(&mut buf)).await
        else {
            continue;
        };
        let rec = record::open(&keys, &buf[..n]).expect("sealed with the deployment's key");
        assert_eq!(rec.source, "router");
        assert_eq!(rec.service.as_deref(), Some("demo"));
        let paris = rec.data["regions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["region"] == "paris")
            .cloned()
            .expect("paris in the record");
        if paris["caches"][0]["edge"].as_u64() == Some(3) {
            seen = Some(rec);
        }
    }
    let rec = seen.expect("no router.decisions record with the 3 requests routed to paris");
    assert_eq!(
        rec.data["regions"][1]["caches"][0]["edge"].as_u64(),
        Some(0)
    );
}

/// A router told to be an SRv6 dispatcher on a host where it cannot (here:
/// not root) says why, shows it in /metrics, and routes with DNS and HTTP
/// (and the HTTP-level filter) as without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_cannot_dispatch_with_srv6_says_why_and_routes_over_http() {
    let dir = tempdir("router-srv6-nobody");
    let origin = origin();
    let mut config = base_config(origin.addr, &[], &[], r#"{ filter = "none" }"#);
    config = config.replace(
        "[health]",
        "[srv6]\nsid = \"fd77:0:0:d::1\"\ndevice = \"lo\"\n\n[health]",
    );
    config = config.replace(
        "admission = {",
        "srv6 = { prefix = \"2001:db8:c::\", origin_sid = \"fd77:0:0:4::1\" }\nadmission = {",
    );
    let r = start_router_as(
        &dir,
        &config,
        &[],
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
    );
    let metrics = client::request(r.admin, "GET", "/metrics", &[], b"", Duration::from_secs(5))
        .await
        .expect("metrics")
        .text();
    assert!(
        metrics.contains("vcdn_router_srv6_dispatching 0"),
        "{metrics}"
    );
    // HTTP routing serves on: no cache, so to the origin.
    let resp = route(&r, "127.1.0.1", "video.demo.example", "/a").await;
    assert_eq!(resp.status(), 302);
    assert!(
        location(&resp).contains(&origin.addr.to_string()),
        "{}",
        location(&resp)
    );
}
