//! The datasink layer: a real Apache Kafka (4.3.1, KRaft, no ZooKeeper) run as
//! child JVM processes, and Rust clients on `rdkafka` (librdkafka 2.12,
//! statically built).
//!
//! * [`KafkaDist`] finds the distribution that `scripts/kafka.sh` fetched.
//! * [`broker`] starts, stops and restarts a broker (datasink master:
//!   controller + broker; datasink slave: broker joining the master's quorum).
//! * [`Producer`] never blocks its caller (the cache's serving threads call
//!   it); a full buffer is a counted error.
//! * [`Consumer`] is a consumer group member that resumes from committed
//!   offsets (at-least-once).
//! * [`Admin`] creates topics, lists brokers and spreads partitions over every
//!   broker after a slave joined (CLUSTER_RESIZE).
//!
//! Every client can be re-pointed to new bootstrap servers (RECONFIG).

pub mod admin;
pub mod broker;
pub mod consumer;
mod dist;
pub mod producer;

pub use admin::{Admin, AdminError, BrokerInfo, PartitionLayout, Reassignment, TopicSpec};
pub use broker::{Broker, BrokerError, BrokerRole, BrokerSpec};
pub use consumer::{ConsumeError, Consumer, ConsumerOptions, Record};
pub use dist::{DistError, KafkaDist, KAFKA_VERSION};
pub use producer::{Acks, Producer, ProducerCounters, ProducerOptions, SendError};

#[cfg(test)]
mod tests {
    /// The producer is shared by the cache's serving threads; the rest move
    /// into tasks.
    #[test]
    fn clients_can_be_shared_and_moved() {
        fn shared<T: Send + Sync>() {}
        fn moved<T: Send>() {}
        shared::<super::Producer>();
        shared::<super::Admin>();
        moved::<super::Consumer>();
        moved::<super::Broker>();
    }
}
