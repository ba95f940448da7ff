//! The MOSTO controller (Siracusano et al., JSAC 2017, §III-B, §IV-B):
//! proxies measure their RTTs to each other and report only changes
//! (`POST /v1/accel/rtt`, see `vcdn_accel::rtt`); the controller keeps
//! each service's RTT matrix with the service (so a restart loses
//! nothing), computes all Pareto-optimal chains with
//! `vcdn_policy::chains`, and pushes every proxy the table it looks up
//! (`PUT /chains`): for each slow-start rounds class, the chain from it to
//! the egress. It recomputes on every report that changes the matrix and
//! every [`PERIOD`] (the paper's 5 minutes), which also re-sends tables to
//! proxies that restarted. It is not on the data path: proxies keep their
//! last table while it is down.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use vcdn_policy::chains::{ChainTable, RttMatrix, MAX_ROUNDS};

use crate::control::{Control, ControlError};
use crate::types::*;

/// How often every accelerated service's tables are recomputed and
/// re-sent, reports or not.
pub const PERIOD: Duration = Duration::from_secs(300);

/// The largest RTT a report may carry (a minute: anything above is a
/// broken clock or a lie).
const MAX_REPORTED_MS: f64 = 60_000.0;

/// The bearer token a service's proxies report RTTs with: derived from the
/// service's hop key, so it needs no storage of its own, and a proxy that
/// holds it can only report for its own service.
pub fn report_token(hop_key: &str) -> String {
    let d = Sha256::digest(format!("vcdn-accel-rtt-report\0{hop_key}").as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a reported row differs from the stored one by more than
/// measurement noise: a peer came or went, or an RTT moved by more than
/// max(1 ms, 10 %) (the proxies' own report threshold, applied again so
/// that their periodic full reports do not churn the tables).
fn moved(old: &BTreeMap<String, f64>, new: &BTreeMap<String, f64>) -> bool {
    old.len() != new.len()
        || new.iter().any(|(peer, ms)| {
            old.get(peer)
                .is_none_or(|o| (ms - o).abs() > f64::max(1.0, 0.1 * o))
        })
}

/// One computation and push at a time: two reports arriving together
/// must not let an older table overwrite a newer one at a proxy.
static PUSHING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An RTT report as a proxy sends it.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub service: String,
    pub from: String,
    /// Peer location → RTT in ms; `null` for a peer it cannot reach.
    pub rtt_ms: BTreeMap<String, Option<f64>>,
}

/// The tables for every proxy location of a service, from its RTT matrix;
/// none when nothing was measured yet (proxies then go straight to the
/// egress) or a location has no measured path to the egress.
pub fn tables(a: &AccelGraph) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    if a.rtt_ms.is_empty() {
        return out;
    }
    let mut names: Vec<String> = a
        .proxies
        .iter()
        .filter_map(|p| p.location.clone())
        .collect();
    names.sort();
    names.dedup();
    let Ok(mut m) = RttMatrix::new(names.clone()) else {
        return out;
    };
    // A pair's RTT is what the first of them measured, else what the
    // other one did (the path is the same both ways).
    let measured = |x: &str, y: &str| a.rtt_ms.get(x).and_then(|row| row.get(y)).copied();
    for (i, x) in names.iter().enumerate() {
        for (j, y) in names.iter().enumerate() {
            if i != j {
                if let Some(ms) = measured(x, y).or_else(|| measured(y, x)) {
                    let _ = m.set(i, j, ms);
                }
            }
        }
    }
    let table = ChainTable::build(&m);
    let Some(e) = m.index(&a.egress) else {
        return out;
    };
    for (i, name) in names.iter().enumerate() {
        let mut classes: Vec<(u32, Vec<String>)> = Vec::new();
        for r in 1..=MAX_ROUNDS {
            let chain: Vec<String> = if i == e {
                vec![name.clone()]
            } else {
                match table.lookup_rounds(i, e, r) {
                    Ok(c) => c.nodes.iter().map(|&k| names[k].clone()).collect(),
                    Err(_) => break,
                }
            };
            match classes.last_mut() {
                Some((max, last)) if *last == chain => *max = r,
                _ => classes.push((r, chain)),
            }
        }
        if classes.last().is_some_and(|(max, _)| *max == MAX_ROUNDS) {
            let chains: Vec<Value> = classes
                .into_iter()
                .map(|(max_rounds, chain)| json!({"max_rounds": max_rounds, "chain": chain}))
                .collect();
            out.insert(name.clone(), json!({"egress": a.egress, "chains": chains}));
        }
    }
    out
}

