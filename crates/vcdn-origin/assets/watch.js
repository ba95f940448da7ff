// vcdn's watch page: plays ?mpd=URL (default: the 2 s test title) with
// dash.js at its default settings (so its ABR rules are dash.js's own) and
// records what a viewer sees, counted at the <video> element, in
// window.vcdnStats (read by vcdn's browser driver).
//
// - start-up delay: from just before player.initialize to the first
//   'playing' event;
// - a stall: 'waiting' after the first 'playing', until the next 'playing'
//   (dash.js's BUFFER_EMPTY fires per media type, often for audio alone,
//   without a visible stall, so it is not used);
// - every time is in ms from the same zero (performance.now() just before
//   player.initialize).
'use strict';
(function () {
  const MAX_SEGMENTS = 500;
  const MAX_ERRORS = 50;
  const video = document.getElementById('video');
  const status = document.getElementById('status');
  const mpd = new URLSearchParams(location.search).get('mpd') || 'video/testsrc-2s/manifest.mpd';
  const url = new URL(mpd, location.href).href;

  // Reset when the manifest is retried (see below).
  let t0 = performance.now();
  let zeroEpoch = performance.timeOrigin + t0;
  const now = () => performance.now() - t0;
  const ms = (d) => (d instanceof Date ? d.getTime() - zeroEpoch : null);

  const s = {
    startup_ms: null,
    stalls: 0,
    stall_done_ms: 0,
    stall_from: null,
    ended: false,
    bitrate_kbps: 0,
    switches: 0,
    errors: [],
    segments: [],
  };
  const error = (e) => {
    if (s.errors.length < MAX_ERRORS) s.errors.push(String(e));
  };

  // A fresh, JSON-able snapshot each time it is read.
  Object.defineProperty(window, 'vcdnStats', {
    get: () => ({
      url: url,
      startup_ms: s.startup_ms,
      stalls: s.stalls,
      stall_ms: s.stall_done_ms + (s.stall_from === null ? 0 : now() - s.stall_from),
      stalled: s.stall_from !== null,
      ended: s.ended,
      bitrate_kbps: s.bitrate_kbps,
      switches: s.switches,
      errors: s.errors.slice(),
      segments: s.segments.slice(),
      position_s: video.currentTime,
      buffer_s: buffered(),
      now_ms: now(),
    }),
  });

  function buffered() {
    const b = video.buffered;
    for (let i = 0; i < b.length; i++) {
      if (b.start(i) <= video.currentTime + 0.1 && video.currentTime <= b.end(i)) {
        return b.end(i) - video.currentTime;
      }
    }
    return 0;
  }

  function endStall() {
    if (s.stall_from !== null) {
      s.stall_done_ms += now() - s.stall_from;
      s.stall_from = null;
    }
  }

  video.addEventListener('playing', () => {
    if (s.startup_ms === null) {
      s.startup_ms = now();
    } else if (s.stall_from !== null) {
      endStall();
    }
  });
  video.addEventListener('waiting', () => {
    if (s.startup_ms !== null && s.stall_from === null && !s.ended) {
      s.stalls += 1;
      s.stall_from = now();
    }
  });
  video.addEventListener('ended', () => {
    endStall();
    s.ended = true;
  });
  document.addEventListener('securitypolicyviolation', (e) => error('blocked by the page policy: ' + e.violatedDirective + ' ' + e.blockedURI));
  video.addEventListener('error', () => error('video element: ' + (video.error ? video.error.message || video.error.code : 'error')));

  if (typeof dashjs === 'undefined') {
    error('dash.js did not load');
    status.textContent = 'dash.js did not load';
    return;
  }
  let retrying = null;
  const player = dashjs.MediaPlayer().create();
  const E = dashjs.MediaPlayer.events;
  const videoKbps = () => {
    try {
      const r = player.getCurrentRepresentationForType('video');
      return r ? Math.round(r.bandwidth / 1000) : 0;
    } catch (e) {
      return 0;
    }
  };
  player.on(E.QUALITY_CHANGE_RENDERED, (e) => {
    if (e.mediaType === 'video') {
      // The first rendered quality is not a switch.
      if (e.oldRepresentation) s.switches += 1;
      s.bitrate_kbps = e.newRepresentation ? Math.round(e.newRepresentation.bandwidth / 1000) : videoKbps();
    }
  });
  player.on(E.FRAGMENT_LOADING_COMPLETED, (e) => {
    const r = e.request || {};
    const rep = r.representation || {};
    s.segments.push({
      type: r.mediaType || null,
      init: r.type === 'InitializationSegment',
      url: r.url || null,
      index: Number.isFinite(r.index) ? r.index : null,
      quality_kbps: rep.bandwidth ? Math.round(rep.bandwidth / 1000) : null,
      start_ms: ms(r.startDate),
      first_byte_ms: ms(r.firstByteDate),
      end_ms: ms(r.endDate || r.requestEndDate),
      failed: !!e.error,
    });
    if (s.segments.length > MAX_SEGMENTS) s.segments.shift();
  });
  // A title the origin is still making (503) fails the manifest load:
  // before anything played, try again every 5 s for up to 3 minutes, and
  // count start-up from the attempt that works.
  // dash.js error codes: the manifest's download failed (25), so its
  // loading failed (11).
  const MANIFEST_FAILED = [25, 11];
  let manifestRetries = 0;
  player.on(E.ERROR, (e) => {
    const x = e.error || e;
    if (MANIFEST_FAILED.includes(x.code) && s.startup_ms === null && s.segments.length === 0 && manifestRetries < 36) {
      if (retrying !== null) return; // the same failure, already retried
      manifestRetries += 1;
      retrying = 'the title is not available yet (the origin may still be making it); retrying in 5 s';
      setTimeout(() => {
        retrying = null;
        t0 = performance.now();
        zeroEpoch = performance.timeOrigin + t0;
        player.attachSource(url);
      }, 5000);
      return;
    }
    error('dash.js: ' + (x.message || x.code || JSON.stringify(x)));
  });
  player.on(E.PLAYBACK_ERROR, (e) => error('playback: ' + ((e.error && e.error.message) || 'error')));
  player.on(E.STREAM_INITIALIZED, () => {
    if (!s.bitrate_kbps) s.bitrate_kbps = videoKbps();
  });

  player.initialize(video, url, true);

  setInterval(() => {
    if (!s.bitrate_kbps) s.bitrate_kbps = videoKbps();
    const st = window.vcdnStats;
    const state = retrying ? retrying : st.ended ? 'ended' : st.stalled ? 'stalled' : st.startup_ms === null ? 'starting' : 'playing';
    status.textContent =
      state + ' · ' + st.bitrate_kbps + ' kbit/s · start-up ' +
      (st.startup_ms === null ? '–' : Math.round(st.startup_ms) + ' ms') +
      ' · stalls ' + st.stalls + ' (' + Math.round(st.stall_ms) + ' ms)' +
      ' · buffer ' + st.buffer_s.toFixed(1) + ' s · at ' + st.position_s.toFixed(1) + ' s' +
      ' · quality switches ' + st.switches + ' · segments ' + s.segments.length +
      (st.errors.length ? ' · error: ' + st.errors[st.errors.length - 1] : '');
  }, 500);
})();
