//! Cluster administration for the datasink: topics, the broker list and
//! CLUSTER_RESIZE (spreading the telemetry topics' partitions over every
//! broker after a slave joined).
//!
//! Partition reassignment runs Kafka's own
//! `org.apache.kafka.tools.reassign.ReassignPartitionsCommand` from the
//! distribution: librdkafka (hence rdkafka) has no AlterPartitionReassignments
//! API, and Kafka's tool is the reference implementation of it. The plan is
//! computed here (deterministic, see [`plan_spread`]) and completion is
//! watched through metadata, so only one JVM start is paid.
//!
//! `create_topics` is async; the rest blocks (metadata requests, a JVM):
//! call it from `spawn_blocking` in async code.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

use super::dist::KafkaDist;

/// A topic to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    pub replication: i32,
}

/// A broker as the metadata lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub id: i32,
    pub host: String,
    pub port: u16,
}

/// Where one partition lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLayout {
    pub topic: String,
    pub partition: i32,
    pub leader: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

/// A reassignment: the target replicas of each partition that moves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reassignment {
    pub moves: Vec<(String, i32, Vec<i32>)>,
}

/// Why an admin operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("creating topic {0}: {1}")]
    CreateTopic(String, RDKafkaErrorCode),
    #[error("topic {0} is unknown to the cluster")]
    UnknownTopic(String),
    #[error("reassignment tool: {0}")]
    Tool(String),
    #[error("reassignment not complete after {0:?}: {1}")]
    Timeout(Duration, String),
}

/// An admin client for the cluster at some bootstrap servers.
pub struct Admin {
    client: AdminClient<DefaultClientContext>,
    bootstrap: String,
}

impl Admin {
    pub fn new(bootstrap: &str) -> Result<Admin, AdminError> {
        let client = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("client.id", "vcdn-admin")
            .create()?;
        Ok(Admin {
            client,
            bootstrap: bootstrap.to_string(),
        })
    }