impl Control {
    /// The URL proxies report RTTs to: this control plane's API.
    pub fn controller_url(&self) -> Option<String> {
        self.cfg
            .platform_listeners
            .iter()
            .find(|(_, what)| what == "the control API")
            .map(|(a, _)| {
                let scheme = if self.cfg.api_https { "https" } else { "http" };
                format!("{scheme}://{a}")
            })
    }

    /// Takes a proxy's RTT report: checks its token and content, stores
    /// the row, and when the matrix changed recomputes and pushes the
    /// service's tables.
    pub async fn report_rtt(self: &Arc<Self>, token: &[u8], r: Report) -> Result<(), ControlError> {
        // An unknown service and a wrong token get the same answer (and the
        // same throttle), so the endpoint does not tell which ids exist.
        let unknown =
            || ControlError::Forbidden("this token does not report for this service".into());
        let changed = {
            let mut services = self.services.lock().await;
            let s = services.get_mut(&r.service).ok_or_else(unknown)?;
            if !s.state.live() || s.hop_key.is_empty() {
                return Err(unknown());
            }
            if !vcdn_http::auth::token_eq(token, report_token(&s.hop_key).as_bytes()) {
                return Err(ControlError::Forbidden(
                    "this token does not report for this service".into(),
                ));
            }
            let a = s.graph.accel.as_mut().ok_or_else(unknown)?;
            let locations: Vec<&str> = a
                .proxies
                .iter()
                .filter_map(|p| p.location.as_deref())
                .collect();
            if !locations.contains(&r.from.as_str()) {
                return Err(ControlError::Invalid(format!(
                    "{} is not a proxy location of service {}",
                    r.from, r.service
                )));
            }
            let mut row = BTreeMap::new();
            for (peer, ms) in &r.rtt_ms {
                if peer == &r.from || !locations.contains(&peer.as_str()) {
                    return Err(ControlError::Invalid(format!(
                        "rtt_ms names {peer}, which is not a peer of {}",
                        r.from
                    )));
                }
                match ms {
                    Some(ms) if ms.is_finite() && (0.0..=MAX_REPORTED_MS).contains(ms) => {
                        row.insert(peer.clone(), *ms);
                    }
                    Some(ms) => {
                        return Err(ControlError::Invalid(format!(
                            "rtt_ms[{peer}] = {ms}: an RTT is 0 to {MAX_REPORTED_MS} ms"
                        )))
                    }
                    None => {} // unreachable: no link
                }
            }
            let changed = a.rtt_ms.get(&r.from).is_none_or(|old| moved(old, &row));
            if changed {
                a.rtt_ms.insert(r.from.clone(), row);
                let s = s.clone();
                self.persist(&s).await;
            }
            changed
        };
        if changed {
            let me = self.clone();
            let id = r.service.clone();
            tokio::spawn(async move {
                if let Ok(s) = me.find(&id, None).await {
                    me.push_chains(&s).await;
                }
            });
        }
        Ok(())
    }

