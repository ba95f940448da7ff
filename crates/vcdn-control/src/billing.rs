//! Billing through the Kafka data sink (issue 19, point 5: "billing through
//! the Kafka path with acks from all replicas").
//!
//! With `vcdn up --kafka` the caches' `edge.stats` records also go to
//! Kafka (their producers use `acks=all` and are idempotent), and this
//! module bills them **on arrival**, in place of the supervisor's sampling:
//!
//! - A consumer group with a stable id ([`GROUP`]) reads `edge.stats`; a
//!   restarted control plane resumes from the group's committed offsets.
//! - Each record is checked with [`record::open`] (MAC under the
//!   deployment's key). Its counters are cumulative per incarnation, so its
//!   contribution is the increase over the instance's [`Cursor`]: the
//!   incarnation, sequence number and counters last billed. A record at or
//!   below the cursor (a duplicate, a late one, one delivered again after a
//!   restart) adds nothing; a record of a later incarnation (a restarted
//!   cache) bills all its counters.
//! - **Exactly once across a restart.** The cursors live in the service's
//!   own stored document ([`crate::types::Service::billing`]), so the
//!   usage and the cursors that produced it are written by one `put`, and
//!   the consumed offsets are committed only after that write. Kafka's
//!   at-least-once redelivery then meets a cursor that already covers what
//!   was billed: nothing is counted twice, and nothing is lost because an
//!   offset is never committed before its usage is stored. The write is
//!   made with the services locked, so it never stores an older document
//!   than the one in memory (and undoes no other change).
//! - Caches that booted before Kafka billing of their service began (a
//!   data directory billed by sampling before `--kafka`) start from a
//!   baseline: what they published before is not billed again
//!   ([`cursor_for`], [`crate::types::Service::billing_from_ms`]).
//! - Records of instances removed since (scale-in, replacement) are still
//!   billed to their service while its cursor is kept: for [`KEEP_REMOVED`]
//!   after the instance's last billed record, so the map stays bounded.
//! - While Kafka billing runs, the supervisor's `observe` counts no
//!   requests or bytes of caches (vCPU-seconds and proxies stay there), so
//!   a record that arrives both over p2p and Kafka is billed once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vcdn_telemetry::envelope::Reject;
use vcdn_telemetry::kafka::{Consumer, ConsumerOptions};
use vcdn_telemetry::keys::Keyring;
use vcdn_telemetry::record::{self, Record, TOPIC_EDGE_STATS};

use crate::control::{now_ms, Control};

/// The consumer group: stable, so a restarted control plane resumes from
/// what the previous one committed.
pub const GROUP: &str = "vcdn-billing";

/// How long the cursor of an instance that left its service's graph is
/// kept (its records may still be on the way, or be delivered again).
pub const KEEP_REMOVED: Duration = Duration::from_secs(3600);

/// At most this many records are billed per stored write; a batch also
/// ends after [`BATCH_WINDOW`].
const BATCH_MAX: usize = 2000;
const BATCH_WINDOW: Duration = Duration::from_millis(50);

/// What was billed last of one instance.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Cursor {
    /// The cache's incarnation (`boot_ms`) and the record's sequence number.
    pub inc: u64,
    pub seq: u64,
    /// The cumulative counters of that record.
    pub requests: u64,
    pub bytes: u64,
    /// When it was billed (milliseconds since the epoch): a removed
    /// instance's cursor is dropped [`KEEP_REMOVED`] after.
    pub at_ms: u64,
}

/// The cumulative (requests, bytes) of an `edge.stats` record (the cache's
/// `/stats` document).
pub fn counters(data: &serde_json::Value) -> (u64, u64) {
    let requests = data["requests"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(|x| x.as_u64()).sum());
    (requests, data["body_bytes_sent"].as_u64().unwrap_or(0))
}

pub(crate) fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The cursor a record is billed against: the instance's, else, for a
/// cache that booted before Kafka billing of its service began (`from_ms`,
/// see [`crate::types::Service::billing_from_ms`]; sampling billed it until
/// then), a baseline at this record, so that only what follows it is new.
pub fn cursor_for(held: Option<&Cursor>, r: &Record, from_ms: u64, now_ms: u64) -> Option<Cursor> {
    if let Some(c) = held {
        return Some(*c);
    }
    (r.inc < from_ms).then(|| {
        let (requests, bytes) = counters(&r.data);
        Cursor {
            inc: r.inc,
            seq: r.seq.saturating_sub(1),
            requests,
            bytes,
            at_ms: now_ms,
        }
    })
}

