//! The sockmap relay on real loopback sockets (needs CAP_BPF: root here).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use vcdn_accel::sockmap::Sockmap;

/// A connected pair (client end, server end).
async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    (0..n as u64)
        .map(|i| ((i * 31 + seed) % 251) as u8)
        .collect()
}

#[tokio::test]
async fn relays_exact_byte_counts_repeatedly_on_the_same_connections() {
    let map = Sockmap::new(64).expect("sockmap loads");
    // source -> [from | relay | to] -> sink
    let (mut source, mut from) = pair().await;
    let (mut to, mut sink) = pair().await;
    for (round, n) in [1usize, 1460, 100_000, 500_000, 3_000_000]
        .into_iter()
        .enumerate()
    {
        let data = pattern(round as u64, n);
        let d = data.clone();
        let writer = tokio::spawn(async move {
            source.write_all(&d).await.unwrap();
            source
        });
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; n];
            sink.read_exact(&mut got).await.unwrap();
            (sink, got)
        });
        map.relay_exact(&from, &to, n as u64, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("round {round} ({n} bytes): {e}"));
        source = writer.await.unwrap();
        let (s, got) = tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .expect("the sink gets every byte")
            .unwrap();
        sink = s;
        assert!(got == data, "round {round}: bytes differ");
        // Between relays the sockets work normally, both ways.
        source.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        from.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
        sink.write_all(b"pong").await.unwrap();
        to.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
    }
}

#[tokio::test]
async fn a_closed_source_is_an_error_not_a_hang() {
    let map = Sockmap::new(8).expect("sockmap loads");
    let (mut source, from) = pair().await;
    let (to, _sink) = pair().await;
    source.write_all(&[7u8; 1000]).await.unwrap();
    drop(source);
    let e = map
        .relay_exact(&from, &to, 5000, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), std::io::ErrorKind::UnexpectedEof), "{e}");
}

#[tokio::test]
async fn a_source_closing_mid_relay_is_an_error() {
    let map = Sockmap::new(8).expect("sockmap loads");
    let (mut source, from) = pair().await;
    let (to, mut sink) = pair().await;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        source.write_all(&[7u8; 1000]).await.unwrap();
    });
    let e = map
        .relay_exact(&from, &to, 5000, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), std::io::ErrorKind::UnexpectedEof), "{e}");
    // What did arrive was passed on.
    let mut got = vec![0u8; 1000];
    tokio::time::timeout(Duration::from_secs(5), sink.read_exact(&mut got))
        .await
        .expect("the 1000 bytes that arrived reach the sink")
        .unwrap();
}

/// A source that keeps sending past `n` (a hostile origin after its
/// Content-Length) never gets those bytes to the target: the relay either
/// stops at `n`, leaving them on `from` as splice would, or refuses.
#[tokio::test]
async fn bytes_past_n_never_reach_the_target() {
    let map = Sockmap::new(8).expect("sockmap loads");
    let (mut source, from) = pair().await;
    let (to, mut sink) = pair().await;
    let n = 200_000usize;
    let writer = tokio::spawn(async move {
        // Start after the relay joined, then stream well past n.
        tokio::time::sleep(Duration::from_millis(20)).await;
        for _ in 0..20 {
            if source.write_all(&[9u8; 100_000]).await.is_err() {
                break;
            }
        }
        source
    });
    let r = map
        .relay_exact(&from, &to, n as u64, Duration::from_secs(5))
        .await;
    if let Err(e) = &r {
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    }
    drop(to);
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), sink.read_to_end(&mut got))
        .await
        .expect("the target closes")
        .unwrap();
    assert!(
        got.len() <= n,
        "{} bytes reached the target, n = {n}",
        got.len()
    );
    if r.is_ok() {
        assert_eq!(got.len(), n);
    }
    drop(from);
    let _ = writer.await;
}