    /// Recomputes a service's tables from its stored matrix, records them
    /// (a new version when any changed), and sends each running proxy its
    /// own (`PUT /chains`). Failures are logged: the proxy keeps its last
    /// table and gets the next one at the next change or period.
    pub async fn push_chains(&self, s: &Service) {
        let _one = PUSHING.lock().await;
        // The service as it is now (the caller's copy may predate a report).
        let Ok(s) = self.find(&s.id, None).await else {
            return;
        };
        let s = &s;
        let Some(a) = &s.graph.accel else { return };
        let computed = tables(a);
        if computed.is_empty() {
            return;
        }
        let version = {
            let mut services = self.services.lock().await;
            let Some(live) = services.get_mut(&s.id) else {
                return;
            };
            let Some(la) = live.graph.accel.as_mut() else {
                return;
            };
            if la.chains != computed {
                la.chains = computed.clone();
                la.chains_version += 1;
                let v = la.chains_version;
                let snapshot = live.clone();
                self.persist(&snapshot).await;
                self.event(
                    &s.id,
                    "chains",
                    &format!("chain tables version {v} computed"),
                )
                .await;
                v
            } else {
                la.chains_version
            }
        };
        let auth = format!("Bearer {}", self.instance_token);
        for p in a.proxies.iter().filter(|p| p.serving()) {
            let Some(loc) = p.location.as_deref() else {
                continue;
            };
            let Some(t) = computed.get(loc) else { continue };
            let mut body = t.clone();
            body["version"] = json!(version);
            let r = crate::deployer::instance_request(
                &self.admin,
                p,
                "PUT",
                "/chains",
                &[
                    ("Authorization", &auth),
                    ("Content-Type", "application/json"),
                ],
                body.to_string().as_bytes(),
                Duration::from_secs(2),
            )
            .await;
            match r {
                Ok(r) if (200..300).contains(&r.status()) => {}
                Ok(r) => tracing::warn!(service = %s.id, proxy = %p.id, status = r.status(),
                    "PUT /chains refused: {}", r.text().trim()),
                Err(e) => tracing::warn!(service = %s.id, proxy = %p.id, "PUT /chains: {e}"),
            }
        }
    }
}

/// Recomputes and re-sends every accelerated service's tables every
/// [`PERIOD`].
pub async fn run(c: Arc<Control>) {
    loop {
        tokio::time::sleep(PERIOD).await;
        for s in c.list_services(None).await {
            if s.state.live() && s.graph.accel.is_some() {
                c.push_chains(&s).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(loc: &str) -> Instance {
        serde_json::from_value(json!({
            "id": format!("p-{loc}"), "host": "h", "address": "127.0.0.1:1", "admin": "127.0.0.1:2",
            "vcpus": 1, "memory_mib": 256, "state": "running", "started_at": 0,
            "role": "proxy", "location": loc,
        }))
        .unwrap()
    }

    fn graph(rtts: &[(&str, &str, f64)]) -> AccelGraph {
        let mut a = AccelGraph {
            hostname: "dyn.x".into(),
            egress: "e".into(),
            proxies: vec![proxy("i"), proxy("m"), proxy("e")],
            ..Default::default()
        };
        for (x, y, ms) in rtts {
            a.rtt_ms
                .entry(x.to_string())
                .or_default()
                .insert(y.to_string(), *ms);
        }
        a
    }

    #[test]
    fn splits_long_transfers_and_keeps_short_ones_direct() {
        // i–e 90 ms direct; i–m–e 50 + 50 ms: one round goes direct (45 ms
        // vs 50), many rounds through m (max 50 vs 90 per round).
        let a = graph(&[("i", "e", 90.0), ("i", "m", 50.0), ("m", "e", 50.0)]);
        let t = tables(&a);
        let classes = t["i"]["chains"].as_array().unwrap();
        assert_eq!(classes[0], json!({"max_rounds": 1, "chain": ["i", "e"]}));
        assert_eq!(
            classes.last().unwrap(),
            &json!({"max_rounds": MAX_ROUNDS, "chain": ["i", "m", "e"]})
        );
        assert_eq!(
            t["e"]["chains"],
            json!([{"max_rounds": MAX_ROUNDS, "chain": ["e"]}])
        );
    }

    #[test]
    fn nothing_measured_means_no_table_and_unreachable_egress_no_table_for_it() {
        assert!(tables(&graph(&[])).is_empty());
        let t = tables(&graph(&[("i", "m", 5.0)]));
        assert!(!t.contains_key("i") && !t.contains_key("m"));
        assert!(t.contains_key("e"));
    }

    #[test]
    fn noise_within_the_threshold_is_not_a_change() {
        let row = |v: &[(&str, f64)]| v.iter().map(|(k, ms)| (k.to_string(), *ms)).collect();
        let old = row(&[("a", 0.05), ("b", 40.0)]);
        assert!(!moved(&old, &row(&[("a", 0.4), ("b", 43.9)])));
        assert!(moved(&old, &row(&[("a", 0.05), ("b", 44.5)])));
        assert!(moved(&old, &row(&[("a", 0.05)])));
    }

    #[test]
    fn the_report_token_is_per_service() {
        assert_ne!(report_token("a"), report_token("b"));
        assert_eq!(report_token("a").len(), 64);
    }
}