    /// Creates the topics; one that exists already is fine (idempotent,
    /// whoever of several nodes comes first creates it).
    pub async fn create_topics(&self, topics: &[TopicSpec]) -> Result<(), AdminError> {
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| {
                NewTopic::new(
                    &t.name,
                    t.partitions,
                    TopicReplication::Fixed(t.replication),
                )
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for result in self.client.create_topics(new.iter(), &opts).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => return Err(AdminError::CreateTopic(name, code)),
            }
        }
        Ok(())
    }

    /// The brokers the cluster lists (live, registered ones), by id.
    pub fn brokers(&self) -> Result<Vec<BrokerInfo>, AdminError> {
        let md = self
            .client
            .inner()
            .fetch_metadata(None, Duration::from_secs(10))?;
        let mut b: Vec<BrokerInfo> = md
            .brokers()
            .iter()
            .map(|b| BrokerInfo {
                id: b.id(),
                host: b.host().to_string(),
                port: b.port().clamp(0, u16::MAX as i32) as u16,
            })
            .collect();
        b.sort_by_key(|b| b.id);
        Ok(b)
    }

    /// Waits until the cluster lists at least `count` brokers (a slave
    /// joining), polling metadata.
    pub fn wait_brokers(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<BrokerInfo>, AdminError> {
        let deadline = Instant::now() + timeout;
        loop {
            let b = self.brokers()?;
            if b.len() >= count {
                return Ok(b);
            }
            if Instant::now() >= deadline {
                return Err(AdminError::Timeout(
                    timeout,
                    format!("{} brokers of {count}", b.len()),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The partitions of `topic`, by partition number.
    pub fn topic_layout(&self, topic: &str) -> Result<Vec<PartitionLayout>, AdminError> {
        let md = self
            .client
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .ok_or_else(|| AdminError::UnknownTopic(topic.to_string()))?;
        let mut parts: Vec<PartitionLayout> = t
            .partitions()
            .iter()
            .map(|p| PartitionLayout {
                topic: topic.to_string(),
                partition: p.id(),
                leader: p.leader(),
                replicas: p.replicas().to_vec(),
                isr: p.isr().to_vec(),
            })
            .collect();
        parts.sort_by_key(|p| p.partition);
        Ok(parts)
    }

    /// CLUSTER_RESIZE: spreads the partitions of `topics` over every broker
    /// the cluster lists now (see [`plan_spread`]), starts the moves with
    /// Kafka's reassignment tool and waits up to `timeout` until every
    /// moved partition has exactly its target replicas, all in sync.
    /// Clients need nothing: librdkafka refreshes its metadata when a
    /// leader moves (NOT_LEADER_OR_FOLLOWER) and keeps its queue meanwhile.
    pub fn spread_over_all_brokers(
        &self,
        dist: &KafkaDist,
        topics: &[&str],
        timeout: Duration,
    ) -> Result<Reassignment, AdminError> {
        let brokers: Vec<i32> = self.brokers()?.iter().map(|b| b.id).collect();
        let mut layout = Vec::new();
        for t in topics {
            layout.extend(self.topic_layout(t)?);
        }
        let plan = plan_spread(&layout, &brokers);
        if plan.moves.is_empty() {
            return Ok(plan);
        }
        self.execute(dist, &plan)?;
        self.wait_reassigned(&plan, timeout)?;
        Ok(plan)
    }

    /// Starts `plan` with `ReassignPartitionsCommand --execute`.
    pub fn execute(&self, dist: &KafkaDist, plan: &Reassignment) -> Result<(), AdminError> {
        static RUN: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vcdn-reassign-{}-{}",
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| AdminError::Tool(e.to_string()))?;
        let file = dir.join("reassignment.json");
        let result = (|| {
            std::fs::write(&file, plan.to_json()).map_err(|e| AdminError::Tool(e.to_string()))?;
            let out = dist
                .java_command()
                .arg("-Xmx256m")
                .arg("org.apache.kafka.tools.reassign.ReassignPartitionsCommand")
                .arg("--bootstrap-server")
                .arg(&self.bootstrap)
                .arg("--reassignment-json-file")
                .arg(&file)
                .arg("--execute")
                .current_dir(&dir)
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| AdminError::Tool(format!("running java: {e}")))?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if !out.status.success() || !text.contains("Successfully started") {
                return Err(AdminError::Tool(format!("{}: {text}", out.status)));
            }
            Ok(())
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    /// Waits until every partition of `plan` has exactly its target
    /// replicas (while a move runs, metadata lists old and new ones), all in
    /// sync, and a leader among them.
    pub fn wait_reassigned(
        &self,
        plan: &Reassignment,
        timeout: Duration,
    ) -> Result<(), AdminError> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut pending = String::new();
            let topics: BTreeSet<&str> = plan.moves.iter().map(|m| m.0.as_str()).collect();
            for t in topics {
                let layout = self.topic_layout(t)?;
                for (topic, partition, target) in plan.moves.iter().filter(|m| m.0 == t) {
                    let want: BTreeSet<i32> = target.iter().copied().collect();
                    let done = layout.iter().any(|p| {
                        p.partition == *partition
                            && p.replicas.iter().copied().collect::<BTreeSet<_>>() == want
                            && p.isr.iter().copied().collect::<BTreeSet<_>>() == want
                            && want.contains(&p.leader)
                    });
                    if !done {
                        let _ = write!(pending, "{topic}-{partition} ");
                    }
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(AdminError::Timeout(
                    timeout,
                    format!("still moving: {pending}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Reassignment {
    /// The tool's JSON (`{"version":1,"partitions":[...]}`).
    pub fn to_json(&self) -> String {
        let partitions: Vec<serde_json::Value> = self
            .moves
            .iter()
            .map(|(t, p, r)| serde_json::json!({"topic": t, "partition": p, "replicas": r}))
            .collect();
        serde_json::json!({"version": 1, "partitions": partitions}).to_string()
    }
}

/// The plan that spreads partitions evenly over `brokers`: partition `p`
/// of a topic gets the replication factor it has now, on consecutive
/// brokers (by id) starting at `p mod n`, so leaders (the first replica)
/// rotate over all brokers. Partitions already placed so are left alone.
pub fn plan_spread(layout: &[PartitionLayout], brokers: &[i32]) -> Reassignment {
    let mut ids: Vec<i32> = brokers.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let mut plan = Reassignment::default();
    if ids.is_empty() {
        return plan;
    }
    let n = ids.len();
    for p in layout {
        let rf = p.replicas.len().clamp(1, n);
        let start = (p.partition.max(0) as usize) % n;
        let target: Vec<i32> = (0..rf).map(|i| ids[(start + i) % n]).collect();
        if target != p.replicas {
            plan.moves.push((p.topic.clone(), p.partition, target));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(p: i32, replicas: &[i32]) -> PartitionLayout {
        PartitionLayout {
            topic: "t".into(),
            partition: p,
            leader: replicas[0],
            replicas: replicas.to_vec(),
            isr: replicas.to_vec(),
        }
    }

    #[test]
    fn spread_rotates_leaders_and_keeps_what_is_in_place() {
        let layout: Vec<_> = (0..4).map(|p| part(p, &[1])).collect();
        let plan = plan_spread(&layout, &[2, 1]);
        assert_eq!(
            plan.moves,
            vec![("t".into(), 1, vec![2]), ("t".into(), 3, vec![2])]
        );
        let layout: Vec<_> = (0..3).map(|p| part(p, &[1, 2])).collect();
        let plan = plan_spread(&layout, &[1, 2, 3]);
        assert_eq!(
            plan.moves,
            vec![("t".into(), 1, vec![2, 3]), ("t".into(), 2, vec![3, 1])]
        );
        assert!(plan_spread(&layout, &[]).moves.is_empty());
        let json = plan.to_json();
        assert!(json.contains(r#""replicas":[2,3]"#), "{json}");
    }
}
