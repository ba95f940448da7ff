//! The datasink layer against real Apache Kafka 4.3.1 brokers (KRaft) that
//! each test starts itself: own ports, own temporary directory, brokers
//! killed at the end also on failure (`Broker`'s drop). Needs the
//! distribution `scripts/kafka.sh` fetches (`scripts/test.sh` runs it) and a
//! JDK; without them the tests fail and say what to run.
//!
//! The tests run one at a time (a lock): each JVM broker wants a good part of
//! the two cores these machines have.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vcdn_telemetry::kafka::broker::random_cluster_id;
use vcdn_telemetry::kafka::{
    Admin, Broker, BrokerError, BrokerSpec, ConsumeError, Consumer, ConsumerOptions, KafkaDist,
    Producer, ProducerOptions, SendError, TopicSpec,
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn dist() -> KafkaDist {
    KafkaDist::locate().unwrap_or_else(|e| panic!("cannot run the Kafka tests: {e}"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_master(dist: &KafkaDist, dir: &Path) -> Broker {
    let spec = BrokerSpec::master("127.0.0.1", free_port(), free_port(), dir);
    let t = Instant::now();
    let b = Broker::start(dist, spec).unwrap_or_else(|e| panic!("master did not start: {e}"));
    eprintln!("master {} ready in {:?}", b.bootstrap(), t.elapsed());
    // The broker logs into its data directory (not the working directory).
    let log = std::fs::read_to_string(dir.join("logs/server.log")).unwrap_or_default();
    assert!(
        log.contains("Kafka Server started"),
        "no server.log in {dir:?}"
    );
    b
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Payloads are `seq sent_micros`.
fn payload(seq: u64) -> Vec<u8> {
    format!("{seq} {}", now_micros()).into_bytes()
}

fn parse(payload: &[u8]) -> (u64, u64) {
    let s = std::str::from_utf8(payload).expect("utf-8 payload");
    let mut it = s.split(' ');
    let seq = it.next().unwrap().parse().expect("seq");
    let sent = it.next().unwrap().parse().expect("time");
    (seq, sent)
}

async fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    Admin::new(bootstrap)
        .unwrap()
        .create_topics(&[TopicSpec {
            name: name.to_string(),
            partitions,
            replication: 1,
        }])
        .await
        .unwrap();
}

/// Receives until every sequence number below `n` was seen or `limit`
/// passed; returns where (partition, offset) each was seen, as often as it
/// was seen.
async fn collect(
    consumer: &mut Consumer,
    n: u64,
    limit: Duration,
) -> HashMap<u64, Vec<(i32, i64)>> {
    let mut seen = HashMap::new();
    collect_into(consumer, &mut seen, n, limit).await;
    seen
}

/// [`collect`] into `seen`.
async fn collect_into(
    consumer: &mut Consumer,
    seen: &mut HashMap<u64, Vec<(i32, i64)>>,
    n: u64,
    limit: Duration,
) {
    let deadline = tokio::time::Instant::now() + limit;
    while !(0..n).all(|s| seen.contains_key(&s)) {
        match tokio::time::timeout_at(deadline, consumer.recv()).await {
            Ok(Ok(r)) => seen
                .entry(parse(&r.payload).0)
                .or_default()
                .push((r.partition, r.offset)),
            Ok(Err(e)) => panic!("consumer failed: {e}"),
            Err(_) => break,
        }
    }
}

fn missing<V>(seen: &HashMap<u64, V>, n: u64) -> Vec<u64> {
    (0..n).filter(|s| !seen.contains_key(s)).collect()
}

/// Produces through a consumer group and measures the delivery latency of
/// each message (send to receive, same host clock).
#[test]
fn produce_consume_round_trip() {
    let _g = serial();
    let dist = dist();
    let tmp = tempfile::tempdir().unwrap();
    let broker = start_master(&dist, tmp.path());
    let bootstrap = broker.bootstrap();
    const N: u64 = 2000;
    runtime().block_on(async {
        create_topic(&bootstrap, "roundtrip", 4).await;
        let producer = Producer::new(&bootstrap, ProducerOptions::default()).unwrap();
        let mut consumer =
            Consumer::new(&bootstrap, &["roundtrip"], ConsumerOptions::new("rt")).unwrap();
        // Warm up: the group is joined once the first record arrives.
        let joined = Instant::now();
        producer.send("roundtrip", b"w", b"0 0").unwrap();
        let first = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .expect("no record within 60 s")
            .unwrap();
        assert_eq!(first.payload, b"0 0");
        eprintln!("group joined, first record in {:?}", joined.elapsed());

        let sender = std::thread::spawn(move || {
            for seq in 1..=N {
                producer
                    .send("roundtrip", &seq.to_be_bytes(), &payload(seq))
                    .unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(producer.flush(Duration::from_secs(30)));
            producer.counters()
        });
        let mut latencies = Vec::new();
        let mut seen = HashMap::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while (seen.len() as u64) < N {
            let r = tokio::time::timeout_at(deadline, consumer.recv())
                .await
                .expect("records missing after 60 s")
                .unwrap();
            let (seq, sent) = parse(&r.payload);
            latencies.push(now_micros().saturating_sub(sent));
            *seen.entry(seq).or_insert(0u32) += 1;
            assert!(r.timestamp_ms.is_some());
            assert_eq!(r.key.as_deref(), Some(&seq.to_be_bytes()[..]));
        }
        let counters = sender.join().unwrap();
        assert_eq!(counters.delivered, N + 1, "{counters:?}");
        assert_eq!(counters.failed + counters.dropped_full, 0, "{counters:?}");
        assert!(
            seen.values().all(|&c| c == 1),
            "duplicates without a restart"
        );
        latencies.sort_unstable();
        let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
        eprintln!(
            "round trip of {N} messages: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            pct(0.5),
            pct(0.99),
            pct(1.0)
        );
        // Loose: timing on a shared 2-core machine; catches a batching
        // misconfiguration (seconds of linger), not milliseconds.
        assert!(pct(0.99) < 2000.0, "p99 {} ms", pct(0.99));

        // A producer that starts while the cluster runs (an agent that just
        // found the sink) delivers its first message before librdkafka's
        // 500 ms producer-id timer would have fired: without
        // `hasten_producer_id` this took 0.5-0.6 s, with it ~0.1 s.
        let late = Producer::new(&bootstrap, ProducerOptions::default()).unwrap();
        let t0 = Instant::now();
        late.send("roundtrip", b"late", b"0 0").unwrap();
        while late.counters().delivered == 0 && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = t0.elapsed();
        eprintln!("a new producer's first delivery: {took:?}");
        assert!(
            took < Duration::from_millis(450),
            "a new producer took {took:?} to deliver its first message"
        );
    });
    drop(broker);
}

/// Not a test by itself: the consumer process that
/// `killed_consumer_resumes_from_committed_offsets` starts and kills. It
/// prints `GOT seq` for every record it handed on, slowly.
#[test]
#[ignore = "helper process of killed_consumer_resumes_from_committed_offsets"]
fn child_consumer() {
    let Ok(bootstrap) = std::env::var("VCDN_KAFKA_CHILD_BOOTSTRAP") else {
        return;
    };
    let topic = std::env::var("VCDN_KAFKA_CHILD_TOPIC").unwrap();
    let group = std::env::var("VCDN_KAFKA_CHILD_GROUP").unwrap();
    runtime().block_on(async {
        let mut consumer =
            Consumer::new(&bootstrap, &[&topic], ConsumerOptions::new(&group)).unwrap();
        let mut out = std::io::stdout().lock();
        loop {
            let r = consumer.recv().await.unwrap();
            writeln!(out, "GOT {}", parse(&r.payload).0).unwrap();
            out.flush().unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
}

/// Kills its child process on drop (test failure included).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A consumer process is killed (SIGKILL, no clean leave, no final commit)
/// mid-stream; a new one in the same group resumes from the committed
/// offsets: nothing lost, and only the uncommitted tail seen twice.
#[test]
fn killed_consumer_resumes_from_committed_offsets() {
    let _g = serial();
    let dist = dist();
    let tmp = tempfile::tempdir().unwrap();
    let broker = start_master(&dist, tmp.path());
    let bootstrap = broker.bootstrap();
    const N: u64 = 10_000;
    let rt = runtime();
    rt.block_on(async {
        create_topic(&bootstrap, "resume", 3).await;
        let producer = Producer::new(&bootstrap, ProducerOptions::default()).unwrap();
        for seq in 0..N {
            producer
                .send("resume", &seq.to_be_bytes(), &payload(seq))
                .unwrap();
        }
        assert!(producer.flush(Duration::from_secs(30)));
        assert_eq!(producer.counters().delivered, N);
    });

    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["child_consumer", "--exact", "--ignored", "--nocapture"])
            .env("VCDN_KAFKA_CHILD_BOOTSTRAP", &bootstrap)
            .env("VCDN_KAFKA_CHILD_TOPIC", "resume")
            .env("VCDN_KAFKA_CHILD_GROUP", "resume-group")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(seq) = line.strip_prefix("GOT ") {
                if tx.send(seq.parse::<u64>().unwrap()).is_err() {
                    break;
                }
            }
        }
    });
    let mut first: HashMap<u64, u32> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while first.values().sum::<u32>() < 3000 {
        let left = deadline.saturating_duration_since(Instant::now());
        let seq = rx
            .recv_timeout(left)
            .expect("the child consumer handed on fewer than 3000 records in 90 s");
        *first.entry(seq).or_default() += 1;
    }
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // What it printed before it died was handed on too.
    while let Ok(seq) = rx.recv_timeout(Duration::from_millis(200)) {
        *first.entry(seq).or_default() += 1;
    }
    let first_count: u32 = first.values().sum();
    assert!(
        (first_count as u64) < N,
        "the child finished before the kill"
    );

    let (second, resumed_in) = rt.block_on(async {
        let t = Instant::now();
        let mut consumer = Consumer::new(
            &bootstrap,
            &["resume"],
            ConsumerOptions::new("resume-group"),
        )
        .unwrap();
        let mut seen = HashMap::new();
        // Until everything the child did not get has arrived.
        let want: Vec<u64> = (0..N).filter(|s| !first.contains_key(s)).collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        let mut resumed_in = None;
        while !want.iter().all(|s| seen.contains_key(s)) {
            match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Ok(r) => {
                    resumed_in.get_or_insert(t.elapsed());
                    *seen.entry(parse(&r.unwrap().payload).0).or_insert(0u32) += 1;
                }
                Err(_) => break,
            }
        }
        consumer.commit().unwrap();
        (seen, resumed_in)
    });
    let mut all = first.clone();
    for (s, c) in &second {
        *all.entry(*s).or_default() += c;
    }
    let lost = missing(&all, N);
    let duplicated: u32 = all.values().map(|c| c - 1).sum();
    eprintln!(
        "killed consumer: first process handed on {first_count}, second resumed after {resumed_in:?} \
         and got {}, lost {}, duplicated {duplicated}",
        second.values().sum::<u32>(),
        lost.len()
    );
    assert!(
        lost.is_empty(),
        "lost {} records, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    // Resumed from the committed offsets, not from the beginning: only the
    // uncommitted tail (≤ the 200 ms commit interval) comes again.
    assert!(
        duplicated < first_count / 2,
        "{duplicated} of {first_count} records seen twice: the group did not resume"
    );
    drop(broker);
}

/// The broker is killed and restarted a few seconds later while a producer
/// keeps sending: every sequence number arrives (the producer buffers and
/// retries; idempotence keeps retries from duplicating).
#[test]
fn broker_restart_loses_nothing() {
    let _g = serial();
    let dist = dist();
    let tmp = tempfile::tempdir().unwrap();
    let mut broker = start_master(&dist, tmp.path());
    let bootstrap = broker.bootstrap();
    const N: u64 = 4000;
    let rt = runtime();
    rt.block_on(create_topic(&bootstrap, "restart", 2));
    let consumer = {
        let bootstrap = bootstrap.clone();
        rt.spawn(async move {
            let mut c =
                Consumer::new(&bootstrap, &["restart"], ConsumerOptions::new("restart")).unwrap();
            collect(&mut c, N, Duration::from_secs(150)).await
        })
    };
    let producer = Producer::new(&bootstrap, ProducerOptions::default()).unwrap();
    let (progress_tx, progress) = mpsc::channel();
    let sender = std::thread::spawn(move || {
        let t = Instant::now();
        for seq in 0..N {
            producer
                .send("restart", &seq.to_be_bytes(), &payload(seq))
                .unwrap_or_else(|e| panic!("send {seq}: {e}"));
            if seq == N / 4 {
                let _ = progress_tx.send(());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let sent_in = t.elapsed();
        let flushed = producer.flush(Duration::from_secs(90));
        (flushed, producer.counters(), sent_in)
    });
    progress.recv().unwrap();
    broker.kill();
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    broker
        .start_again()
        .unwrap_or_else(|e| panic!("restart: {e}"));
    eprintln!("broker away for {:?}", down.elapsed());
    let (flushed, counters, sent_in) = sender.join().unwrap();
    eprintln!("producer: {counters:?}, sending took {sent_in:?}");
    assert!(flushed, "not all delivered: {counters:?}");
    assert_eq!(counters.delivered, N, "{counters:?}");
    assert_eq!(counters.failed + counters.dropped_full, 0, "{counters:?}");
    let seen = rt.block_on(consumer).unwrap();
    let lost = missing(&seen, N);
    // Read twice (the group rebalanced when its coordinator restarted and
    // resumed from the last commit: at-least-once) versus written twice
    // (the same message at two offsets: what idempotence prevents).
    let read_twice: usize = seen.values().map(|at| at.len() - 1).sum();
    let written_twice = seen
        .values()
        .filter(|at| at.iter().collect::<std::collections::HashSet<_>>().len() > 1)
        .count();
    eprintln!(
        "broker restart: lost {}, read twice {read_twice}, written twice {written_twice}",
        lost.len()
    );
    assert!(
        lost.is_empty(),
        "lost {} records, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    assert_eq!(written_twice, 0, "the idempotent producer wrote duplicates");

    // The data directory is this cluster's: another cluster id is refused
    // before anything starts.
    broker.stop();
    let mut other = broker.spec().clone();
    other.cluster_id = Some(random_cluster_id());
    match Broker::start(&dist, other) {
        Err(BrokerError::OtherCluster { formatted, .. }) => {
            assert_eq!(formatted, broker.cluster_id())
        }
        r => panic!("started on another cluster's data: {r:?}"),
    }
    drop(broker);
}

/// CLUSTER_RESIZE: a second broker (broker-only, the master's quorum) joins,
/// the topic's partitions are spread over both, and production and
/// consumption go on, also through the new broker alone.
#[test]
fn second_broker_joins_and_partitions_spread() {
    let _g = serial();
    let dist = dist();
    let tmp = tempfile::tempdir().unwrap();
    let master = start_master(&dist, &tmp.path().join("master"));
    let bootstrap = master.bootstrap();
    const N: u64 = 1000;
    let rt = runtime();
    rt.block_on(create_topic(&bootstrap, "resize", 6));
    let producer = Producer::new(&bootstrap, ProducerOptions::default()).unwrap();
    for seq in 0..N {
        producer
            .send("resize", &seq.to_be_bytes(), &payload(seq))
            .unwrap();
    }
    assert!(producer.flush(Duration::from_secs(30)));
    // Outside a runtime the consumer cannot be made (an error, no panic).
    assert!(matches!(
        Consumer::new(&bootstrap, &["resize"], ConsumerOptions::new("resize")),
        Err(ConsumeError::NoRuntime)
    ));
    let _in_runtime = rt.enter();
    let mut consumer =
        Consumer::new(&bootstrap, &["resize"], ConsumerOptions::new("resize")).unwrap();
    let mut seen = HashMap::new();
    rt.block_on(collect_into(
        &mut consumer,
        &mut seen,
        N,
        Duration::from_secs(60),
    ));
    assert!(missing(&seen, N).is_empty());

    let spec = BrokerSpec::slave(
        2,
        "127.0.0.1",
        free_port(),
        master.controller().unwrap(),
        master.cluster_id(),
        &tmp.path().join("slave"),
    );
    let t = Instant::now();
    let slave = Broker::start(&dist, spec).unwrap_or_else(|e| panic!("slave did not join: {e}"));
    eprintln!("slave {} joined in {:?}", slave.bootstrap(), t.elapsed());

    let admin = Admin::new(&bootstrap).unwrap();
    let brokers = admin.wait_brokers(2, Duration::from_secs(60)).unwrap();
    assert_eq!(brokers.iter().map(|b| b.id).collect::<Vec<_>>(), vec![1, 2]);
    let t = Instant::now();
    let plan = admin
        .spread_over_all_brokers(&dist, &["resize"], Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("reassignment: {e}"));
    eprintln!("moved {} partitions in {:?}", plan.moves.len(), t.elapsed());
    assert_eq!(plan.moves.len(), 3, "{plan:?}");
    let layout = admin.topic_layout("resize").unwrap();
    let mut leaders: Vec<i32> = layout.iter().map(|p| p.leader).collect();
    leaders.sort_unstable();
    assert_eq!(leaders, vec![1, 1, 1, 2, 2, 2], "{layout:?}");

    // The producer follows the moved leaders by itself (librdkafka
    // refreshes its metadata on NOT_LEADER_OR_FOLLOWER)...
    for seq in N..N + N / 2 {
        producer
            .send("resize", &seq.to_be_bytes(), &payload(seq))
            .unwrap();
    }
    assert!(
        producer.flush(Duration::from_secs(60)),
        "{:?}",
        producer.counters()
    );
    // ...and is re-pointed when the discovery protocol's RECONFIG names
    // both brokers.
    let both = format!("{bootstrap},{}", slave.bootstrap());
    producer.repoint(&both, Duration::from_secs(10)).unwrap();
    for seq in N + N / 2..2 * N {
        producer
            .send("resize", &seq.to_be_bytes(), &payload(seq))
            .unwrap();
    }
    assert!(
        producer.flush(Duration::from_secs(60)),
        "{:?}",
        producer.counters()
    );
    let c = producer.counters();
    assert_eq!(c.delivered, 2 * N, "{c:?}");

    // Re-pointed to the new broker alone, the group resumes from its
    // committed offsets there, the moved partitions included.
    consumer.repoint(&slave.bootstrap()).unwrap();
    rt.block_on(collect_into(
        &mut consumer,
        &mut seen,
        2 * N,
        Duration::from_secs(90),
    ));
    let lost = missing(&seen, 2 * N);
    let read_twice: usize = seen.values().map(|at| at.len() - 1).sum();
    eprintln!(
        "after the resize: lost {}, read twice {read_twice}",
        lost.len()
    );
    assert!(
        lost.is_empty(),
        "lost {} records, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    assert!(
        read_twice < N as usize / 2,
        "the group did not resume: {read_twice} read twice"
    );
    drop(consumer);
    drop(slave);
    drop(master);
}

/// The sink is away and the queue bounded: `send` refuses at once (an
/// error, counted) instead of blocking the serving thread.
#[test]
fn full_queue_is_an_error_not_a_block() {
    // No broker: the port is closed (the sink is away).
    let away = format!("127.0.0.1:{}", free_port());
    let producer = Producer::new(
        &away,
        ProducerOptions {
            queue_messages: 1000,
            ..ProducerOptions::default()
        },
    )
    .unwrap();
    let t = Instant::now();
    let mut full = 0;
    for seq in 0..5000u64 {
        match producer.send("away", &seq.to_be_bytes(), &payload(seq)) {
            Ok(()) => {}
            Err(SendError::Full) => full += 1,
            Err(e) => panic!("{e}"),
        }
    }
    let took = t.elapsed();
    let c = producer.counters();
    eprintln!("5000 sends into a queue of 1000 took {took:?}: {c:?}");
    assert_eq!(full, 4000);
    assert_eq!(c.sent, 1000);
    assert_eq!(c.dropped_full, 4000);
    assert!(took < Duration::from_secs(2), "send blocked: {took:?}");

    // The byte bound too: 64 KiB holds about 64 messages of 1 KiB.
    let producer = Producer::new(
        &away,
        ProducerOptions {
            queue_bytes: 64 * 1024,
            ..ProducerOptions::default()
        },
    )
    .unwrap();
    let big = vec![b'x'; 1024];
    let accepted = (0..1000)
        .filter(|_| producer.send("away", b"k", &big).is_ok())
        .count();
    assert!(
        (32..=80).contains(&accepted),
        "{accepted} KiB messages in a 64 KiB queue"
    );
    assert_eq!(producer.counters().dropped_full, 1000 - accepted as u64);

    // A message over `message.max.bytes` (1 MB) is refused, not queued.
    let huge = vec![b'x'; 2 << 20];
    assert_eq!(producer.send("away", b"k", &huge), Err(SendError::TooLarge));
}

/// RECONFIG from a sink that is gone to one that is up: what the old client
/// still held is handed over to the new one and arrives.
#[test]
fn repoint_hands_the_queue_over() {
    let _g = serial();
    let dist = dist();
    let tmp = tempfile::tempdir().unwrap();
    let broker = start_master(&dist, tmp.path());
    let bootstrap = broker.bootstrap();
    const N: u64 = 500;
    let rt = runtime();
    rt.block_on(create_topic(&bootstrap, "handover", 2));
    let away = format!("127.0.0.1:{}", free_port());
    let producer = Producer::new(&away, ProducerOptions::default()).unwrap();
    for seq in 0..N {
        producer
            .send("handover", &seq.to_be_bytes(), &payload(seq))
            .unwrap();
    }
    let handed = producer
        .repoint(&bootstrap, Duration::from_millis(500))
        .unwrap();
    assert_eq!(handed, N);
    assert!(
        producer.flush(Duration::from_secs(30)),
        "{:?}",
        producer.counters()
    );
    let c = producer.counters();
    assert_eq!((c.delivered, c.failed, c.handed_over), (N, 0, N), "{c:?}");
    let seen = rt.block_on(async {
        let mut consumer =
            Consumer::new(&bootstrap, &["handover"], ConsumerOptions::new("handover")).unwrap();
        collect(&mut consumer, N, Duration::from_secs(60)).await
    });
    assert!(missing(&seen, N).is_empty());
    drop(broker);
}

/// A hostile "broker" (a forged or stale RECONFIG can name any address)
/// answers with a frame claiming 50 MB: the clients refuse it and close the
/// connection at once instead of waiting for (and buffering) 50 MB, which
/// librdkafka's default limit of 100 MB would allow on every connection.
#[test]
fn hostile_broker_frame_sizes_are_refused() {
    use std::io::Read;
    let rt = runtime();
    let _in_runtime = rt.enter();
    for client in ["producer", "consumer"] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut request = [0u8; 4096];
            let n = s.read(&mut request).unwrap();
            assert!(n >= 12, "no request");
            // Size 50 MB, then the request's correlation id (bytes 8..12).
            let mut answer = 50_000_000u32.to_be_bytes().to_vec();
            answer.extend_from_slice(&request[8..12]);
            answer.extend_from_slice(&[0u8; 64]);
            s.write_all(&answer).unwrap();
            let sent = Instant::now();
            // The client closes; a read times out if it waits for the rest.
            let mut rest = [0u8; 4096];
            loop {
                match s.read(&mut rest) {
                    Ok(0) => return Some(sent.elapsed()),
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                        return Some(sent.elapsed())
                    }
                    Err(_) => return None,
                }
            }
        });
        let (producer, consumer);
        if client == "producer" {
            producer = Some(Producer::new(&addr, ProducerOptions::default()).unwrap());
            producer.as_ref().unwrap().send("t", b"k", b"v").unwrap();
            consumer = None;
        } else {
            consumer = Some(Consumer::new(&addr, &["t"], ConsumerOptions::new("g")).unwrap());
            producer = None;
        }
        let closed = server.join().unwrap();
        eprintln!("{client}: closed {closed:?} after the 50 MB claim");
        let closed = closed.unwrap_or_else(|| panic!("the {client} waited for a 50 MB frame"));
        assert!(closed < Duration::from_secs(5), "{client}: {closed:?}");
        drop((producer, consumer));
    }
}