/// What `r` adds to the usage given the instance's cursor, and the new
/// cursor; `None` when it is at or below the cursor (already billed).
pub fn bill(cursor: Option<&Cursor>, r: &Record, now_ms: u64) -> Option<((u64, u64), Cursor)> {
    let (requests, bytes) = counters(&r.data);
    let (base_r, base_b) = match cursor {
        Some(c) if (r.inc, r.seq) <= (c.inc, c.seq) => return None,
        // The same incarnation: counters only grow (a lower one would be a
        // cache bug; it adds nothing and does not lower the cursor).
        Some(c) if r.inc == c.inc => (c.requests, c.bytes),
        // A later incarnation, or the first record: all of it is new.
        _ => (0, 0),
    };
    let next = Cursor {
        inc: r.inc,
        seq: r.seq,
        requests: requests.max(base_r),
        bytes: bytes.max(base_b),
        at_ms: now_ms,
    };
    Some((
        (
            requests.saturating_sub(base_r),
            bytes.saturating_sub(base_b),
        ),
        next,
    ))
}

/// What became of the records consumed (for `/metrics`).
#[derive(Default)]
pub struct BillingCounters {
    /// Added to a service's usage.
    pub billed: AtomicU64,
    /// At or below the instance's cursor: delivered again, duplicated, late.
    pub already_billed: AtomicU64,
    /// A source that is no instance of a service (nor one removed within
    /// [`KEEP_REMOVED`]).
    pub unknown_instance: AtomicU64,
    pub bad_mac: AtomicU64,
    pub unknown_key: AtomicU64,
    pub malformed: AtomicU64,
    /// Batches whose usage was stored and whose offsets were committed.
    pub commits: AtomicU64,
    /// Stored writes or commits that failed (the batch comes again).
    pub errors: AtomicU64,
}

impl BillingCounters {
    /// Prometheus lines.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP vcdn_control_billing_records_total edge.stats records consumed for billing, by path and what became of them.\n# TYPE vcdn_control_billing_records_total counter"
        );
        for (result, v) in [
            ("billed", &self.billed),
            ("already_billed", &self.already_billed),
            ("unknown_instance", &self.unknown_instance),
            ("bad_mac", &self.bad_mac),
            ("unknown_key", &self.unknown_key),
            ("malformed", &self.malformed),
        ] {
            let _ = writeln!(
                out,
                "vcdn_control_billing_records_total{{via=\"kafka\",result=\"{result}\"}} {}",
                v.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# TYPE vcdn_control_billing_commits_total counter\nvcdn_control_billing_commits_total {}\n# TYPE vcdn_control_billing_errors_total counter\nvcdn_control_billing_errors_total {}",
            self.commits.load(Relaxed),
            self.errors.load(Relaxed)
        );
    }

    fn rejected(&self, r: Reject) {
        match r {
            Reject::BadMac => &self.bad_mac,
            Reject::UnknownKey => &self.unknown_key,
            _ => &self.malformed,
        }
        .fetch_add(1, Relaxed);
    }
}

/// Kafka billing of one control plane: where the sink is, the keys, and
/// the counters.
pub struct KafkaBilling {
    pub bootstrap: String,
    pub keys: Arc<Keyring>,
    pub counters: BillingCounters,
}

impl std::fmt::Debug for KafkaBilling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaBilling")
            .field("bootstrap", &self.bootstrap)
            .finish_non_exhaustive()
    }
}

