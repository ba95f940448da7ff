//! A consumer group member: partitions of the subscribed topics are shared
//! among the members of `group_id`, and the group's committed offsets live
//! in the cluster, so a restarted consumer with the same group id resumes
//! where the last one stopped (the thesis claims this; its prototype began
//! anew at every start).
//!
//! Delivery is **at-least-once**. A record's offset is stored only when the
//! caller asks for the next one ([`Consumer::recv`]), i.e. after it handed
//! the record on; stored offsets are committed in the background every
//! `commit_interval`, at [`Consumer::commit`] and when the consumer is
//! dropped (librdkafka's close commits the stored offsets and leaves the
//! group, so its partitions move at once). The record returned last is not
//! marked handed on by a drop: the caller may not have finished with it. A
//! consumer killed between a hand-on and the next commit gets the records
//! since the last commit again after its restart (at most
//! `commit_interval` of them, plus the one it held), and loses none.

use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::ClientConfig;

/// The largest fetch response the consumer asks for (`fetch.max.bytes`);
/// a frame claiming more than this plus 512 bytes closes the connection.
pub const FETCH_MAX_BYTES: usize = 16 << 20;

/// Consumer settings.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// The consumer group: stable per consuming role (e.g.
    /// `vcdn-supervisor-billing`), so that a restart resumes.
    pub group_id: String,
    /// Static membership (`group.instance.id`): a member restarted with the
    /// same instance id takes its partitions back at once instead of after
    /// the old member's session timed out. Two live members must never
    /// share one.
    pub instance_id: Option<String>,
    /// How long the group waits for a silent member before giving its
    /// partitions to others (6 s is the broker's minimum).
    pub session_timeout: Duration,
    /// How often stored offsets are committed: the bound on what a killed
    /// consumer sees again.
    pub commit_interval: Duration,
    pub client_id: String,
    /// Further librdkafka properties, set last.
    pub extra: Vec<(String, String)>,
}

impl ConsumerOptions {
    /// Defaults for `group_id`.
    pub fn new(group_id: &str) -> Self {
        ConsumerOptions {
            group_id: group_id.to_string(),
            instance_id: None,
            session_timeout: Duration::from_secs(6),
            commit_interval: Duration::from_millis(200),
            client_id: "vcdn".to_string(),
            extra: Vec::new(),
        }
    }
}

/// One consumed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// Milliseconds since the epoch (the producer's create time, or the
    /// broker's append time if the topic says so).
    pub timestamp_ms: Option<i64>,
}

/// Why consuming failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    #[error("creating the consumer: {0}")]
    Create(KafkaError),
    #[error("subscribing: {0}")]
    Subscribe(KafkaError),
    #[error("commit: {0}")]
    Commit(KafkaError),
    /// rdkafka's stream consumer spawns a tokio task: `new` and `repoint`
    /// must run inside a tokio runtime (`Handle::enter` outside one).
    #[error("the Kafka consumer must be made inside a tokio runtime")]
    NoRuntime,
    /// An unrecoverable error (the consumer must be rebuilt).
    #[error("fatal consumer error: {0}")]
    Fatal(KafkaError),
}

/// A consumer group member subscribed to some topics (see the module doc).
pub struct Consumer {
    inner: StreamConsumer,
    options: ConsumerOptions,
    topics: Vec<String>,
    bootstrap: String,
    /// The record handed out last, whose offset is stored at the next call.
    pending: Option<(String, i32, i64)>,
    transient_errors: u64,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("bootstrap", &self.bootstrap)
            .field("group_id", &self.options.group_id)
            .field("topics", &self.topics)
            .finish()
    }
}

impl Consumer {
    /// Joins `options.group_id` on the cluster at `bootstrap` and subscribes
    /// to `topics`. A new group starts at the earliest offset
    /// (`auto.offset.reset=earliest`): nothing published before the first
    /// consumer came is lost. Must be called inside a tokio runtime
    /// (rdkafka spawns a task there), else [`ConsumeError::NoRuntime`].
    pub fn new(
        bootstrap: &str,
        topics: &[&str],
        options: ConsumerOptions,
    ) -> Result<Consumer, ConsumeError> {
        let inner = build(bootstrap, topics, &options)?;
        Ok(Consumer {
            inner,
            options,
            topics: topics.iter().map(|t| t.to_string()).collect(),
            bootstrap: bootstrap.to_string(),
            pending: None,
            transient_errors: 0,
        })
    }

