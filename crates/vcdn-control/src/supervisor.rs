//! The supervisor (the paper's instance manager): every tick it replaces
//! crashed instances; every ten ticks it starts and ends leases, reads
//! every instance's load and usage, and scales elastic services; every
//! hundred ticks it makes the router's services match the store's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vcdn_policy::autoscale::Decision;

use crate::control::{fmt_pid, now_s, random_hex, Control, ControlError};
use crate::deployer;
use crate::planner::{self, Fleet};
use crate::pricing;
use crate::timeseries::Accumulator;
use crate::types::*;

/// Polls (1 s apart, 1 s timeout each) an instance may miss before it is
/// taken for hung and replaced: an overloaded cache answers late, and
/// restarting it would only make things worse; a crash is seen at once.
const UNRESPONSIVE_POLLS: u32 = 30;

/// Between samples, the supervisor reacts to telemetry records this
/// fresh only (three of a cache's 100 ms intervals).
const REACT_FRESH: Duration = Duration::from_millis(300);

/// Players' reported MOS counts this long after their last report.
const REPORTED_MOS_FRESH: Duration = Duration::from_secs(30);

/// No scale-in this soon after a scale-out in the same region.
const SCALE_IN_AFTER_OUT: Duration = Duration::from_secs(30);

/// Longest time a scaled-in instance keeps serving its viewers.
const DRAIN: Duration = Duration::from_secs(60);

/// An instance that ran this long after a launch is taken for healthy:
/// its next crash is relaunched at once.
const STABLE: Duration = Duration::from_secs(10);

/// Wait before the first relaunch of an instance that keeps failing; it
/// doubles with each failure in a row up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The relaunches of one instance (supervisor bookkeeping, not stored).
#[derive(Debug, Clone)]
pub(crate) struct Relaunch {
    /// Launches in a row that failed or did not last [`STABLE`].
    failures: u32,
    /// When the instance was last launched (or tried).
    last: Instant,
    /// The failure count last reported in an event.
    reported: u32,
    /// The process that was found gone, kept while relaunches fail (a
    /// failed launch clears the instance's pid) so that the `healed` event
    /// names the process it replaced.
    gone: Option<u32>,
}

/// How long to wait after the last launch before launch number
/// `failures + 1` of an instance that failed `failures` times in a row.
pub(crate) fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    BACKOFF_FIRST
        .saturating_mul(1u32 << (failures - 1).min(16))
        .min(BACKOFF_MAX)
}