/// Consumes `edge.stats` from the sink and bills it, until the control
/// plane is dropped. A consumer that fails is made again after a second.
pub async fn run(c: std::sync::Weak<Control>) {
    loop {
        let Some(control) = c.upgrade() else { return };
        let Some(b) = control.cfg.kafka_billing.clone() else {
            return;
        };
        drop(control);
        let mut options = ConsumerOptions::new(GROUP);
        options.client_id = "vcdn-billing".into();
        // Offsets are committed only after the usage they produced is
        // stored (see the module doc), never on a timer.
        options
            .extra
            .push(("enable.auto.commit".into(), "false".into()));
        let consumer = match Consumer::new(&b.bootstrap, &[TOPIC_EDGE_STATS], options) {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "billing: cannot make the Kafka consumer");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        tracing::info!(bootstrap = %b.bootstrap, group = GROUP, "billing: Kafka consumer joined");
        match consume(&c, &b, consumer).await {
            Ok(()) => return,
            Err(e) => {
                b.counters.errors.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, "billing: the Kafka consumer failed; joining again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Batches: the records that came within [`BATCH_WINDOW`] of the first are
/// billed, the touched services stored, then the offsets committed.
async fn consume(
    c: &std::sync::Weak<Control>,
    b: &KafkaBilling,
    mut consumer: Consumer,
) -> Result<(), String> {
    let mut dirty = HashSet::new();
    loop {
        let first = consumer.recv().await.map_err(|e| e.to_string())?;
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + BATCH_WINDOW;
        while batch.len() < BATCH_MAX {
            match tokio::time::timeout_at(until, consumer.recv()).await {
                Ok(r) => batch.push(r.map_err(|e| e.to_string())?),
                Err(_) => break,
            }
        }
        let Some(control) = c.upgrade() else {
            return Ok(());
        };
        let records: Vec<Record> = batch
            .iter()
            .filter_map(|m| match record::open(&b.keys, &m.payload) {
                Ok(r) => Some(r),
                Err(e) => {
                    b.counters.rejected(e);
                    None
                }
            })
            .collect();
        // The freshest view also takes what came by Kafka (scaling and
        // liveness use whichever path is faster).
        if let Some(t) = &control.cfg.telemetry {
            for m in &batch {
                t.offer_via(TOPIC_EDGE_STATS, &m.payload, crate::telemetry::Via::Kafka);
            }
        }
        if !control
            .bill_records(&records, &b.counters, &mut dirty)
            .await
        {
            b.counters.errors.fetch_add(1, Relaxed);
            // Not stored: nothing is committed; the records come again
            // after a restart and the stored cursors sort them out.
            continue;
        }
        drop(control);
        // `commit` blocks until the broker answers.
        let (k, r) = tokio::task::spawn_blocking(move || {
            let r = consumer.commit();
            (consumer, r)
        })
        .await
        .map_err(|e| e.to_string())?;
        consumer = k;
        match r {
            Ok(()) => {
                b.counters.commits.fetch_add(1, Relaxed);
            }
            Err(e) => {
                // The usage is stored with its cursors: records delivered
                // again are recognised; the next commit covers these.
                b.counters.errors.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, "billing: offset commit failed");
            }
        }
    }
}

impl Control {
    /// Bills `records` into their services' usage and cursors, and stores
    /// every service touched (and those in `dirty`, whose write failed
    /// before; failures are left there). Says whether every service billed
    /// so far is stored: only then may the offsets be committed.
    pub(crate) async fn bill_records(
        &self,
        records: &[Record],
        n: &BillingCounters,
        dirty: &mut HashSet<String>,
    ) -> bool {
        let now = now_ms();
        let keep_ms = KEEP_REMOVED.as_millis() as u64;
        {
            let mut services = self.services.lock().await;
            // Which service each source bills to: instances of its graph,
            // then instances removed whose cursor is still kept.
            let mut owner: HashMap<String, String> = HashMap::new();
            for s in services.values() {
                for id in s.billing.keys() {
                    owner.insert(id.clone(), s.id.clone());
                }
            }
            for s in services.values() {
                for i in s.graph.instances() {
                    owner.insert(i.id.clone(), s.id.clone());
                }
            }
            let mut touched = HashSet::new();
            for r in records {
                let Some(sid) = owner.get(&r.source) else {
                    n.unknown_instance.fetch_add(1, Relaxed);
                    continue;
                };
                let Some(s) = services.get_mut(sid) else {
                    n.unknown_instance.fetch_add(1, Relaxed);
                    continue;
                };
                if s.billing_from_ms == 0 {
                    // The first record billed here: was anything billed
                    // by sampling before?
                    s.billing_from_ms = if s.usage.requests == 0 && s.usage.bytes == 0 {
                        1
                    } else {
                        now
                    };
                }
                let held = cursor_for(s.billing.get(&r.source), r, s.billing_from_ms, now);
                match bill(held.as_ref(), r, now) {
                    Some(((dr, db), cursor)) => {
                        // Published before Kafka billing began: sampling
                        // billed it; the cursor moves on only.
                        if r.ts >= s.billing_from_ms {
                            s.usage.requests = s.usage.requests.saturating_add(dr);
                            s.usage.bytes = s.usage.bytes.saturating_add(db);
                        }
                        s.billing.insert(r.source.clone(), cursor);
                        touched.insert(sid.clone());
                        n.billed.fetch_add(1, Relaxed);
                    }
                    None => {
                        n.already_billed.fetch_add(1, Relaxed);
                    }
                }
            }
            // Written while the services are locked: this write is never
            // older than the document in memory, so it cannot undo another
            // change (a graph grown meanwhile). Services whose write failed
            // before are written again.
            touched.extend(dirty.drain());
            for sid in touched {
                let Some(s) = services.get_mut(&sid) else {
                    continue;
                };
                let live: HashSet<String> = s.graph.instances().map(|i| i.id.clone()).collect();
                prune(&mut s.billing, &live, now, keep_ms);
                if let Err(e) = self.store.put("service", &s.id, &*s).await {
                    tracing::error!(service = %s.id, error = %e, "billing: cannot store the usage");
                    dirty.insert(sid);
                }
            }
        }
        dirty.is_empty()
    }
}

/// Drops the cursors of instances no longer in the graph whose last record
/// was billed more than `keep_ms` ago.
fn prune(billing: &mut BTreeMap<String, Cursor>, live: &HashSet<String>, now: u64, keep_ms: u64) {
    billing.retain(|id, c| live.contains(id) || now.saturating_sub(c.at_ms) <= keep_ms);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(inc: u64, seq: u64, requests: u64, bytes: u64) -> Record {
        Record {
            source: "i-1".into(),
            service: None,
            inc,
            seq,
            ts: 0,
            data: serde_json::json!({"requests": {"HIT": requests}, "body_bytes_sent": bytes}),
        }
    }

    /// Bills a sequence of deliveries (what Kafka may hand over: repeats,
    /// late ones, a restart) from `cursor`; returns the total and the cursor.
    fn run(mut cursor: Option<Cursor>, rs: &[Record]) -> ((u64, u64), Option<Cursor>) {
        let mut total = (0, 0);
        for r in rs {
            if let Some(((dr, db), c)) = bill(cursor.as_ref(), r, 1) {
                total = (total.0 + dr, total.1 + db);
                cursor = Some(c);
            }
        }
        (total, cursor)
    }

    #[test]
    fn each_increase_is_billed_once_whatever_is_delivered_again() {
        let rs = [rec(10, 1, 5, 500), rec(10, 2, 8, 800), rec(10, 3, 8, 800)];
        let (total, cursor) = run(None, &rs);
        assert_eq!(total, (8, 800));
        // Everything delivered again (a restart resuming from an older
        // offset) on the stored cursor: nothing more.
        let (again, _) = run(cursor, &rs);
        assert_eq!(again, (0, 0));
        // A late record and a later one.
        let (more, cursor) = run(cursor, &[rec(10, 2, 8, 800), rec(10, 4, 11, 1100)]);
        assert_eq!(more, (3, 300));
        // A restarted cache: its counters start over and are all new; the
        // old incarnation's stragglers add nothing.
        let (after, _) = run(
            cursor,
            &[rec(20, 1, 2, 200), rec(10, 9, 99, 9900), rec(20, 2, 4, 400)],
        );
        assert_eq!(after, (4, 400));
    }

    #[test]
    fn a_lost_record_costs_nothing_and_counters_never_go_back() {
        // Records 2 and 3 lost: 4 carries their increase.
        let (total, _) = run(None, &[rec(1, 1, 1, 10), rec(1, 4, 7, 70)]);
        assert_eq!(total, (7, 70));
        // A forged-looking decrease in the same incarnation bills nothing
        // and keeps the cursor's counters.
        let (total, c) = run(
            None,
            &[rec(1, 1, 9, 90), rec(1, 2, 3, 30), rec(1, 3, 10, 100)],
        );
        assert_eq!(total, (10, 100));
        assert_eq!(c.unwrap().requests, 10);
    }

    #[test]
    fn caches_billed_by_sampling_before_start_from_a_baseline() {
        // Kafka billing began at 100; a cache booted at 50 was sampled
        // until then: its first record is the baseline.
        let first = rec(50, 7, 30, 3000);
        let c = cursor_for(None, &first, 100, 1);
        let (total, _) = run(c, &[first.clone(), rec(50, 8, 32, 3200)]);
        assert_eq!(total, (2, 200));
        // One booted after (or a service nothing was billed of: from 1)
        // bills all its counters.
        let later = rec(150, 1, 4, 400);
        assert_eq!(cursor_for(None, &later, 100, 1), None);
        assert_eq!(cursor_for(None, &first, 1, 1), None);
        // A held cursor is the cursor.
        let held = Cursor::default();
        assert_eq!(cursor_for(Some(&held), &first, 100, 1), Some(held));
    }

    #[test]
    fn removed_instances_are_kept_for_an_hour() {
        let c = |at_ms| Cursor {
            at_ms,
            ..Cursor::default()
        };
        let mut m = BTreeMap::from([
            ("live".to_string(), c(0)),
            ("gone-recently".to_string(), c(9_000)),
            ("gone-long-ago".to_string(), c(1_000)),
        ]);
        prune(&mut m, &HashSet::from(["live".to_string()]), 10_000, 5_000);
        assert_eq!(
            m.keys().collect::<Vec<_>>(),
            ["gone-recently", "live"],
            "{m:?}"
        );
    }
}