    /// The next record. Marks the previously returned record as handed on
    /// (its offset is stored and committed with the next commit). Transient
    /// errors (a broker away, a topic not created yet) are counted and
    /// waited out; only a fatal error ends this. Cancel-safe.
    pub async fn recv(&mut self) -> Result<Record, ConsumeError> {
        self.store_pending();
        loop {
            match self.inner.recv().await {
                Ok(m) => {
                    let record = Record {
                        topic: m.topic().to_string(),
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(<[u8]>::to_vec),
                        payload: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                        timestamp_ms: m.timestamp().to_millis(),
                    };
                    self.pending = Some((record.topic.clone(), record.partition, record.offset));
                    return Ok(record);
                }
                Err(e @ KafkaError::MessageConsumptionFatal(_)) => {
                    return Err(ConsumeError::Fatal(e));
                }
                Err(e) => {
                    self.transient_errors += 1;
                    tracing::debug!(error = %e, "kafka consumer: transient error");
                }
            }
        }
    }

    /// Transient errors waited out so far (for `/metrics`).
    pub fn transient_errors(&self) -> u64 {
        self.transient_errors
    }

    /// Marks the last record handed on and commits every stored offset now
    /// (synchronously, blocking up to the request's timeout).
    pub fn commit(&mut self) -> Result<(), ConsumeError> {
        self.store_pending();
        match self.inner.commit_consumer_state(CommitMode::Sync) {
            Ok(()) => Ok(()),
            // Nothing stored since the last commit.
            Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => Ok(()),
            Err(e) => Err(ConsumeError::Commit(e)),
        }
    }

    /// The bootstrap servers in use.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Re-points to new bootstrap servers (RECONFIG): marks the last record
    /// handed on, closes the old client (which commits the stored offsets
    /// to the old cluster and leaves the group, best effort: it may be
    /// gone) and joins the group again through the new servers. On the same
    /// cluster (e.g. one that grew) consumption resumes from the committed
    /// offsets: nothing lost, at most the last `commit_interval` again. On a
    /// different cluster the group is new there and starts at its earliest
    /// offsets.
    ///
    /// Blocks while the old client closes (up to its request timeouts when
    /// the old cluster is unreachable): call it from `spawn_blocking` or
    /// `block_in_place`.
    pub fn repoint(&mut self, bootstrap: &str) -> Result<(), ConsumeError> {
        self.store_pending();
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        let new = build(bootstrap, &topics, &self.options)?;
        // Dropping the old consumer closes it: commit, then leave the group.
        drop(std::mem::replace(&mut self.inner, new));
        self.bootstrap = bootstrap.to_string();
        Ok(())
    }

    fn store_pending(&mut self) {
        if let Some((topic, partition, offset)) = self.pending.take() {
            // Stores offset + 1, the next to read. Fails only when the
            // partition was revoked meanwhile: its new owner reads it again
            // (at-least-once).
            if let Err(e) = self.inner.store_offset(&topic, partition, offset) {
                tracing::debug!(error = %e, topic, partition, "kafka consumer: offset not stored");
            }
        }
    }
}

fn build(
    bootstrap: &str,
    topics: &[&str],
    o: &ConsumerOptions,
) -> Result<StreamConsumer, ConsumeError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ConsumeError::NoRuntime);
    }
    let session = o.session_timeout.as_millis().max(1);
    let mut cfg = ClientConfig::new();
    // librdkafka's own debug contexts (`eos,broker,msg`, …) for an operator
    // chasing a slow or stuck sink; they log at DEBUG under `librdkafka`.
    if let Ok(contexts) = std::env::var("VCDN_KAFKA_DEBUG") {
        cfg.set("debug", contexts);
    }
    cfg.set("bootstrap.servers", bootstrap)
        .set("group.id", &o.group_id)
        .set("client.id", &o.client_id)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set(
            "auto.commit.interval.ms",
            o.commit_interval.as_millis().max(1).to_string(),
        )
        .set("session.timeout.ms", session.to_string())
        .set("heartbeat.interval.ms", (session / 3).max(1).to_string())
        // Without it librdkafka leaves Nagle on, and Nagle against the
        // peer's delayed ACK holds small requests ~40 ms.
        .set("socket.nagle.disable", "true")
        .set("reconnect.backoff.ms", "50")
        .set("reconnect.backoff.max.ms", "1000")
        // Bounds on what one fetch response may hold and claim (librdkafka:
        // 50 MB and 100 MB): 16 MiB is 8 s of the 2 MiB/s per fetch,
        // far more than a consumer that keeps up needs.
        .set("fetch.max.bytes", FETCH_MAX_BYTES.to_string())
        .set(
            "receive.message.max.bytes",
            (FETCH_MAX_BYTES + 512).to_string(),
        );
    if let Some(id) = &o.instance_id {
        cfg.set("group.instance.id", id);
    }
    for (k, v) in &o.extra {
        cfg.set(k, v);
    }
    let inner: StreamConsumer = cfg.create().map_err(ConsumeError::Create)?;
    inner.subscribe(topics).map_err(ConsumeError::Subscribe)?;
    Ok(inner)
}
