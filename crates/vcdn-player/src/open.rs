//! The open-loop schedule: a load generator's model of viewers, not a
//! viewer's (see the crate docs). Segment `i` of a VOD is requested at
//! `(i − ahead)·d` after the session began, of a live channel when it
//! becomes available; a late response does not delay later requests (up
//! to `max_connections` of a session at once), so the offered load does
//! not fall when the server slows, as with wrk2. Response times count
//! from the scheduled send.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Mutex};
use vcdn_content::mpd::{self, Manifest};

use crate::conn::{Conn, FetchError};
use crate::playback::Playback;
use crate::servers::{Avoided, Servers};
use crate::{
    fetch, finish, path_of, pick, report_windows, track, Live, PlayerOptions, SessionReport, Target,
};

/// What a request task reports back.
struct Done {
    index: u64,
    at: Instant,
    result: Result<u64, FetchError>,
    /// Response time from the scheduled send, ms.
    latency_ms: f64,
    /// Throughput of the transfer, kb/s.
    kbps: f64,
    rep: usize,
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn session(
    id: usize,
    opts: &PlayerOptions,
    t: &Target,
    servers: Arc<Servers>,
    m: &Manifest,
    live: &Live,
    latencies: &Mutex<Vec<f64>>,
    start: Instant,
    end: Instant,
) -> SessionReport {
    tokio::time::sleep_until(start.into()).await;
    live.running.fetch_add(1, Ordering::Relaxed);
    let t0 = Instant::now();
    let rel = |i: Instant| i.saturating_duration_since(t0).as_secs_f64();
    let mut report = SessionReport::new(id);
    let pool: Arc<Mutex<Vec<Conn>>> = Arc::new(Mutex::new(Vec::new()));
    let first = pick(m, opts.quality, None);
    let seg_d = first.segment(0).map_or(2.0, |s| s.duration_s).max(0.1);
    let mut playback = Playback::new((m.min_buffer_s).max(seg_d).min(3.0 * seg_d));
    let best_kbps = m
        .representations
        .last()
        .map_or(1.0, |r| r.bandwidth as f64 / 1000.0);
    let avoided = Arc::new(Avoided::default());
    // The session's own MPD and initialization fetch, as a player does.
    let timeout = opts.request_timeout;
    match fetch(&servers, id, &avoided, &pool, &t.path, false, timeout, None).await {
        Ok(f) if f.status == 200 => report.requests += 1,
        Ok(f) => report.fail(format!("manifest: HTTP {}", f.status)),
        Err(e) => report.fail(e.to_string()),
    }
    if let (false, Some(init)) = (report.failed, &first.init) {
        let path = path_of(t, init);
        match fetch(&servers, id, &avoided, &pool, &path, false, timeout, None).await {
            Ok(f) if f.status == 200 => report.requests += 1,
            Ok(f) => report.fail(format!("{init}: HTTP {}", f.status)),
            Err(e) => report.fail(e.to_string()),
        }
    }
    let (tx, mut rx) = mpsc::channel::<Done>(64);
    let count = first.count().unwrap_or(u64::MAX);
    // When segment `i` may be requested, in seconds after t0: VOD keeps
    // `ahead` segments ahead of playback at the video's pace; live waits
    // for each segment to exist and joins two behind the live edge.
    let live_at = m
        .availability_start
        .as_deref()
        .and_then(mpd::parse_datetime)
        .filter(|_| m.dynamic);
    let unix_t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let first_index = live_at.map_or(0, |ast| {
        let edge = ((unix_t0 - ast) / seg_d).floor() as i64 - 1;
        (edge - 1).max(0) as u64
    });
    let due_s = |i: u64| -> f64 {
        match live_at {
            Some(ast) => (ast + (i + 1) as f64 * seg_d + 0.05 - unix_t0).max(0.0),
            None => i.saturating_sub(opts.ahead) as f64 * seg_d,
        }
    };
    let mut next = first_index;
    let mut in_flight = 0usize;
    let mut arrived: BTreeMap<u64, (Instant, f64, f64)> = BTreeMap::new();
    let mut next_to_buffer = first_index;
    let mut throughput: Option<f64> = None;
    let mut was = (false, false);
    let mut windows_reported = 0usize;
    if report.failed {
        playback.fail(0.0);
    }
    while !report.failed
        && Instant::now() < end
        && !(next_to_buffer >= count && playback.complete())
    {
        let due = t0 + Duration::from_secs_f64(due_s(next));
        let can_send = next < count && in_flight < opts.max_connections;
        tokio::select! {
            _ = tokio::time::sleep_until(due.into()), if can_send => {
                let rep_i = {
                    let r = pick(m, opts.quality, throughput);
                    m.representations.iter().position(|x| std::ptr::eq(x, r)).unwrap_or(0)
                };
                let rep = &m.representations[rep_i];
                if !report.representations.contains(&rep.id) {
                    report.representations.push(rep.id.clone());
                }
                let Some(seg) = rep.segment(next) else { next = count; continue };
                let path = path_of(t, &seg.url);
                let (pool, tx, servers, avoided) = (pool.clone(), tx.clone(), servers.clone(), avoided.clone());
                let index = next;
                in_flight += 1;
                tokio::spawn(async move {
                    let sent = Instant::now();
                    let result = fetch(&servers, id, &avoided, &pool, &path, false, timeout, None).await;
                    let at = Instant::now();
                    let result = match result {
                        Ok(f) if (200..300).contains(&f.status) => Ok(f.bytes),
                        Ok(f) => Err(FetchError::Status(path.clone(), f.status)),
                        Err(e) => Err(e),
                    };
                    let secs = at.duration_since(sent).as_secs_f64().max(1e-6);
                    let kbps = result.as_ref().map_or(0.0, |b| *b as f64 * 8.0 / 1000.0 / secs);
                    let latency_ms = at.duration_since(due.min(sent)).as_secs_f64() * 1000.0;
                    let _ = tx.send(Done { index, at, result, latency_ms, kbps, rep: rep_i }).await;
                });
                next += 1;
            }
            Some(d) = rx.recv() => {
                in_flight -= 1;
                report.requests += 1;
                live.requests.fetch_add(1, Ordering::Relaxed);
                match d.result {
                    Ok(bytes) => {
                        report.bytes += bytes;
                        live.bytes.fetch_add(bytes, Ordering::Relaxed);
                        latencies.lock().await.push(d.latency_ms);
                        throughput = Some(throughput.map_or(d.kbps, |t| 0.7 * t + 0.3 * d.kbps));
                        let r = &m.representations[d.rep];
                        let dur = r.segment(d.index).map_or(seg_d, |s| s.duration_s);
                        arrived.insert(d.index, (d.at, dur, r.bandwidth as f64 / 1000.0));
                        while let Some((at, dur, kbps)) = arrived.remove(&next_to_buffer) {
                            playback.arrive(rel(at), dur, kbps);
                            next_to_buffer += 1;
                        }
                    }
                    Err(e) => {
                        live.errors.fetch_add(1, Ordering::Relaxed);
                        playback.fail(rel(d.at));
                        report.fail(e.to_string());
                    }
                }
            }
            _ = tokio::time::sleep_until(end.into()) => {}
            // A stall starts when the playhead runs out; look again soon.
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        playback.advance(rel(Instant::now()));
        report_windows(
            &playback,
            &mut windows_reported,
            rel(Instant::now()),
            live,
            best_kbps,
            opts.frame_rate,
        );
        let now = (playback.is_playing(), playback.is_stalled());
        track(&live.playing, was.0, now.0);
        track(&live.stalled, was.1, now.1);
        was = now;
    }
    track(&live.playing, was.0, false);
    track(&live.stalled, was.1, false);
    // A finished title ends when its last segment has been played.
    // A failed session counts to the end of the run: every window after
    // the failure scores 1 (the paper's rule), not just the ones before.
    let t_end = if report.failed {
        rel(end)
    } else {
        rel(Instant::now().min(end))
    };
    finish(
        report,
        playback,
        live,
        windows_reported,
        t_end,
        best_kbps,
        opts.frame_rate,
    )
}
