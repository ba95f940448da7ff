//! The closed-loop player: a model of what a viewer's DASH player (dash.js,
//! Shaka, ExoPlayer) does, so that a slow server shows up as stalls.
//!
//! Per session, one segment in flight per media type (video, and audio
//! when the MPD has it), each on its own keep-alive connection. The next
//! segment of a type is requested when the previous one has arrived and
//! that type's buffer is under the target (`vcdn_policy::abr`: 12 s, 30 s at
//! the top quality, less while BOLA decides); its representation is the
//! ABR rule's choice (or the fixed one asked for), and a new
//! representation's initialization segment is fetched before its first
//! segment. Playback starts when the start buffer (one segment by default,
//! as a media element starts on its first decodable data) of every type is
//! in, stalls when the playhead reaches the end of what every type has,
//! and resumes on the next arrival. A failed segment is asked again up to
//! three times, a second apart (dash.js's retry rule for media segments),
//! while playback goes on from the buffer; then the session fails.
//!
//! A live (dynamic) MPD is joined two segments behind its live edge, and a
//! segment is never requested before it is available
//! (`availabilityStartTime` + its end). After a stall a live session
//! resumes where it stopped (it does not jump to the live edge).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use vcdn_content::mpd::{self, Manifest, Representation};
use vcdn_policy::abr::Abr;

use crate::conn::{Conn, FetchError, Fetched, Progress};
use crate::playback::Playback;
use crate::servers::{Avoided, Servers};
use crate::{
    fetch, finish, path_of, pick, report_windows, track, Live, PlayerOptions, Quality,
    SessionReport, Target,
};

/// Times a failed segment is asked again.
const RETRIES: u32 = 3;
const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// What one segment request (with its initialization segment, if the
/// representation is new) came back with.
struct Got {
    rep: usize,
    sent: Instant,
    done: Instant,
    requests: u64,
    result: Result<Fetched, FetchError>,
}

type InFlight = Pin<Box<dyn Future<Output = Got> + Send>>;

/// One media type of a session.
struct Track<'m> {
    /// The manifest's representations of this type (not copied: a
    /// session is small, whatever the manifest lists).
    reps: &'m [Representation],
    pool: Arc<Mutex<Vec<Conn>>>,
    /// Next segment index, and how many there are.
    next: u64,
    count: u64,
    /// Media seconds downloaded, contiguous from the join point.
    end_s: f64,
    /// Representations whose initialization segment is in.
    inited: Vec<bool>,
    /// Failures of the current segment so far, and when it may be asked
    /// again.
    failures: u32,
    not_before: Option<Instant>,
    in_flight: Option<InFlight>,
    /// The request in flight: when it was sent, its representation and
    /// how far its body has come.
    sent: Instant,
    rep_in_flight: usize,
    progress: Arc<Progress>,
    /// The representation to ask the next segment at after an abandoned
    /// download.
    retry_at_rep: Option<usize>,
}

