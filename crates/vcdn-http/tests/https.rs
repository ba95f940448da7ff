//! The control server and client over TLS: a request by fingerprint and by
//! CA, a wrong fingerprint refused with the one seen, a plain-HTTP client
//! and a silent client cut off by the handshake timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vcdn_http::client::{self, ClientError, Endpoint};
use vcdn_http::serve::{serve, Handler, Response, ServeConfig};
use vcdn_http::tls::{self, Trust};

async fn server(bundle: tls::CertBundle, header_timeout: Duration) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let handler: Handler = Arc::new(|req| {
        Box::pin(async move {
            let path = String::from_utf8_lossy(req.head.path_and_query()).into_owned();
            Response::new(200, "text/plain", format!("{path} {}", req.body.len()))
        })
    });
    let cfg = ServeConfig {
        header_timeout,
        tls: Some(tls::single_cert_config(bundle, &[b"http/1.1"])),
        ..ServeConfig::default()
    };
    tokio::spawn(serve(l, cfg, handler));
    addr
}

fn bundle(m: &tls::MadeCert) -> tls::CertBundle {
    tls::parse_bundle(m.cert_pem.as_bytes(), m.key_pem.as_bytes()).unwrap()
}

#[tokio::test]
async fn https_by_fingerprint_and_by_ca() {
    let made = tls::self_signed(&["localhost".into(), "127.0.0.1".into()], 5).unwrap();
    let b = bundle(&made);
    let fp = tls::parse_fingerprint(&b.info.fingerprint).unwrap();
    let addr = server(b.clone(), Duration::from_secs(5)).await;
    let url = format!("https://{addr}/base");
    let e = Endpoint::new(&url, &Trust::Fingerprint(fp)).await.unwrap();
    assert!(e.is_https());
    let body = vec![b'x'; 100_000];
    let r = e
        .request("POST", "/p?q=1", &[], &body, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        (r.status(), r.text()),
        (200, "/base/p?q=1 100000".to_string())
    );

    // A CA-issued certificate, trusted through the CA, by host name.
    let ca = tls::Ca::create("test CA", 5).unwrap();
    let leaf = ca.issue(&["localhost".into()], 5).unwrap();
    let addr2 = server(bundle(&leaf), Duration::from_secs(5)).await;
    let roots = tls::parse_chain(ca.cert_pem.as_bytes()).unwrap();
    let r = client::request_url(
        &format!("https://localhost:{}", addr2.port()),
        &Trust::Bundle(roots.clone()),
        "GET",
        "/x",
        &[],
        b"",
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(r.text(), "/x 0");
    // The same server by a name its certificate does not carry.
    let e = client::request_url(
        &format!("https://127.0.0.1:{}", addr2.port()),
        &Trust::Bundle(roots),
        "GET",
        "/x",
        &[],
        b"",
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ClientError::Tls(..)), "{e}");
    assert!(e.to_string().contains("not trusted"), "{e}");
}

#[tokio::test]
async fn a_wrong_fingerprint_is_refused_with_the_one_seen() {
    let made = tls::self_signed(&["127.0.0.1".into()], 5).unwrap();
    let b = bundle(&made);
    let seen = b.info.fingerprint.clone();
    let addr = server(b, Duration::from_secs(5)).await;
    let other = tls::parse_fingerprint(&"ab".repeat(32)).unwrap();
    let e = client::request_url(
        &format!("https://{addr}"),
        &Trust::Fingerprint(other),
        "GET",
        "/",
        &[],
        b"",
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    match &e {
        ClientError::FingerprintMismatch { seen: s, .. } => assert_eq!(*s, seen),
        e => panic!("{e}"),
    }
    assert!(e.to_string().contains(&seen), "{e}");
}

#[tokio::test]
async fn plain_and_silent_clients_get_nothing_and_are_cut_off() {
    let made = tls::self_signed(&["127.0.0.1".into()], 5).unwrap();
    let addr = server(bundle(&made), Duration::from_millis(300)).await;
    // Plain HTTP to a TLS port: no HTTP answer.
    let r = client::request(addr, "GET", "/", &[], b"", Duration::from_secs(5)).await;
    assert!(r.is_err(), "{r:?}");
    // A client that connects and says nothing is closed after the
    // handshake timeout.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    // Half a ClientHello, then silence: the same.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0);
}

#[test]
fn urls_are_parsed_strictly() {
    use vcdn_http::client::parse_url;
    assert_eq!(
        parse_url("https://127.0.0.1:8070/v1/").unwrap(),
        (true, "127.0.0.1".into(), 8070, "/v1".into())
    );
    assert_eq!(
        parse_url("http://[::1]/").unwrap(),
        (false, "::1".into(), 80, "".into())
    );
    assert_eq!(parse_url("https://api.example").unwrap().2, 443);
    for bad in [
        "ftp://x",
        "https://",
        "https://u@x:1",
        "https://x:port",
        "127.0.0.1:8070",
        "https://[::1",
        "https://x/a?b",
    ] {
        assert!(parse_url(bad).is_err(), "{bad}");
    }
}