pub async fn run(c: Arc<Control>) {
    let mut tick = tokio::time::interval(c.cfg.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    let mut last = Instant::now();
    loop {
        tick.tick().await;
        c.heal().await;
        if n.is_multiple_of(10) {
            c.leases().await;
            let dt = last.elapsed();
            last = Instant::now();
            c.observe(dt).await;
        } else {
            c.react().await;
        }
        if n.is_multiple_of(100) {
            c.reconcile_router().await;
        }
        n += 1;
    }
}

impl Control {
    /// Desired state (the store's live services) against actual state (the
    /// router's services): puts what differs or is missing, drops what
    /// should not be there.
    pub async fn reconcile_router(&self) {
        let actual = match self.cfg.router.list().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the router's services");
                return;
            }
        };
        let desired: Vec<Service> = self
            .list_services(None)
            .await
            .into_iter()
            .filter(|s| matches!(s.state, ServiceState::Active | ServiceState::Degraded))
            .collect();
        for s in &desired {
            let want = deployer::router_service(s);
            if !actual.contains(&want) {
                tracing::warn!(service = %s.id, "router out of date; re-applying");
                if let Err(e) = self.cfg.router.put(s).await {
                    tracing::error!(service = %s.id, error = %e, "cannot configure the router");
                }
            }
        }
        for a in actual
            .iter()
            .filter(|a| !desired.iter().any(|s| s.id == a.name))
        {
            tracing::warn!(service = %a.name, "router has a service that is not live; removing");
            let _ = self.cfg.router.delete(&a.name).await;
        }
    }

    /// Replaces crashed instances; returns how many. An instance that
    /// keeps failing (it cannot start, or dies soon after starting) is
    /// relaunched after a wait that doubles each time, with an event.
    pub async fn heal(&self) -> usize {
        let mut healed = Vec::new();
        let mut events = Vec::new();
        let mut failed = Vec::new();
        {
            let mut services = self.services.lock().await;
            for s in services
                .values_mut()
                .filter(|s| matches!(s.state, ServiceState::Active | ServiceState::Degraded))
            {
                let snapshot = s.clone();
                for i in s.graph.instances_mut() {
                    if i.state == InstanceState::Draining
                        || self.vim.alive(&i.id, i.pid, &i.identity())
                    {
                        continue;
                    }
                    s.state = ServiceState::Degraded;
                    let now = Instant::now();
                    let previous = self
                        .runtime
                        .lock()
                        .get(&s.id)
                        .and_then(|rt| rt.relaunch.get(&i.id).cloned());
                    let (failures, reported) = match &previous {
                        Some(p) if now.duration_since(p.last) < STABLE => {
                            (p.failures + 1, p.reported)
                        }
                        _ => (0, 0),
                    };
                    let due = previous
                        .as_ref()
                        .map_or(now, |p| p.last + backoff(failures));
                    if now < due {
                        if failures > reported {
                            self.note_relaunch(&s.id, &i.id, |r| r.reported = failures);
                            events.push((s.id.clone(), "relaunch_failed", format!(
                                "instance {} exited {:.1} s after its launch ({failures} failures in a row); next attempt in {:.1} s",
                                i.id,
                                previous.as_ref().map_or(0.0, |p| now.duration_since(p.last).as_secs_f64()),
                                due.duration_since(now).as_secs_f64()
                            )));
                        }
                        continue;
                    }
                    let old = i.pid.or(previous.as_ref().and_then(|p| p.gone));
                    let record = Relaunch {
                        failures,
                        last: now,
                        reported,
                        gone: old,
                    };
                    self.runtime
                        .lock()
                        .entry(s.id.clone())
                        .or_default()
                        .relaunch
                        .insert(i.id.clone(), record);
                    match self.launch(&snapshot, i) {
                        Ok(()) => healed.push((s.id.clone(), i.clone(), old, now)),
                        Err(e) => {
                            tracing::error!(service = %s.id, instance = %i.id, error = %e, "cannot replace instance");
                            let was = i.state;
                            i.state = InstanceState::Failed;
                            i.pid = None;
                            if was != InstanceState::Failed {
                                failed.push(s.id.clone());
                            }
                            self.note_relaunch(&s.id, &i.id, |r| r.reported = failures + 1);
                            events.push((
                                s.id.clone(),
                                "relaunch_failed",
                                format!(
                                    "instance {}: {e}; next attempt in {:.1} s",
                                    i.id,
                                    backoff(failures + 1).as_secs_f64()
                                ),
                            ));
                        }
                    }
                }
            }
        }
        for (sid, kind, detail) in events {
            self.event(&sid, kind, &detail).await;
        }
        failed.dedup();
        for sid in failed {
            // Out of the router: whatever answers on its address is not it.
            if let Ok(s) = self.find(&sid, None).await {
                self.persist(&s).await;
                if let Err(e) = self.cfg.router.put(&s).await {
                    tracing::warn!(service = %sid, error = %e, "router update failed");
                }
            }
        }
        let n = healed.len();
        for (sid, i, old, t0) in healed {
            self.metrics.healed.fetch_add(1, Ordering::Relaxed);
            let ready = self.wait_started(&sid, std::slice::from_ref(&i)).await;
            let ms = t0.elapsed().as_secs_f64() * 1000.0;
            self.settle(&sid).await;
            if let Ok(s) = self.find(&sid, None).await {
                if i.role == Role::Proxy && ready.is_ok() {
                    // A new process knows its peers from its flags, but
                    // not the chain table the others were pushed.
                    if let Err(e) = self.wire_proxies(&s).await {
                        tracing::warn!(service = %sid, error = %e, "cannot wire the proxies");
                    }
                }
                // The service as it is now: one deleted meanwhile stays
                // out of the router.
                let _router = self.router_writes.lock().await;
                match self.find(&sid, None).await {
                    Ok(s)
                        if matches!(
                            s.state,
                            ServiceState::Active | ServiceState::Degraded | ServiceState::Deploying
                        ) =>
                    {
                        if let Err(e) = self.cfg.router.put(&s).await {
                            tracing::warn!(service = %sid, error = %e, "router update failed");
                        }
                    }
                    _ => {}
                }
            }
            let what = match i.role {
                Role::Cache => "instance",
                Role::Proxy => "proxy",
            };
            // A pod (its admin certificate names it) has no pid.
            let (was, now) = match i.admin_name {
                Some(_) => ("its pod".to_string(), "a new pod".to_string()),
                None => (
                    format!("pid {}", fmt_pid(old)),
                    format!("pid {}", fmt_pid(i.pid)),
                ),
            };
            let detail = match ready {
                Ok(()) => format!(
                    "{what} {} ({was}) was gone; replaced by {now} serving after {ms:.1} ms",
                    i.id
                ),
                Err(e) => format!(
                    "{what} {} ({was}) was gone; replacement not ready: {e}",
                    i.id
                ),
            };
            self.event(&sid, "healed", &detail).await;
        }
        n
    }

    fn note_relaunch(&self, sid: &str, iid: &str, f: impl FnOnce(&mut Relaunch)) {
        if let Some(r) = self
            .runtime
            .lock()
            .get_mut(sid)
            .and_then(|rt| rt.relaunch.get_mut(iid))
        {
            f(r);
        }
    }

    /// Marks instances that answer as running, and the service active when
    /// all do.
    async fn settle(&self, id: &str) {
        let s = match self.find(id, None).await {
            Ok(s) => s,
            Err(_) => return,
        };
        let mut ready = HashMap::new();
        for i in s.graph.instances() {
            ready.insert(
                i.id.clone(),
                deployer::wait_ready(
                    &self.admin,
                    std::slice::from_ref(i),
                    Duration::from_millis(300),
                )
                .await
                .is_ok(),
            );
        }
        let mut services = self.services.lock().await;
        let Some(s) = services.get_mut(id) else {
            return;
        };
        if !s.state.live() {
            return;
        }
        let mut all = true;
        for i in s.graph.instances_mut() {
            if i.state == InstanceState::Draining {
                continue;
            }
            if ready.get(&i.id).copied().unwrap_or(false) {
                i.state = InstanceState::Running;
            } else {
                all = false;
            }
        }
        if matches!(s.state, ServiceState::Active | ServiceState::Degraded) {
            s.state = if all {
                ServiceState::Active
            } else {
                ServiceState::Degraded
            };
        }
        let s = s.clone();
        drop(services);
        self.persist(&s).await;
    }

    /// Starts services whose lease began and ends those whose lease is over.
    pub async fn leases(&self) {
        let now = now_s();
        let (due, over): (Vec<String>, Vec<String>) = {
            let services = self.services.lock().await;
            (
                services
                    .values()
                    .filter(|s| {
                        s.state == ServiceState::Scheduled
                            && s.lease_start <= now
                            && now < s.lease_end
                    })
                    .map(|s| s.id.clone())
                    .collect(),
                services
                    .values()
                    .filter(|s| {
                        s.state.live() && s.state != ServiceState::Deleting && now >= s.lease_end
                    })
                    .map(|s| s.id.clone())
                    .collect(),
            )
        };
        for id in over {
            self.end(&id, ServiceState::Expired, None).await;
            self.metrics.expired.fetch_add(1, Ordering::Relaxed);
            self.event(
                &id,
                "expired",
                "lease over: instances stopped, reservation freed",
            )
            .await;
        }
        for id in due {
            let t0 = Instant::now();
            let launched = {
                let mut services = self.services.lock().await;
                let Some(s) = services.get_mut(&id) else {
                    continue;
                };
                s.state = ServiceState::Deploying;
                let r = self.launch_all(s);
                (s.clone(), r)
            };
            self.persist(&launched.0).await;
            match launched.1 {
                Ok(()) => {
                    let _ = self.finish_deploy(&id, t0).await;
                }
                Err(e) => {
                    self.fail(&id, e).await;
                }
            }
        }
    }

    /// Polls every running instance's statistics: usage, hung instances,
    /// load. Then scales elastic services. `dt` is the time since the last.
    pub async fn observe(self: &Arc<Self>, dt: Duration) {
        let services: Vec<Service> = self
            .services
            .lock()
            .await
            .values()
            .filter(|s| matches!(s.state, ServiceState::Active | ServiceState::Degraded))
            .cloned()
            .collect();
        let auth = format!("Bearer {}", self.instance_token);
        let polling = self.stats_polling().await;
        if let Some(t) = &self.cfg.telemetry {
            // Records of instances the store does not know are not kept.
            let known = self
                .services
                .lock()
                .await
                .values()
                .flat_map(|s| s.graph.instances().map(|i| i.id.clone()))
                .collect();
            t.set_known(known);
        }
        for s in services {
            let mut usage = Usage::default();
            let mut loads: HashMap<String, f64> = HashMap::new();
            let mut samples: BTreeMap<String, Accumulator> = BTreeMap::new();
            let mut hung = Vec::new();
            for r in &s.graph.regions {
                for i in &r.instances {
                    usage.vcpu_seconds += i.vcpus as f64 * dt.as_secs_f64();
                    let stats = self.cache_stats(i, &auth, polling).await;
                    let mut rt = self.runtime.lock();
                    let rt = rt.entry(s.id.clone()).or_default();
                    let v = match stats {
                        Ok(v) => v,
                        Err(e) => {
                            let f = rt.failures.entry(i.id.clone()).or_default();
                            *f += 1;
                            if *f >= UNRESPONSIVE_POLLS && i.state == InstanceState::Running {
                                hung.push((i.clone(), e));
                                *f = 0;
                            }
                            if i.serving() {
                                let last = rt.last_load.get(&i.id).copied().unwrap_or(0.0);
                                *loads.entry(r.region.clone()).or_default() += last;
                            }
                            continue;
                        }
                    };
                    rt.failures.remove(&i.id);
                    let requests: u64 = v["requests"]
                        .as_object()
                        .map_or(0, |m| m.values().filter_map(|x| x.as_u64()).sum());
                    let bytes = v["body_bytes_sent"].as_u64().unwrap_or(0);
                    let (hits, lookups) = hits_and_lookups(&v["requests"]);
                    let [dr, db, dh, dl] = rt.count(
                        &i.id,
                        v["boot_ms"].as_u64(),
                        [requests, bytes, hits, lookups],
                    );
                    let a = samples.entry(r.region.clone()).or_default();
                    (a.requests, a.bytes, a.hits, a.lookups) =
                        (a.requests + dr, a.bytes + db, a.hits + dh, a.lookups + dl);
                    // With Kafka billing, the caches' requests and bytes
                    // are billed as their records arrive from Kafka
                    // (`crate::billing`); the delta here is load only.
                    if self.cfg.kafka_billing.is_none() {
                        usage.requests += dr;
                        usage.bytes += db;
                    }
                    rt.connections
                        .insert(i.id.clone(), v["connections_open"].as_f64().unwrap_or(0.0));
                    if !i.serving() {
                        continue;
                    }
                    let demand = s.spec.regions.iter().find(|d| d.region == r.region);
                    let load = if demand
                        .is_some_and(|d| d.peak_users.is_none() && d.requests_per_s.is_some())
                    {
                        dr as f64 / dt.as_secs_f64().max(1e-3)
                    } else {
                        v["connections_open"].as_f64().unwrap_or(0.0)
                    };
                    rt.last_load.insert(i.id.clone(), load);
                    *loads.entry(r.region.clone()).or_default() += load;
                }
            }
            self.observe_proxies(&s, dt, &mut usage, &mut hung).await;
            {
                let mut rt = self.runtime.lock();
                rt.entry(s.id.clone()).or_default().load = loads.clone();
            }
            {
                let mut all = self.services.lock().await;
                if let Some(live) = all.get_mut(&s.id) {
                    live.usage.vcpu_seconds += usage.vcpu_seconds;
                    live.usage.requests += usage.requests;
                    live.usage.bytes += usage.bytes;
                    let (a, b) = (&mut live.usage.accel, &usage.accel);
                    a.vcpu_seconds += b.vcpu_seconds;
                    a.requests += b.requests;
                    a.bytes += b.bytes;
                    a.cpu_seconds += b.cpu_seconds;
                    let snap = live.clone();
                    drop(all);
                    self.persist(&snap).await;
                }
            }
            for (i, why) in hung {
                tracing::warn!(service = %s.id, instance = %i.id, error = %why, "instance does not answer; restarting it");
                let vim = self.vim.clone();
                let (id, pid) = (i.id.clone(), i.pid);
                let _ = tokio::task::spawn_blocking(move || vim.stop(&id, pid)).await;
                self.event(
                    &s.id,
                    "unresponsive",
                    &format!(
                        "instance {} did not answer {UNRESPONSIVE_POLLS} polls in a row (last: {why}); stopped for replacement",
                        i.id
                    ),
                )
                .await;
            }
            self.autoscale(&s, &loads).await;
            self.record(&s, &loads, samples).await;
        }
    }

    /// Adds this sample of a service to its time series
    /// ([`crate::timeseries`]): per region what its caches served since the
    /// last sample, its serving instances, load and MOS; the service's cost
    /// so far. A closed 10 s bucket goes to the store.
    async fn record(
        &self,
        s: &Service,
        loads: &HashMap<String, f64>,
        mut samples: BTreeMap<String, Accumulator>,
    ) {
        let now = now_s();
        let live = self.services.lock().await.get(&s.id).cloned();
        let Some(live) = live else { return };
        {
            let rt = self.runtime.lock();
            let rt = rt.get(&s.id);
            for r in &live.graph.regions {
                let a = samples.entry(r.region.clone()).or_default();
                a.samples = 1;
                a.instances = r.instances.iter().filter(|i| i.serving()).count() as f64;
                a.load = loads.get(&r.region).copied().unwrap_or(0.0);
                if let Some(m) = rt.and_then(|rt| rt.estimated_mos.get(&r.region)) {
                    (a.mos_est, a.mos_est_n) = (*m, 1);
                }
                if let Some((m, at)) = rt.and_then(|rt| rt.reported_mos.get(&r.region)) {
                    if at.elapsed() < REPORTED_MOS_FRESH {
                        (a.mos_rep, a.mos_rep_n) = (*m, 1);
                    }
                }
            }
        }
        samples.insert(
            String::new(),
            Accumulator {
                cost: pricing::bill(&live, now).total,
                ..Default::default()
            },
        );
        let mut closed = Vec::new();
        {
            let mut rec = self.series.lock();
            for (region, a) in &samples {
                closed.extend(rec.add(now, &s.id, region, a));
            }
        }
        for (points, prune) in closed {
            if let Err(e) = self.store.series_add(&points, &prune).await {
                tracing::warn!(error = %e, "cannot store the time series");
            }
        }
    }

    /// Whether `GET /stats` may be polled now: `vcdn up` allows it and
    /// the operator's settings leave it on.
    async fn stats_polling(&self) -> bool {
        self.cfg.stats_polling
            && self
                .settings()
                .await
                .map_or(true, |s| s.telemetry.stats_polling)
    }

    /// A cache's `/stats` document: its freshest `edge.stats` record (see
    /// [`crate::telemetry`]), else (when polling is on) a poll. A record
    /// that names another process than the instance's (its identity
    /// carries the launch's nonce) is not its usage.
    async fn cache_stats(
        &self,
        i: &Instance,
        auth: &str,
        polling: bool,
    ) -> Result<serde_json::Value, String> {
        if let Some(t) = &self.cfg.telemetry {
            if let Some(r) = t.fresh_stats(&i.id, crate::telemetry::FRESH) {
                if deployer::claimed_identity(&r.data) == i.identity() {
                    self.metrics.stats_telemetry.fetch_add(1, Ordering::Relaxed);
                    return Ok(r.data);
                }
            }
        }
        if !polling {
            return Err(format!(
                "no edge.stats record in the last {:.1} s (/stats polling is off)",
                crate::telemetry::FRESH.as_secs_f64()
            ));
        }
        self.metrics.stats_polled.fetch_add(1, Ordering::Relaxed);
        instance_stats(&self.admin, i, auth).await
    }

    /// Polls a service's proxies' `/stats` like the caches': their
    /// vCPU-time, requests and bytes are added to `usage` (and to its
    /// acceleration share), counters that went down mean a restarted
    /// process (its new count is all new); one that stops answering is
    /// taken for hung like a cache. Proxies carry no autoscaled load.
    async fn observe_proxies(
        &self,
        s: &Service,
        dt: Duration,
        usage: &mut Usage,
        hung: &mut Vec<(Instance, String)>,
    ) {
        let Some(a) = &s.graph.accel else {
            return;
        };
        let auth = format!("Bearer {}", self.instance_token);
        for i in &a.proxies {
            let vcpu_s = i.vcpus as f64 * dt.as_secs_f64();
            usage.vcpu_seconds += vcpu_s;
            usage.accel.vcpu_seconds += vcpu_s;
            let stats = instance_stats(&self.admin, i, &auth).await;
            let mut rt = self.runtime.lock();
            let rt = rt.entry(s.id.clone()).or_default();
            let v = match stats {
                Ok(v) => v,
                Err(e) => {
                    let f = rt.failures.entry(i.id.clone()).or_default();
                    *f += 1;
                    if *f >= UNRESPONSIVE_POLLS && i.state == InstanceState::Running {
                        hung.push((i.clone(), e));
                        *f = 0;
                    }
                    continue;
                }
            };
            rt.failures.remove(&i.id);
            let (requests, bytes, cpu) = crate::accel::proxy_counters(&v);
            let [lr, lb, ..] = rt
                .counters
                .insert(i.id.clone(), [requests, bytes, 0, 0])
                .unwrap_or_default();
            let lc = rt.cpu.insert(i.id.clone(), cpu).unwrap_or(0.0);
            let since = |now: u64, last: u64| if now >= last { now - last } else { now };
            let (dr, db) = (since(requests, lr), since(bytes, lb));
            let dc = if cpu >= lc { cpu - lc } else { cpu };
            usage.requests += dr;
            usage.bytes += db;
            usage.accel.requests += dr;
            usage.accel.bytes += db;
            usage.accel.cpu_seconds += dc;
        }
    }

    /// Between two samples (every tick, with telemetry): the QoE check of
    /// every region whose serving instances all sent an `edge.stats`
    /// record in the last [`REACT_FRESH`], on the load those records
    /// carry. A load step is thus answered within a tick or two of the
    /// records that show it, not at the next once-a-second sample. It
    /// counts no usage and moves no autoscaler trend (those stay on the
    /// samples of [`Control::observe`]), so nothing is counted twice; a
    /// scale-out here is remembered like one of `observe` (not again within
    /// 10 s for the same region's QoE).
    pub async fn react(self: &Arc<Self>) {
        let Some(t) = &self.cfg.telemetry else {
            return;
        };
        let services: Vec<Service> = self
            .services
            .lock()
            .await
            .values()
            .filter(|s| {
                matches!(s.state, ServiceState::Active | ServiceState::Degraded)
                    && s.spec.quality.min_mos.is_some()
            })
            .cloned()
            .collect();
        if services.is_empty() {
            return;
        }
        let Ok(flavors) = self.flavors().await else {
            return;
        };
        for s in services {
            let Some(flavor) = flavors.iter().find(|f| f.name == s.spec.flavor) else {
                continue;
            };
            if !planner::plugin(flavor.kind).autoscaled() {
                continue;
            }
            let peak_users = |region: &str| {
                s.spec
                    .regions
                    .iter()
                    .any(|d| d.region == region && d.peak_users.is_some())
            };
            for r in s.graph.regions.iter().filter(|r| peak_users(&r.region)) {
                let mut load = Some(0.0);
                for i in r.instances.iter().filter(|i| i.serving()) {
                    let rec = t
                        .fresh_stats(&i.id, REACT_FRESH)
                        .filter(|rec| deployer::claimed_identity(&rec.data) == i.identity());
                    load = match (load, rec) {
                        (Some(l), Some(rec)) => {
                            Some(l + rec.data["connections_open"].as_f64().unwrap_or(0.0))
                        }
                        _ => None,
                    };
                }
                if let Some(load) = load {
                    self.qoe_step(&s, r, load, flavor.template.max_instances)
                        .await;
                }
            }
        }
    }

    /// The QoE check of one region at `load`: what the capacity model
    /// expects at this load per vCPU and what players reported in the last
    /// 30 s; under the target, one more instance (at most once in 10 s).
    /// Says whether it scaled out (or tried).
    async fn qoe_step(
        self: &Arc<Self>,
        s: &Service,
        r: &RegionGraph,
        load: f64,
        max_instances: u32,
    ) -> bool {
        let target = s.spec.quality.min_mos;
        // The QoE viewers get: what the capacity model expects at this
        // load per vCPU, and what players reported in the last 30 s.
        let demand = s.spec.regions.iter().find(|d| d.region == r.region);
        let estimated = demand.filter(|d| d.peak_users.is_some()).and_then(|d| {
            let vcpus: u32 = r.instances.iter().map(|i| i.vcpus).sum();
            self.cfg.capacity.mos_at(
                d.bitrate_kbps
                    .unwrap_or(vcdn_policy::dimensioning::DEFAULT_BITRATE_KBPS),
                d.chunk_s
                    .unwrap_or(vcdn_policy::dimensioning::DEFAULT_CHUNK_S),
                load / vcpus.max(1) as f64,
            )
        });
        let below_target = {
            let mut rt = self.runtime.lock();
            let rt = rt.entry(s.id.clone()).or_default();
            if let Some(e) = estimated {
                rt.estimated_mos.insert(r.region.clone(), e);
            }
            let reported = rt
                .reported_mos
                .get(&r.region)
                .filter(|(_, at)| at.elapsed() < REPORTED_MOS_FRESH)
                .map(|(m, _)| *m);
            let worst = [estimated, reported].into_iter().flatten().reduce(f64::min);
            let due = rt
                .qoe_scaled
                .get(&r.region)
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(10));
            match (target, worst) {
                (Some(t), Some(w)) if w < t && due => {
                    rt.qoe_scaled.insert(r.region.clone(), Instant::now());
                    Some(w)
                }
                _ => None,
            }
        };
        let serving = r.instances.iter().filter(|i| i.serving()).count() as u32;
        if let (Some(w), true) = (below_target, serving < max_instances) {
            match self.scale_out(&s.id, &r.region, 1, load).await {
                Ok(()) => {
                    self.event(
                        &s.id,
                        "qoe_below_target",
                        &format!(
                            "{}: MOS {w:.2} under the target {:.2}; one more instance",
                            r.region,
                            target.unwrap_or(0.0)
                        ),
                    )
                    .await
                }
                Err(e) => {
                    self.event(&s.id, "scale_out_failed", &format!("{}: {e}", r.region))
                        .await
                }
            }
            return true;
        }
        false
    }

    async fn autoscale(self: &Arc<Self>, s: &Service, loads: &HashMap<String, f64>) {
        let flavors = match self.flavors().await {
            Ok(f) => f,
            Err(_) => return,
        };
        let Some(flavor) = flavors.iter().find(|f| f.name == s.spec.flavor) else {
            return;
        };
        if !planner::plugin(flavor.kind).autoscaled() {
            return;
        }
        let t = &flavor.template;
        for r in &s.graph.regions {
            let load = loads.get(&r.region).copied().unwrap_or(0.0);
            if self.qoe_step(s, r, load, t.max_instances).await {
                continue;
            }
            let serving = r.instances.iter().filter(|i| i.serving()).count() as u32;
            let decision = {
                let mut rt = self.runtime.lock();
                let trend = rt
                    .entry(s.id.clone())
                    .or_default()
                    .trends
                    .entry(r.region.clone())
                    .or_default();
                self.cfg.autoscaler.decide(
                    trend,
                    load,
                    r.per_instance.max(1e-9),
                    serving,
                    t.min_instances.max(1),
                    t.max_instances,
                )
            };
            match decision {
                Decision::Hold => {}
                Decision::Out(n) => {
                    if let Err(e) = self.scale_out(&s.id, &r.region, n, load).await {
                        let again = {
                            let mut rt = self.runtime.lock();
                            let failed = &mut rt.entry(s.id.clone()).or_default().scale_failed;
                            let again = failed
                                .get(&r.region)
                                .is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
                            if again {
                                failed.insert(r.region.clone(), Instant::now());
                            }
                            again
                        };
                        if again {
                            self.event(&s.id, "scale_out_failed", &format!("{}: {e}", r.region))
                                .await;
                        }
                    }
                }
                Decision::In => {
                    // No scale-in right after a scale-out: the new
                    // instance has only just begun to take viewers.
                    let recent_out = self
                        .runtime
                        .lock()
                        .get(&s.id)
                        .and_then(|rt| rt.scaled_out_at.get(&r.region).copied())
                        .is_some_and(|at| at.elapsed() < SCALE_IN_AFTER_OUT);
                    if !recent_out {
                        self.scale_in(&s.id, &r.region, load).await;
                    }
                }
            }
        }
    }

    async fn scale_out(
        &self,
        id: &str,
        region: &str,
        n: u32,
        load: f64,
    ) -> Result<(), ControlError> {
        let t0 = Instant::now();
        let regions = self.regions().await?;
        let hosts = self.hosts().await?;
        let flavors = self.flavors().await?;
        let mut services = self.services.lock().await;
        let all: Vec<Service> = services.values().cloned().collect();
        let s = services
            .get_mut(id)
            .ok_or_else(|| ControlError::NotFound(id.into()))?;
        let flavor = flavors
            .iter()
            .find(|f| f.name == s.spec.flavor)
            .ok_or_else(|| ControlError::NotFound(s.spec.flavor.clone()))?;
        let reg = regions
            .iter()
            .find(|r| r.name == region)
            .ok_or_else(|| ControlError::NotFound(region.into()))?;
        let fleet = Fleet {
            hosts: &hosts,
            services: &all,
            instance_port: self.cfg.instance_port,
            admin_port: self.cfg.admin_port,
        };
        let mut added = planner::place_more(
            &fleet,
            reg,
            &flavor.template,
            n,
            &mut || format!("i-{}", random_hex(5)),
            now_s(),
        )?;
        for i in &mut added {
            i.nonce = random_hex(8);
            // As `launch` records it: `added` is what is waited for.
            i.admin_https = self.cfg.internal_ca.is_some();
        }
        let mut grown = s.clone();
        let rg = grown
            .graph
            .regions
            .iter_mut()
            .find(|r| r.region == region)
            .ok_or_else(|| ControlError::NotFound(region.into()))?;
        let before = rg.instances.len();
        rg.instances.extend(added.iter().cloned());
        let after = rg.instances.len();
        // Recorded before the processes start (see `Control::create`).
        self.store.put("service", id, &grown).await?;
        *s = grown;
        let snapshot = s.clone();
        for i in s
            .graph
            .instances_mut()
            .filter(|i| added.iter().any(|a| a.id == i.id))
        {
            self.launch(&snapshot, i)?;
        }
        let snap = s.clone();
        drop(services);
        self.persist(&snap).await;
        self.wait_started(id, &added)
            .await
            .map_err(ControlError::Deploy)?;
        self.settle(id).await;
        let s = self.find(id, None).await?;
        self.cfg
            .router
            .put(&s)
            .await
            .map_err(ControlError::Deploy)?;
        self.metrics.scaled_out.fetch_add(1, Ordering::Relaxed);
        self.runtime
            .lock()
            .entry(id.to_string())
            .or_default()
            .scaled_out_at
            .insert(region.to_string(), Instant::now());
        self.event(id, "scaled_out", &format!("{region}: {before} -> {after} instances at load {load:.0} (each carries {:.0}); serving after {:.1} ms", snap.graph.regions.iter().find(|r| r.region == region).map_or(0.0, |r| r.per_instance), t0.elapsed().as_secs_f64() * 1000.0)).await;
        Ok(())
    }

    /// Takes the least busy instance out of the router, lets its viewers
    /// finish (at most [`DRAIN`]), then stops it. It keeps its host
    /// capacity and address until then.
    async fn scale_in(self: &Arc<Self>, id: &str, region: &str, load: f64) {
        let (leaving, snap, before) = {
            let mut services = self.services.lock().await;
            let Some(s) = services.get_mut(id) else {
                return;
            };
            let conns = self
                .runtime
                .lock()
                .get(id)
                .map(|r| r.connections.clone())
                .unwrap_or_default();
            let Some(rg) = s.graph.regions.iter_mut().find(|r| r.region == region) else {
                return;
            };
            let before = rg.instances.iter().filter(|i| i.serving()).count();
            let Some(i) = rg
                .instances
                .iter_mut()
                .filter(|i| i.serving())
                .min_by(|a, b| {
                    conns
                        .get(&a.id)
                        .unwrap_or(&0.0)
                        .total_cmp(conns.get(&b.id).unwrap_or(&0.0))
                })
            else {
                return;
            };
            i.state = InstanceState::Draining;
            (i.clone(), s.clone(), before)
        };
        self.persist(&snap).await;
        // The router first, so no new viewer is sent to it.
        if let Err(e) = self.cfg.router.put(&snap).await {
            tracing::warn!(service = id, error = %e, "router update failed");
        }
        self.metrics.scaled_in.fetch_add(1, Ordering::Relaxed);
        self.event(
            id,
            "scaled_in",
            &format!(
                "{region}: {before} -> {} instances at load {load:.0}; {} drains",
                before - 1,
                leaving.id
            ),
        )
        .await;
        let c = self.clone();
        let id = id.to_string();
        tokio::spawn(async move { c.drain(&id, leaving).await });
    }

    async fn drain(&self, id: &str, i: Instance) {
        let t0 = Instant::now();
        let auth = format!("Bearer {}", self.instance_token);
        let mut left = 0.0;
        if i.admin.parse::<SocketAddr>().is_ok() {
            while t0.elapsed() < DRAIN {
                // Its records say it as well as a poll.
                if let Some(r) = self
                    .cfg
                    .telemetry
                    .as_ref()
                    .and_then(|t| t.fresh_stats(&i.id, Duration::from_millis(500)))
                    .filter(|r| deployer::claimed_identity(&r.data) == i.identity())
                {
                    left = r.data["connections_open"].as_f64().unwrap_or(0.0);
                    if left < 1.0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                let r = deployer::instance_request(
                    &self.admin,
                    &i,
                    "GET",
                    "/stats",
                    &[("Authorization", &auth)],
                    b"",
                    Duration::from_secs(1),
                )
                .await;
                left = match r
                    .ok()
                    .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
                {
                    Some(v) => v["connections_open"].as_f64().unwrap_or(0.0),
                    None => 0.0,
                };
                if left < 1.0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        self.stop_instances(vec![i.clone()]).await;
        let snap = {
            let mut services = self.services.lock().await;
            let Some(s) = services.get_mut(id) else {
                return;
            };
            for r in &mut s.graph.regions {
                r.instances.retain(|x| x.id != i.id);
            }
            s.clone()
        };
        self.persist(&snap).await;
        if let Some(rt) = self.runtime.lock().get_mut(id) {
            rt.counters.remove(&i.id);
            rt.boots.remove(&i.id);
            rt.connections.remove(&i.id);
            rt.last_load.remove(&i.id);
        }
        self.event(
            id,
            "drained",
            &format!(
                "{} stopped after {:.1} s ({left:.0} connections left)",
                i.id,
                t0.elapsed().as_secs_f64()
            ),
        )
        .await;
    }

    /// After a restart, before the API and the supervisor run: make the
    /// processes match the records.
    ///
    /// - Every instance process this control plane started (the VIM's
    ///   marks) that no live record owns by its identity is stopped: a
    ///   process started for an order that was never recorded, or left by a
    ///   delete cut short, must not hold an address another service gets.
    /// - A delete cut short is finished (`deleting` → `deleted`).
    /// - An order cut short (`deploying`) is finished, not undone: its
    ///   intent was recorded before any process started, so its instances
    ///   are adopted or started like those of an active service.
    /// - Instances that still run and prove their identity are adopted;
    ///   the others are started again. The router gets every live service.
    pub async fn reconcile(&self) {
        self.backfill_origin_policies().await;
        let vim = self.vim.clone();
        let marked = tokio::task::spawn_blocking(move || vim.marked())
            .await
            .unwrap_or_default();
        let (owners, deleting) = {
            let services = self.services.lock().await;
            let owners: HashMap<String, (String, String)> = services
                .values()
                .filter(|s| {
                    matches!(
                        s.state,
                        ServiceState::Active | ServiceState::Degraded | ServiceState::Deploying
                    )
                })
                .flat_map(|s| {
                    s.graph
                        .instances()
                        .filter(|i| !i.nonce.is_empty())
                        .map(|i| (i.identity(), (s.id.clone(), i.id.clone())))
                })
                .collect();
            let deleting: Vec<String> = services
                .values()
                .filter(|s| s.state == ServiceState::Deleting)
                .map(|s| s.id.clone())
                .collect();
            (owners, deleting)
        };
        let mut found: HashMap<String, crate::vim::Marked> = HashMap::new();
        let mut strays = Vec::new();
        for m in marked {
            if owners.contains_key(&m.identity) && !found.contains_key(&m.identity) {
                found.insert(m.identity.clone(), m);
            } else {
                strays.push(m);
            }
        }
        if !strays.is_empty() {
            let list: Vec<String> = strays
                .iter()
                .map(|m| format!("pid {} on {} ({})", fmt_pid(m.pid), m.listen, m.identity))
                .collect();
            tracing::warn!(processes = %list.join(", "), "stopping cache instances no record owns");
            let vim = self.vim.clone();
            let _ = tokio::task::spawn_blocking(move || {
                std::thread::scope(|sc| {
                    for m in &strays {
                        let vim = &vim;
                        let id = m.identity.split('.').next().unwrap_or("").to_string();
                        sc.spawn(move || vim.stop(&id, m.pid));
                    }
                })
            })
            .await;
        }
        if self.cfg.srv6 {
            // Nodes of the SR domain whose instance no record owns (their
            // process died with the control plane, or before it).
            let known: HashSet<&str> = owners.values().map(|(_, i)| i.as_str()).collect();
            for id in vcdn_srv6::domain::Domain::nodes() {
                if !known.contains(id.as_str()) {
                    tracing::warn!(instance = %id, "removing an SR domain node no record owns");
                    vcdn_srv6::domain::Domain::remove_node(&vcdn_srv6::domain::Node::of(&id));
                }
            }
        }
        for id in deleting {
            let n = self
                .end(&id, ServiceState::Deleted, None)
                .await
                .map_or(0, |s| s.graph.instances().count());
            self.event(
                &id,
                "deleted",
                &format!("delete finished after a control plane restart: {n} instances stopped, reservation freed"),
            )
            .await;
        }
        let ids: Vec<String> = owners
            .values()
            .map(|(sid, _)| sid.clone())
            .chain(
                self.services
                    .lock()
                    .await
                    .values()
                    .filter(|s| {
                        matches!(
                            s.state,
                            ServiceState::Active | ServiceState::Degraded | ServiceState::Deploying
                        )
                    })
                    .map(|s| s.id.clone()),
            )
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for id in ids {
            let s = match self.find(&id, None).await {
                Ok(s) => s,
                Err(_) => continue,
            };
            let resumed = s.state == ServiceState::Deploying;
            let mut adopted = Vec::new();
            let mut not_adopted: Vec<String> = Vec::new();
            for i in s.graph.instances() {
                let Some(m) = found.get(&i.identity()) else {
                    continue;
                };
                let mut i = i.clone();
                i.pid = m.pid;
                if let Some(ip) = m.ip {
                    // A pod keeps its IP; one recorded before it had one
                    // (an order cut short) gets it now.
                    for a in [&mut i.address, &mut i.admin] {
                        if let Ok(mut sa) = a.parse::<std::net::SocketAddr>() {
                            sa.set_ip(ip);
                            *a = sa.to_string();
                        }
                    }
                }
                let pid = fmt_pid(m.pid);
                match deployer::wait_ready(
                    &self.admin,
                    std::slice::from_ref(&i),
                    Duration::from_millis(300),
                )
                .await
                {
                    Ok(()) => adopted.push(i),
                    Err(e) => {
                        tracing::warn!(service = %id, instance = %i.id, pid, error = %e, "not adopting the process found under the instance's identity: re-creating it");
                        not_adopted.push(e);
                    }
                }
            }
            let mut recreated = 0;
            {
                let mut services = self.services.lock().await;
                if let Some(live) = services.get_mut(&id) {
                    let snapshot = live.clone();
                    for i in live.graph.instances_mut() {
                        if let Some(a) = adopted.iter().find(|a| a.id == i.id) {
                            i.pid = a.pid;
                            i.address = a.address.clone();
                            i.admin = a.admin.clone();
                            continue;
                        }
                        if !found.contains_key(&i.identity())
                            && self.vim.alive(&i.id, i.pid, &i.identity())
                        {
                            // Its VIM cannot tell now (a cluster that does
                            // not answer): left as recorded until it can.
                            continue;
                        }
                        // Whatever runs under its identity does not answer:
                        // stop it, then start it again.
                        match found.get(&i.identity()) {
                            Some(m) => self.vim.stop(&i.id, m.pid),
                            None if i.pid.is_some() => self.vim.stop(&i.id, i.pid),
                            None => {}
                        }
                        recreated += 1;
                        if let Err(e) = self.launch(&snapshot, i) {
                            tracing::error!(instance = %i.id, error = %e, "cannot re-create instance");
                            i.state = InstanceState::Failed;
                            i.pid = None;
                        }
                    }
                    if live.state == ServiceState::Deploying {
                        live.state = ServiceState::Degraded;
                    }
                    let snap = live.clone();
                    drop(services);
                    self.persist(&snap).await;
                }
            }
            self.settle(&id).await;
            let s = match self.find(&id, None).await {
                Ok(s) => s,
                Err(_) => continue,
            };
            if let Err(e) = self.wire_proxies(&s).await {
                tracing::error!(service = %id, error = %e, "cannot wire the proxies");
            }
            if let Err(e) = self.cfg.router.put(&s).await {
                tracing::error!(service = %id, error = %e, "cannot configure the router");
            }
            self.event(
                &id,
                "reconciled",
                &format!(
                    "control plane restarted{}: {} instances adopted, {recreated} re-created, router configured{}",
                    if resumed { " during deployment; deployment finished" } else { "" },
                    adopted.len(),
                    if not_adopted.is_empty() {
                        String::new()
                    } else {
                        format!("; not adopted: {}", not_adopted.join("; "))
                    }
                ),
            )
            .await;
        }
    }
}

/// A cache's cumulative (hits, lookups) from its `/stats` `requests`
/// counts by cache status: hits are fresh, stale and revalidated answers;
/// lookups also count misses, coalesced and refreshed ones (not passes,
/// errors or bypasses: those are not looked up), as its own `hit_ratio`.
fn hits_and_lookups(requests: &serde_json::Value) -> (u64, u64) {
    let n = |k: &str| requests[k].as_u64().unwrap_or(0);
    let hits = n("hit") + n("stale") + n("revalidated");
    (hits, hits + n("miss") + n("coalesced") + n("refresh"))
}

/// An instance's `/stats` (cache or proxy), if it answers as itself:
/// another process on its address is not it, and its counters are not
/// this instance's usage. Else why not.
async fn instance_stats(
    client: &vcdn_http::admin_tls::AdminClient,
    i: &Instance,
    auth: &str,
) -> Result<serde_json::Value, String> {
    let r = deployer::instance_request(
        client,
        i,
        "GET",
        "/stats",
        &[("Authorization", auth)],
        b"",
        Duration::from_secs(1),
    )
    .await?;
    if r.status() != 200 {
        return Err(format!("GET /stats answered {}", r.status()));
    }
    let v = serde_json::from_slice::<serde_json::Value>(&r.body)
        .map_err(|e| format!("GET /stats: {e}"))?;
    match deployer::claimed_identity(&v) {
        who if who == i.identity() => Ok(v),
        who => Err(format!(
            "another process answers on its admin address (as {who:?})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relaunches_back_off_exponentially_up_to_a_cap() {
        let waits: Vec<u128> = (0..9).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(waits, [0, 200, 400, 800, 1600, 3200, 6400, 12800, 25600]);
        assert_eq!(backoff(10), BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }
}