impl<'m> Track<'m> {
    fn new(reps: &'m [Representation], first: u64) -> Track<'m> {
        let count = reps
            .iter()
            .filter_map(|r| r.count())
            .min()
            .unwrap_or(u64::MAX);
        Track {
            reps,
            pool: Arc::new(Mutex::new(Vec::new())),
            next: first,
            count,
            end_s: 0.0,
            inited: vec![false; reps.len()],
            failures: 0,
            not_before: None,
            in_flight: None,
            sent: Instant::now(),
            rep_in_flight: 0,
            progress: Arc::new(Progress::default()),
            retry_at_rep: None,
        }
    }

    fn done(&self) -> bool {
        self.next >= self.count && self.in_flight.is_none()
    }
}

/// The next completed request of a track (never, when none is in flight).
async fn completion(f: &mut Option<InFlight>) -> Got {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
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
    let avoided = Arc::new(Avoided::default());
    let timeout = opts.request_timeout;
    let video_kbps: Vec<f64> = m
        .representations
        .iter()
        .map(|r| r.bandwidth as f64 / 1000.0)
        .collect();
    let best_kbps = video_kbps.last().copied().unwrap_or(1.0);
    let mut abr = Abr::new(&video_kbps, opts.abr);
    let seg_d = m.representations[0]
        .segment(0)
        .map_or(2.0, |s| s.duration_s)
        .max(0.1);
    let mut playback = Playback::new(opts.start_buffer_s.unwrap_or(seg_d));
    // A live MPD: segment i exists from availabilityStartTime + its end.
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
    let available = |i: u64| -> Instant {
        live_at.map_or(t0, |ast| {
            t0 + Duration::from_secs_f64((ast + (i + 1) as f64 * seg_d + 0.05 - unix_t0).max(0.0))
        })
    };
    let mut tracks = vec![Track::new(&m.representations, first_index)];
    if let Some(a) = m.audio.first() {
        tracks.push(Track::new(std::slice::from_ref(a), first_index));
    }
    // The session's own MPD, as a player does.
    match fetch(
        &servers,
        id,
        &avoided,
        &tracks[0].pool,
        &t.path,
        false,
        timeout,
        None,
    )
    .await
    {
        Ok(f) if f.status == 200 => report.requests += 1,
        Ok(f) => report.fail(format!("manifest: HTTP {}", f.status)),
        Err(e) => report.fail(e.to_string()),
    }
    // Video bitrate of the media downloaded but not yet in the playout
    // buffer (which holds what every track has): (media end, kbit/s).
    let mut pending_video: VecDeque<(f64, f64)> = VecDeque::new();
    let mut current_rep = 0usize;
    let mut stalls_seen = 0usize;
    let mut was = (false, false);
    let mut windows_reported = 0usize;
    if report.failed {
        playback.fail(0.0);
    }
    while !report.failed {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let level = playback.level(rel(now));
        let position = playback.position();
        let mut wake = end;
        // A video download too slow for its segment is given up and asked
        // again lower (adaptive only); looked at every 200 ms while one
        // lasts beyond half a second.
        let v = &mut tracks[0];
        if v.in_flight.is_some() && opts.quality == Quality::Adaptive && v.rep_in_flight > 0 {
            let p = &v.progress;
            match p.first_byte() {
                Some(fb)
                    if now.duration_since(fb).as_secs_f64() >= opts.abr.abandon_min_elapsed_s =>
                {
                    let lower = abr.abandon(
                        v.rep_in_flight,
                        p.got(),
                        p.total(),
                        now.duration_since(fb).as_secs_f64(),
                        seg_d,
                    );
                    if let Some(lower) = lower {
                        v.in_flight = None;
                        v.retry_at_rep = Some(lower);
                        report.requests += 1;
                        live.requests.fetch_add(1, Ordering::Relaxed);
                    } else {
                        wake = wake.min(now + Duration::from_millis(200));
                    }
                }
                Some(fb) => {
                    wake = wake.min(fb + Duration::from_secs_f64(opts.abr.abandon_min_elapsed_s));
                }
                // Nothing to judge before the first byte: look again later.
                None => {
                    let first_look =
                        v.sent + Duration::from_secs_f64(opts.abr.abandon_min_elapsed_s);
                    wake = wake.min(first_look.max(now + Duration::from_millis(200)));
                }
            }
        }
        for (k, tr) in tracks.iter_mut().enumerate() {
            if tr.in_flight.is_some() || tr.next >= tr.count {
                continue;
            }
            let room_at = {
                let target = abr.buffer_target_s(current_rep);
                let ahead = tr.end_s - position;
                if ahead < target {
                    now
                } else {
                    now + Duration::from_secs_f64(ahead - target)
                }
            };
            let at = room_at
                .max(available(tr.next))
                .max(tr.not_before.unwrap_or(now));
            if at > now {
                wake = wake.min(at);
                continue;
            }
            let rep = if k == 0 {
                let stalls = playback.stalls.len() + playback.is_stalled() as usize;
                if stalls > stalls_seen {
                    stalls_seen = stalls;
                    abr.stalled();
                }
                current_rep = match opts.quality {
                    Quality::Adaptive => match tr.retry_at_rep.take() {
                        Some(r) => r,
                        None => abr.choose((tr.end_s - position).max(0.0), seg_d),
                    },
                    q => {
                        let r = pick(m, q, None);
                        m.representations
                            .iter()
                            .position(|x| std::ptr::eq(x, r))
                            .unwrap_or(0)
                    }
                };
                current_rep
            } else {
                0
            };
            let r = &tr.reps[rep];
            if !report.representations.contains(&r.id) && k == 0 {
                report.representations.push(r.id.clone());
            }
            let Some(seg) = r.segment(tr.next) else {
                tr.count = tr.next;
                continue;
            };
            let init = (!tr.inited[rep])
                .then(|| r.init.as_deref().map(|i| path_of(t, i)))
                .flatten();
            let path = path_of(t, &seg.url);
            let (servers, avoided, pool) = (servers.clone(), avoided.clone(), tr.pool.clone());
            tr.progress = Arc::new(Progress::default());
            tr.sent = now;
            tr.rep_in_flight = rep;
            let progress = tr.progress.clone();
            tr.in_flight = Some(Box::pin(async move {
                let sent = Instant::now();
                let mut requests = 0;
                let mut result = Ok(None);
                if let Some(init) = init {
                    requests += 1;
                    result = match fetch(&servers, id, &avoided, &pool, &init, false, timeout, None)
                        .await
                    {
                        Ok(f) if (200..300).contains(&f.status) => Ok(None),
                        Ok(f) => Err(FetchError::Status(init.clone(), f.status)),
                        Err(e) => Err(e),
                    };
                }
                if result.is_ok() {
                    requests += 1;
                    result = match fetch(
                        &servers,
                        id,
                        &avoided,
                        &pool,
                        &path,
                        false,
                        timeout,
                        Some(&progress),
                    )
                    .await
                    {
                        Ok(f) if (200..300).contains(&f.status) => Ok(Some(f)),
                        Ok(f) => Err(FetchError::Status(path.clone(), f.status)),
                        Err(e) => Err(e),
                    };
                }
                Got {
                    rep,
                    sent,
                    done: Instant::now(),
                    requests,
                    result: result.map(|f| f.expect("a segment follows its init")),
                }
            }));
        }
        if tracks.iter().all(Track::done) {
            // Everything is downloaded: play out what is buffered.
            let out = now + Duration::from_secs_f64(level);
            if !playback.is_playing() || out >= end {
                break;
            }
            wake = wake.min(out);
            if out <= now {
                break;
            }
        }
        let (video, rest) = tracks.split_at_mut(1);
        let mut none = None;
        let audio = rest.first_mut().map_or(&mut none, |a| &mut a.in_flight);
        let (k, got) = tokio::select! {
            g = completion(&mut video[0].in_flight) => (0, Some(g)),
            g = completion(audio) => (1, Some(g)),
            _ = tokio::time::sleep_until(wake.into()) => (0, None),
        };
        if let Some(g) = got {
            let tr = &mut tracks[k];
            tr.in_flight = None;
            report.requests += g.requests;
            live.requests.fetch_add(g.requests, Ordering::Relaxed);
            match g.result {
                Ok(f) => {
                    report.bytes += f.bytes;
                    live.bytes.fetch_add(f.bytes, Ordering::Relaxed);
                    latencies
                        .lock()
                        .await
                        .push(g.done.duration_since(g.sent).as_secs_f64() * 1000.0);
                    let r = &tr.reps[g.rep];
                    let dur = r.segment(tr.next).map_or(seg_d, |s| s.duration_s);
                    tr.inited[g.rep] = true;
                    tr.failures = 0;
                    tr.not_before = None;
                    tr.next += 1;
                    tr.end_s += dur;
                    if k == 0 {
                        abr.observe(f.bytes, g.done.duration_since(f.first_byte).as_secs_f64());
                        pending_video.push_back((tr.end_s, r.bandwidth as f64 / 1000.0));
                    }
                    // The playout buffer holds what every track has.
                    let playable = tracks.iter().map(|t| t.end_s).fold(f64::MAX, f64::min);
                    let at = rel(g.done);
                    while let Some(&(seg_end, kbps)) = pending_video.front() {
                        let buffered = playback.buffered();
                        let upto = seg_end.min(playable);
                        if upto <= buffered + 1e-9 {
                            if seg_end <= buffered + 1e-9 {
                                pending_video.pop_front();
                                continue;
                            }
                            break;
                        }
                        playback.arrive(at, upto - buffered, kbps);
                        if upto >= seg_end - 1e-9 {
                            pending_video.pop_front();
                        } else {
                            break;
                        }
                    }
                }
                Err(e) => {
                    live.errors.fetch_add(1, Ordering::Relaxed);
                    tr.failures += 1;
                    if tr.failures > RETRIES {
                        playback.fail(rel(g.done));
                        report.fail(e.to_string());
                    } else {
                        tr.not_before = Some(g.done + RETRY_INTERVAL);
                    }
                }
            }
        }
        let now = Instant::now();
        playback.advance(rel(now));
        report_windows(
            &playback,
            &mut windows_reported,
            rel(now),
            live,
            best_kbps,
            opts.frame_rate,
        );
        let state = (playback.is_playing(), playback.is_stalled());
        track(&live.playing, was.0, state.0);
        track(&live.stalled, was.1, state.1);
        was = state;
    }
    track(&live.playing, was.0, false);
    track(&live.stalled, was.1, false);
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
