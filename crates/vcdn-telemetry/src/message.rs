//! The discovery protocol's messages: the thesis's ten types (§3.3) and a
//! BYE, each in the versioned envelope of `docs/telemetry-protocol.md`.
//!
//! The body is JSON, as in the thesis, so an operator can read a capture;
//! what authenticates it is the binary frame around it ([`crate::envelope`]),
//! computed over the exact bytes, so no canonical JSON is needed.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

/// The protocol version this code speaks (`v` in every message).
pub const VERSION: u32 = 1;

/// Limits on what one message may carry (on top of the datagram's size).
pub const MAX_NAME: usize = 128;
pub const MAX_TOPICS: usize = 32;
pub const MAX_DESTINATIONS: usize = 64;
pub const MAX_ROLES: usize = 8;

/// What a node does (§3.2). A node may hold several roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Runs the Kafka controller and a broker; answers HELLOs.
    Datasink,
    /// Runs one more Kafka broker, joined to the master's cluster.
    DatasinkSlave,
    /// Relays local ports to Kafka topics.
    Producer,
    /// Relays Kafka topics to local ports.
    Consumer,
    /// Producer and consumer (an aggregator).
    Hybrid,
    /// Keeps who publishes and who subscribes what, in peer-to-peer mode.
    Tracker,
    /// Sends each datum straight to the consumers the tracker names.
    P2pProducer,
    /// Tells the tracker where it wants each topic delivered.
    P2pConsumer,
}

impl Role {
    /// Whether this role needs the data sink's configuration.
    pub fn follows_sink(self) -> bool {
        matches!(
            self,
            Role::Producer | Role::Consumer | Role::Hybrid | Role::DatasinkSlave
        )
    }

    /// Whether this role needs the tracker's configuration.
    pub fn follows_tracker(self) -> bool {
        matches!(self, Role::P2pProducer | Role::P2pConsumer)
    }
}

/// Which authority a message is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthorityKind {
    Datasink,
    Tracker,
}

/// What an authority tells the nodes about itself. Clients follow the
/// authority of a kind with the highest `(epoch, node)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authority {
    /// Strictly increasing across the authority's restarts and takeovers
    /// (milliseconds since the Unix epoch at which it took over, or one
    /// more than the highest epoch it has seen).
    pub epoch: u64,
    /// Kafka's bootstrap servers (`host:port,…`): the data sink only. Kafka
    /// 4 has no ZooKeeper, so this replaces the thesis's ZooKeeper address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<String>,
    /// The Kafka cluster id a slave must format its storage with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// The Kafka controller a slave broker registers with (`host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<String>,
    /// How many times the cluster was resized (CLUSTER_RESIZE); clients
    /// refresh their metadata when it grows.
    #[serde(default)]
    pub generation: u64,
}

/// A p2p consumer's wish: this topic, delivered to this UDP port (of the
/// address the SUBSCRIBE came from, or `host` when given).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Subscription {
    pub topic: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<IpAddr>,
}

/// A topic's full destination set as the tracker last computed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Have {
    pub topic: String,
    pub epoch: u64,
    pub version: u64,
}

/// The message types. The wire names are the thesis prototype's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Body {
    /// Broadcast by every node until it is configured.
    #[serde(rename = "hello")]
    Hello {
        roles: Vec<Role>,
        #[serde(default)]
        publish: Vec<String>,
        #[serde(default)]
        subscribe: Vec<Subscription>,
    },
    /// The data sink's unicast answer to a HELLO; `broker_id` for a slave.
    #[serde(rename = "config")]
    Config {
        authority: Authority,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        broker_id: Option<u32>,
    },
    /// Broadcast by the data sink when it starts and then every beacon
    /// interval.
    #[serde(rename = "reconfig")]
    Reconfig { authority: Authority },
    /// A slave whose broker runs, to the data sink (repeated until the
    /// CLUSTER_RESIZE that names it).
    #[serde(rename = "regslave")]
    RegisterSlave { broker_id: u32, listener: String },
    /// Broadcast by the data sink after partitions were reassigned.
    #[serde(rename = "clusterresize")]
    ClusterResize {
        authority: Authority,
        brokers: Vec<u32>,
    },
    /// The tracker's unicast answer to a p2p node's HELLO.
    #[serde(rename = "tracker-config")]
    TrackerConfig { authority: Authority },
    /// Broadcast by the tracker when it starts and every beacon interval.
    #[serde(rename = "tracker-reconfig")]
    TrackerReconfig { authority: Authority },
    /// A p2p producer's topics, renewed every lease interval; `have` lists
    /// the destination sets it holds, so the tracker resends what differs.
    #[serde(rename = "publish")]
    Publish {
        topics: Vec<String>,
        lease_ms: u32,
        #[serde(default)]
        have: Vec<Have>,
    },
    /// A p2p consumer's topic→port wishes, renewed every lease interval.
    #[serde(rename = "subscribe")]
    Subscribe {
        subscriptions: Vec<Subscription>,
        lease_ms: u32,
    },
    /// The tracker to a producer: the full destination set of a topic
    /// (replaces the last one with a lower `(epoch, version)`).
    #[serde(rename = "newdest")]
    NewDestination {
        topic: String,
        epoch: u64,
        version: u64,
        dests: Vec<SocketAddr>,
    },
    /// A node leaving cleanly (to its authorities), or an authority
    /// stepping down (broadcast).
    #[serde(rename = "bye")]
    Bye { roles: Vec<Role> },
}

impl Body {
    /// The wire name, for logs and metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Body::Hello { .. } => "hello",
            Body::Config { .. } => "config",
            Body::Reconfig { .. } => "reconfig",
            Body::RegisterSlave { .. } => "regslave",
            Body::ClusterResize { .. } => "clusterresize",
            Body::TrackerConfig { .. } => "tracker-config",
            Body::TrackerReconfig { .. } => "tracker-reconfig",
            Body::Publish { .. } => "publish",
            Body::Subscribe { .. } => "subscribe",
            Body::NewDestination { .. } => "newdest",
            Body::Bye { .. } => "bye",
        }
    }

    /// Whether only an authority may send it: then it must carry an
    /// authority signature, not only the MAC every node can make.
    pub fn needs_authority(&self) -> bool {
        matches!(
            self,
            Body::Config { .. }
                | Body::Reconfig { .. }
                | Body::ClusterResize { .. }
                | Body::TrackerConfig { .. }
                | Body::TrackerReconfig { .. }
                | Body::NewDestination { .. }
        )
    }

    /// Checks the counts and sizes a message may carry.
    pub fn validate(&self) -> Result<(), String> {
        let name = |s: &str| -> Result<(), String> {
            if s.is_empty() || s.len() > MAX_NAME || s.bytes().any(|b| b.is_ascii_control()) {
                Err(format!(
                    "bad name {:?}",
                    s.chars().take(40).collect::<String>()
                ))
            } else {
                Ok(())
            }
        };
        let topics = |t: &[String]| -> Result<(), String> {
            if t.len() > MAX_TOPICS {
                return Err(format!("{} topics, at most {MAX_TOPICS}", t.len()));
            }
            t.iter().try_for_each(|s| name(s))
        };
        let subs = |s: &[Subscription]| -> Result<(), String> {
            if s.len() > MAX_TOPICS {
                return Err(format!("{} subscriptions, at most {MAX_TOPICS}", s.len()));
            }
            s.iter().try_for_each(|s| name(&s.topic))
        };
        let authority = |a: &Authority| -> Result<(), String> {
            for s in [&a.bootstrap, &a.cluster_id, &a.controller]
                .into_iter()
                .flatten()
            {
                if s.len() > 1024 {
                    return Err("authority field too long".into());
                }
            }
            Ok(())
        };
        match self {
            Body::Hello {
                roles,
                publish,
                subscribe,
            } => {
                if roles.len() > MAX_ROLES {
                    return Err("too many roles".into());
                }
                topics(publish)?;
                subs(subscribe)
            }
            Body::Config { authority: a, .. }
            | Body::Reconfig { authority: a }
            | Body::TrackerConfig { authority: a }
            | Body::TrackerReconfig { authority: a } => authority(a),
            Body::ClusterResize {
                authority: a,
                brokers,
            } => {
                if brokers.len() > 256 {
                    return Err("too many brokers".into());
                }
                authority(a)
            }
            Body::RegisterSlave { listener, .. } => name(listener),
            Body::Publish {
                topics: t, have, ..
            } => {
                topics(t)?;
                if have.len() > MAX_TOPICS {
                    return Err("too many destination sets".into());
                }
                have.iter().try_for_each(|h| name(&h.topic))
            }
            Body::Subscribe { subscriptions, .. } => subs(subscriptions),
            Body::NewDestination { topic, dests, .. } => {
                if dests.len() > MAX_DESTINATIONS {
                    return Err(format!(
                        "{} destinations, at most {MAX_DESTINATIONS}",
                        dests.len()
                    ));
                }
                name(topic)
            }
            Body::Bye { roles } => {
                if roles.len() > MAX_ROLES {
                    return Err("too many roles".into());
                }
                Ok(())
            }
        }
    }
}

/// One message: the envelope's fields and the body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Protocol version.
    pub v: u32,
    /// The sender's node id: stable for an instance (its instance id), never
    /// inferred from the source address (on one host all are 127.0.0.1).
    pub node: String,
    /// The sender's boot incarnation: larger at every start of the node.
    pub inc: u64,
    /// Per-incarnation sequence number, increasing with every message.
    pub seq: u64,
    /// Send time, milliseconds since the Unix epoch.
    pub ts: u64,
    /// The sender's unicast port (its address is the datagram's source).
    pub port: u16,
    #[serde(flatten)]
    pub body: Body,
}

/// Whether `s` is a valid node id: 1–64 of `[A-Za-z0-9._:-]`.
pub fn valid_node_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b':'))
}
