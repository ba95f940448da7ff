/* vcdn portal: one page of plain JavaScript over the /v1 API, no build step.
 *
 * Structure, top to bottom:
 *   1. DOM and format helpers. API data enters the page only as textContent
 *      or attribute values (h(), svg()), never as HTML.
 *   2. api(): fetch with the session cookie and, on every non-GET, the CSRF
 *      token; a failure is an ApiError holding the RFC 9457 problem.
 *   3. Forms: showProblem() puts a problem next to its form (role=alert) and
 *      each field error next to its field.
 *   4. Shell: session, header and nav, logout, the hash router. Each page
 *      gets a context (ctx) whose timers and cleanups end when it is left.
 *   5. Customer pages: login, catalog, order, services, one service.
 *   6. Operator pages: map, hosts, customers, flavors, platform.
 *   7. Charts: a timeseries answer becomes six uPlot charts, each with a text
 *      summary; uplot.js is loaded only when a chart is first drawn.
 */
'use strict';

/* ---------- 1. DOM and format helpers ---------- */

function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === 'text') e.textContent = v;
    else if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
}
function appendKids(e, kids) {
  for (const c of kids.flat(Infinity)) {
    if (c != null && c !== false) e.append(c instanceof Node ? c : String(c));
  }
}
/** An element: h('a', {href: '#/x', text: 'X'}, ...children). */
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  appendKids(e, kids);
  return e;
}
function svg(tag, attrs, ...kids) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  setAttrs(e, attrs);
  appendKids(e, kids);
  return e;
}
/** Replaces el's children; null and false children are left out. */
function fill(el, ...kids) {
  el.replaceChildren();
  appendKids(el, kids);
  return el;
}
const byId = (id) => document.getElementById(id);
const pad2 = (n) => String(n).padStart(2, '0');
const plural = (n, one, many) => `${n} ${n === 1 ? one : many || one + 's'}`;

function fmtInt(n) { return n == null ? '—' : Math.round(n).toLocaleString('en-US'); }
function fmtNum(n, digits = 2) { return n == null ? '—' : Number(n.toFixed(digits)).toString(); }
/** A rate with at least two significant digits: 1234, 12.3, 0.0067. */
function fmtRate(v) { return v == null ? '—' : v === 0 || Math.abs(v) >= 100 ? String(Math.round(v)) : String(Number(v.toPrecision(2))); }
function fmtBytes(b) {
  if (b == null) return '—';
  const units = ['B', 'kB', 'MB', 'GB', 'TB', 'PB'];
  let i = 0;
  while (Math.abs(b) >= 1000 && i < units.length - 1) { b /= 1000; i++; }
  return `${i ? b.toFixed(b < 10 ? 2 : 1) : Math.round(b)} ${units[i]}`;
}
function fmtMoney(x, cur) {
  if (x == null) return '—';
  const s = x !== 0 && Math.abs(x) < 0.01 ? String(Number(x.toPrecision(2))) : x.toFixed(2);
  return cur ? `${s} ${cur}` : s;
}
function fmtTime(unix) {
  if (!unix) return '—';
  const d = new Date(unix * 1000);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
}
function fmtDuration(s) {
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 2 * 86400) return `${fmtNum(s / 3600, 1)} h`;
  return `${fmtNum(s / 86400, 1)} days`;
}

const TONES = {
  active: 'ok', running: 'ok', uploaded: 'ok', 'internal-ca': 'info',
  scheduled: 'busy', deploying: 'busy', starting: 'busy', draining: 'busy', deleting: 'busy',
  degraded: 'bad', failed: 'bad', unresponsive: 'bad', scale_out_failed: 'bad', qoe_below_target: 'bad',
  deleted: 'off', expired: 'off',
};
/** A small status badge. */
function badge(state, id) {
  return h('span', { id, class: `badge tone-${TONES[state] || 'info'}`, text: state || 'unknown' });
}
function dl(pairs) {
  return h('dl', { class: 'facts' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', { text: k }), h('dd', {}, v)]));
}
function table(attrs, headers, rows, caption) {
  const fit = attrs.class === 'compact' ? ' fit' : '';
  return h('div', { class: `table-wrap${fit}`, tabindex: '0', role: 'region', 'aria-label': caption || headers.join(', ') },
    h('table', attrs,
      caption ? h('caption', { text: caption }) : null,
      h('thead', {}, h('tr', {}, headers.map((t) => h('th', { scope: 'col', text: t })))),
      h('tbody', {}, rows)));
}
function loading() { return h('p', { class: 'loading', text: 'Loading…' }); }
function splitHostPort(s) {
  const m = /^\[?([^\]]*?)\]?(?::(\d+))?$/.exec(s || '');
  return m ? { host: m[1], port: m[2] } : { host: s, port: undefined };
}

/** Copies an element's text (selecting it when the clipboard is refused) and says so. */
async function copyText(el, status) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(el.textContent);
    ok = true;
  } catch {
    const range = document.createRange();
    range.selectNodeContents(el);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    try { ok = document.execCommand('copy'); } catch { ok = false; }
  }
  status.textContent = ok ? 'Copied to the clipboard.' : 'Selected: press Ctrl+C to copy.';
  setTimeout(() => { status.textContent = ''; }, 4000);
}
/** A command line in a code block with a Copy button. */
function commandLine(id, label, text, status) {
  return h('div', { class: 'cmd' },
    h('code', { id, text }),
    h('button', { type: 'button', class: 'btn btn-small',
      onclick: () => copyText(byId(id), status) }, 'Copy', h('span', { class: 'vh', text: ` the ${label}` })));
}

/* ---------- 2. API ---------- */

class ApiError extends Error {
  constructor(status, p) {
    super((p && (p.detail || p.title)) || `HTTP ${status}`);
    this.status = status;
    this.title = (p && p.title) || `Error ${status}`;
    this.detail = (p && p.detail) || '';
    this.errors = p && Array.isArray(p.errors) ? p.errors : [];
  }
}

async function api(method, path, body) {
  const opts = { method, credentials: 'same-origin', headers: { Accept: 'application/json' } };
  if (method !== 'GET') opts.headers['X-CSRF-Token'] = (session && session.csrf) || '';
  if (body !== undefined) {
    opts.headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, opts);
  } catch {
    throw new ApiError(0, { title: 'No answer', detail: 'The control plane did not answer. Check the connection and try again.' });
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = { detail: text.slice(0, 300) }; }
  }
  if (!res.ok) {
    if (res.status === 401 && session && !path.startsWith('/portal/')) sessionEnded();
    throw new ApiError(res.status, data);
  }
  return data;
}
const enc = encodeURIComponent;

/* ---------- 3. Forms and problems ---------- */

function problemBox(id) { return h('div', { id, class: 'problem', role: 'alert' }); }
function statusBox(id) { return h('div', { id, class: 'result', role: 'status' }); }
function field(id, label, input, help) {
  if (help) input.setAttribute('aria-describedby', `${id}-help`);
  return h('div', { class: 'field' }, h('label', { for: id, text: label }), input,
    help ? h('p', { id: `${id}-help`, class: 'help', text: help }) : null);
}

function clearProblem(box, form) {
  box.replaceChildren();
  if (!form) return;
  for (const e of form.querySelectorAll('.field-error')) e.remove();
  for (const i of form.querySelectorAll('[aria-invalid]')) {
    i.removeAttribute('aria-invalid');
    const help = byId(`${i.id}-help`);
    if (help) i.setAttribute('aria-describedby', help.id); else i.removeAttribute('aria-describedby');
  }
}

/** Shows a problem in box; fieldFor(name) finds the input of a field error. */
function showProblem(box, err, form, fieldFor) {
  clearProblem(box, form);
  const unplaced = [];
  for (const fe of err.errors || []) {
    const input = fieldFor && fieldFor(fe.field);
    if (!input) { unplaced.push(fe); continue; }
    const msg = h('p', { id: `${input.id}-error`, class: 'field-error', text: fe.detail });
    input.setAttribute('aria-invalid', 'true');
    const help = byId(`${input.id}-help`);
    input.setAttribute('aria-describedby', help ? `${msg.id} ${help.id}` : msg.id);
    (input.closest('.field') || input.parentElement).append(msg);
  }
  const placed = (err.errors || []).length - unplaced.length;
  const text = placed ? `${plural(placed, 'field needs', 'fields need')} fixing, as said next to ${placed === 1 ? 'it' : 'them'}.` : err.detail;
  box.append(h('strong', { text: err.title }), text ? ` ${text}` : '');
  if (unplaced.length) box.append(h('ul', {}, unplaced.map((fe) => h('li', { text: `${fe.field}: ${fe.detail}` }))));
}

/** Wires a form's submit to an async action, with its button busy meanwhile. */
function onSubmit(form, box, action, fieldFor) {
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const button = ev.submitter || form.querySelector('[type=submit]');
    clearProblem(box, form);
    if (button) button.disabled = true;
    try {
      await action();
    } catch (err) {
      if (err instanceof ApiError) showProblem(box, err, form, fieldFor); else throw err;
    } finally {
      if (button) button.disabled = false;
    }
  });
}

/* ---------- 4. Shell: session, nav, router ---------- */

let session = null; // {role, customer?, csrf}; the key itself is never kept
let page = null; // the current page's context
let wanted = null; // where to go after login
let loginNotice = ''; // why the login page is shown, when a session ended
const HINT = 'vcdn-portal-session'; // says only "a session may exist", never the key

const NAV = {
  customer: [['#/catalog', 'Catalog'], ['#/order', 'Order'], ['#/services', 'Services']],
  operator: [['#/map', 'Map'], ['#/hosts', 'Hosts'], ['#/services', 'Services'], ['#/customers', 'Customers'],
    ['#/flavors', 'Flavors'], ['#/platform', 'Platform']],
};
const ROUTES = {
  login: [pageLogin, null, 'Log in'],
  catalog: [pageCatalog, 'any', 'Catalog'],
  order: [pageOrder, 'customer', 'Order a service'],
  services: [pageServices, 'any', 'Services'],
  service: [pageService, 'any', 'Service'],
  map: [pageMap, 'operator', 'Regions'],
  hosts: [pageHosts, 'operator', 'Hosts'],
  customers: [pageCustomers, 'operator', 'Customers'],
  flavors: [pageFlavors, 'operator', 'Flavors'],
  platform: [pagePlatform, 'operator', 'Platform'],
};
const home = () => (session && session.role === 'operator' ? '#/map' : '#/services');

function renderShell() {
  const links = session ? NAV[session.role] : [];
  fill(byId('nav'), h('ul', {}, links.map(([href, label]) => h('li', {}, h('a', { href, text: label })))));
  fill(byId('who'), ...(session ? [
    h('span', { class: 'who-role', text: session.role === 'operator' ? 'Operator' : `Customer ${session.name || session.customer}` }),
    h('button', { id: 'logout', type: 'button', class: 'btn btn-quiet', text: 'Log out', onclick: logout }),
  ] : []));
  markNav();
}
function markNav() {
  const section = location.hash.split('/')[1] || '';
  for (const a of byId('nav').querySelectorAll('a')) {
    if (a.getAttribute('href') === `#/${section}`) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

async function logout() {
  try { await api('POST', '/portal/logout'); } catch { /* the session is gone either way */ }
  session = null;
  localStorage.removeItem(HINT);
  renderShell();
  location.hash = '#/login';
}
function sessionEnded() {
  if (!session) return;
  loginNotice = 'Your session ended. Log in again to go on.';
  session = null;
  localStorage.removeItem(HINT);
  wanted = location.hash;
  renderShell();
  location.hash = '#/login';
}

function startPage() {
  endPage();
  page = { alive: true, cleanups: [] };
  return page;
}
function endPage() {
  if (!page) return;
  page.alive = false;
  for (const f of page.cleanups) { try { f(); } catch { /* already gone */ } }
  page = null;
}
/** Runs fn every ms (no overlap) while the page lives; at once too when now. */
function every(ctx, ms, fn, now) {
  let timer;
  const loop = async () => {
    if (!ctx.alive) return;
    try { await fn(); } catch (err) { if (!(err instanceof ApiError)) console.warn(err); }
    if (ctx.alive) timer = setTimeout(loop, ms);
  };
  timer = setTimeout(loop, now ? 0 : ms);
  ctx.cleanups.push(() => clearTimeout(timer));
}
/** Replaces the page's content. */
function mount(...nodes) { fill(byId('main'), ...nodes); }
/** Shows a load failure in place of the page's content. */
function failed(where, err) {
  fill(where, h('div', { class: 'problem', role: 'alert' }, h('strong', { text: err.title || 'Error' }), ` ${err.detail || err.message}`));
}

let routedOnce = false;
function route() {
  const hash = location.hash;
  if (!hash.startsWith('#/') || hash === '#/') {
    if (!hash || hash === '#/') location.replace(session ? home() : '#/login');
    return;
  }
  let parts;
  try { parts = hash.slice(2).split('/').map(decodeURIComponent); } catch { parts = ['']; }
  let name = parts[0];
  if (name === 'services' && parts[1]) name = 'service';
  const r = ROUTES[name];
  if (!session && name !== 'login') { wanted = hash; location.replace('#/login'); return; }
  markNav();
  const ctx = startPage();
  const [fn, role, title] = r || [pageNotFound, null, 'Not found'];
  document.title = `${title} · vcdn`;
  if (role && role !== 'any' && session.role !== role) pageForbidden(role);
  else fn(ctx, parts[1]);
  if (routedOnce && !byId('main').contains(document.activeElement)) {
    const h1 = document.querySelector('main h1');
    if (h1) { h1.setAttribute('tabindex', '-1'); h1.focus({ preventScroll: true }); }
    window.scrollTo(0, 0);
  }
  routedOnce = true;
}
function pageNotFound() {
  mount(h('h1', { text: 'Not found' }), h('p', {}, 'No page here. ', h('a', { href: home(), text: 'Go to the start page' })));
}
function pageForbidden(role) {
  mount(h('h1', { text: 'Not available' }), h('p', { text: `This page is for ${role}s.` }), h('p', {}, h('a', { href: home(), text: 'Go to the start page' })));
}

async function start() {
  byId('skip').addEventListener('click', (ev) => { ev.preventDefault(); byId('main').focus(); });
  window.addEventListener('hashchange', route);
  if (localStorage.getItem(HINT)) {
    try { session = await api('GET', '/portal/session'); } catch { localStorage.removeItem(HINT); }
  }
  renderShell();
  route();
  const idle = window.requestIdleCallback || ((f) => setTimeout(f, 300));
  if (session) idle(() => loadUplot().catch(() => {}));
}

/* ---------- 5. Customer pages ---------- */

function pageLogin(ctx) {
  if (session) { location.replace(home()); return; }
  const box = problemBox('login-problem');
  const input = h('input', { id: 'key', name: 'key', type: 'password', autocomplete: 'off', spellcheck: 'false', required: true });
  const form = h('form', { id: 'login', class: 'card narrow', novalidate: true },
    field('key', 'API key or operator token', input, 'The key opens a session; this page never stores it.'),
    box, h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn btn-primary', text: 'Log in' })));
  onSubmit(form, box, async () => {
    const key = input.value.trim();
    if (!key) throw new ApiError(0, { title: 'Key missing.', detail: 'Enter your API key (vk_…) or the operator token.' });
    session = await api('POST', '/portal/login', { key });
    input.value = '';
    localStorage.setItem(HINT, '1');
    renderShell();
    const to = wanted && wanted !== '#/login' ? wanted : home();
    wanted = null;
    location.hash = to;
    loadUplot().catch(() => {});
  });
  mount(h('div', { class: 'login' }, h('h1', { text: 'Log in to vcdn' }),
    h('p', { class: 'lead', text: 'Order and watch your virtual CDNs, or run the platform as its operator.' }),
    loginNotice ? h('p', { class: 'notice', role: 'status', text: loginNotice }) : null, form));
  loginNotice = '';
  if (!ctx.alive) return;
  input.focus();
}

async function pageCatalog(ctx) {
  const body = h('div', {}, loading());
  mount(h('h1', { text: 'Catalog' }), h('p', { class: 'lead', text: 'What you can order: flavors of vCDN and the regions they run in.' }), body);
  let cat;
  try { cat = await api('GET', '/v1/catalog'); } catch (err) { failed(body, err); return; }
  if (!ctx.alive) return;
  fill(body, 
    h('h2', { text: 'Flavors' }),
    h('div', { class: 'cards' }, cat.flavors.map(flavorCard)),
    h('h2', { text: 'Regions' }),
    table({ id: 'catalog-regions', class: 'compact' }, ['Region', 'Latitude', 'Longitude'],
      cat.regions.map((r) => h('tr', {}, h('th', { scope: 'row', text: r.name }), h('td', { text: fmtNum(r.lat) }), h('td', { text: fmtNum(r.lon) }))), 'Regions on offer'),
    session.role === 'customer' ? h('p', {}, h('a', { class: 'btn btn-primary', href: '#/order', text: 'Order a service' })) : null);
}
function pricingText(p) {
  const parts = [`${fmtMoney(p.per_vcpu_hour, p.currency)} per vCPU-hour`];
  if (p.per_gb) parts.push(`${fmtMoney(p.per_gb, p.currency)} per GB`);
  if (p.per_million_requests) parts.push(`${fmtMoney(p.per_million_requests, p.currency)} per million requests`);
  return parts.join(', ');
}
function instanceRange(t) {
  const max = t.max_instances || 16;
  return max === t.min_instances ? String(max) : `${t.min_instances} to ${max}`;
}
function flavorCard(f) {
  const t = f.template;
  return h('article', { class: 'card' },
    h('h3', {}, f.name, ' ', f.kind !== f.name ? badge(f.kind) : null),
    h('p', { text: f.description || '' }),
    dl([
      ['Pricing', `${f.pricing.scheme.replace('_', ' ')}: ${pricingText(f.pricing)}`],
      ['Instances', `${instanceRange(t)} per region, ${t.vcpus_per_instance} vCPU and ${t.memory_mib_per_instance} MiB each`],
      ['Placement', t.placement || 'consolidate'],
      ['Regions', t.allowed_regions && t.allowed_regions.length ? t.allowed_regions.join(', ') : 'all'],
    ]));
}

async function pageOrder(ctx) {
  const body = h('div', {}, loading());
  mount(h('h1', { text: 'Order a service' }), body);
  let cat;
  try { cat = await api('GET', '/v1/catalog'); } catch (err) { failed(body, err); return; }
  if (!ctx.alive) return;
  fill(body, orderForm(cat));
}

function orderForm(cat) {
  const input = (id, attrs) => h('input', Object.assign({ id, name: id }, attrs));
  const flavor = h('select', { id: 'flavor', name: 'flavor' }, cat.flavors.map((f) => h('option', { value: f.name, text: f.name === f.kind ? f.name : `${f.name} (${f.kind})` })));
  const flavorHelp = () => {
    const f = cat.flavors.find((x) => x.name === flavor.value);
    return f ? `${f.description || ''} ${pricingText(f.pricing)}.`.trim() : '';
  };
  const box = problemBox('problem');
  const result = h('div', { id: 'plan-result', class: 'plan', 'aria-live': 'polite' });
  const planBtn = h('button', { id: 'plan', type: 'submit', class: 'btn btn-primary', text: 'Check plan and price' });
  const form = h('form', { id: 'order', class: 'card', novalidate: true },
    h('div', { class: 'grid2' },
      field('name', 'Name', input('name', { autocomplete: 'off', required: true, pattern: '[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?' }), 'Lowercase letters, digits and hyphens, like my-video.'),
      field('hostname', 'Hostname', input('hostname', { autocomplete: 'off', required: true }), 'The name your viewers use, like video.example.com.'),
      field('origin', 'Origin URL', input('origin', { type: 'url', autocomplete: 'off', required: true }), 'Where the caches fetch content, like https://origin.example.com.'),
      field('flavor', 'Flavor', flavor, flavorHelp())),
    h('fieldset', {}, h('legend', { text: 'Demand per region (peak concurrent users; leave empty to skip a region)' }),
      h('div', { class: 'grid3' }, cat.regions.map((r) =>
        field(`demand-${r.name}`, r.name, input(`demand-${r.name}`, { type: 'number', min: '1', step: '1', inputmode: 'numeric' }))))),
    h('div', { class: 'grid3' },
      field('min-mos', 'Quality target (min MOS, 1 to 5)', input('min-mos', { type: 'number', min: '1', max: '5', step: '0.1', value: '4' })),
      field('lease-hours', 'Lease (hours)', input('lease-hours', { type: 'number', min: '1', step: '1', value: '24' })),
      field('accelerate', 'Acceleration paths (optional)', input('accelerate', { autocomplete: 'off' }), 'Comma separated prefixes, like /api/, /live/.')),
    box, h('div', { class: 'actions' }, planBtn), result);
  flavor.addEventListener('change', () => { byId('flavor-help').textContent = flavorHelp(); });

  let sent = [];
  const fieldFor = (name) => {
    const m = /^regions\[(\d+)\]/.exec(name);
    if (m) return sent[+m[1]] ? byId(`demand-${sent[+m[1]].region}`) : null;
    if (name === 'regions') return form.querySelector('[id^="demand-"]');
    const ids = { name: 'name', origin: 'origin', hostname: 'hostname', flavor: 'flavor', quality: 'min-mos', lease: 'lease-hours', acceleration: 'accelerate' };
    return byId(ids[name.split(/[.[]/)[0]]);
  };
  const spec = () => {
    const v = (id) => byId(id).value.trim();
    sent = cat.regions.map((r) => ({ region: r.name, v: v(`demand-${r.name}`) }))
      .filter((x) => x.v !== '' && x.v !== '0').map((x) => ({ region: x.region, peak_users: Number(x.v) }));
    if (!sent.length) throw new ApiError(0, { title: 'No demand.', detail: 'Give the peak users of at least one region.' });
    const bad = sent.map((r, i) => (Number.isInteger(r.peak_users) && r.peak_users > 0 ? null : { field: `regions[${i}].peak_users`, detail: 'Give a whole number of users, 1 or more.' })).filter(Boolean);
    if (bad.length) throw new ApiError(0, { title: 'Check the demand.', errors: bad });
    const s = { name: v('name'), origin: v('origin'), hostname: v('hostname'), flavor: flavor.value, regions: sent };
    if (v('min-mos')) s.quality = { min_mos: Number(v('min-mos')) };
    if (v('lease-hours')) s.lease = { duration_s: Math.round(Number(v('lease-hours')) * 3600) };
    const paths = v('accelerate').split(',').map((p) => p.trim()).filter(Boolean);
    if (paths.length) s.acceleration = { paths };
    return s;
  };
  onSubmit(form, box, async () => {
    result.replaceChildren();
    const s = spec();
    const plan = await api('POST', '/v1/services?dry_run=true', s);
    fill(result, ...planView(plan, cat, s, box, form, fieldFor));
  }, fieldFor);
  form.addEventListener('input', () => {
    if (result.firstChild) fill(result, h('p', { class: 'muted', text: 'The order changed: check the plan and price again.' }));
  });
  return form;
}

/** The dry run's answer: instances and vCPUs per region, the price, and the Order button. */
function planView(plan, cat, s, box, form, fieldFor) {
  const f = cat.flavors.find((x) => x.name === s.flavor);
  const cost = plan.cost || {};
  const cur = cost.currency || (f && f.pricing.currency);
  const graph = plan.graph || {};
  const rows = (graph.regions || []).map((r) => {
    const inst = r.instances || [];
    const vcpus = inst.reduce((a, i) => a + (i.vcpus || 0), 0);
    const mem = inst.reduce((a, i) => a + (i.memory_mib || 0), 0);
    return h('tr', {}, h('th', { scope: 'row', text: r.region }), h('td', { text: inst.length }), h('td', { text: vcpus }), h('td', { text: `${mem} MiB` }));
  });
  if (graph.accel && graph.accel.proxies) {
    const n = graph.accel.proxies.length;
    rows.push(h('tr', {}, h('th', { scope: 'row', text: 'acceleration proxies' }), h('td', { text: n }), h('td', { text: n }), h('td', { text: '—' })));
  }
  const lease = plan.lease || {};
  let price = `Price: ${fmtMoney(cost.total, cur)} for the lease of ${fmtDuration((lease.end || 0) - (lease.start || 0))}`;
  if (lease.start) price += ` (${fmtTime(lease.start)} to ${fmtTime(lease.end)})`;
  if (f && f.pricing.scheme === 'on_demand' && (f.pricing.per_gb || f.pricing.per_million_requests)) price += `, plus usage at ${pricingText(f.pricing).split(', ').slice(1).join(' and ')}`;
  const confirm = h('button', { id: 'confirm', type: 'button', class: 'btn btn-primary', text: `Order for ${fmtMoney(cost.total, cur)}` });
  confirm.addEventListener('click', async () => {
    confirm.disabled = true;
    clearProblem(box, form);
    try {
      const svc = await api('POST', '/v1/services', s);
      location.hash = `#/services/${enc(svc.id)}`;
    } catch (err) {
      confirm.disabled = false;
      if (err instanceof ApiError) showProblem(box, err, form, fieldFor); else throw err;
    }
  });
  return [h('h2', { text: 'Plan' }),
    table({ class: 'compact' }, ['Region', 'Instances', 'vCPUs', 'Memory'], rows, 'Instances the order would start'),
    h('p', { class: 'price', text: `${price}.` }),
    h('div', { class: 'actions' }, confirm, h('span', { class: 'muted', text: 'Nothing is reserved until you order.' }))];
}

async function pageServices(ctx) {
  const op = session.role === 'operator';
  const body = h('div', {}, loading());
  mount(h('div', { class: 'page-head' }, h('h1', { text: op ? 'All services' : 'Services' }),
    op ? null : h('a', { class: 'btn btn-primary', href: '#/order', text: 'Order a service' })), body);
  let list, customers;
  try {
    [list, customers] = await Promise.all([api('GET', '/v1/services'), op ? api('GET', '/v1/customers').catch(() => null) : null]);
  } catch (err) { failed(body, err); return; }
  if (!ctx.alive) return;
  const names = new Map(((customers && customers.customers) || []).map((c) => [c.id, c.name]));
  const services = (list.services || []).slice().sort((a, b) => (b.created_at || 0) - (a.created_at || 0));
  if (!services.length) {
    fill(body, h('p', {}, 'No services yet. ', op ? '' : h('a', { href: '#/order', text: 'Order your first one.' })));
    return;
  }
  const live = services.filter((s) => !['deleted', 'expired'].includes(s.state)).length;
  const headers = ['Name', 'State', 'Hostname', 'Flavor', 'Regions'].concat(op ? ['Customer'] : [], ['Cost', 'Created']);
  const tbody = document.createDocumentFragment();
  for (const s of services) tbody.append(serviceRow(s, op, names));
  fill(body, h('p', { class: 'muted', text: `${plural(services.length, 'service')}, ${live} live.` }),
    table({ id: 'services' }, headers, tbody, op ? 'Services of every customer' : 'Your services'));
}
function serviceRow(s, op, names) {
  const cost = s.cost || {};
  return h('tr', { 'data-id': s.id },
    h('th', { scope: 'row' }, h('a', { href: `#/services/${enc(s.id)}`, text: s.name })),
    h('td', {}, badge(s.state)),
    h('td', { text: s.hostname }),
    h('td', { text: s.flavor }),
    h('td', { text: (s.regions || []).map((r) => r.region).join(', ') }),
    op ? h('td', { text: names.get(s.customer) ? `${names.get(s.customer)} (${s.customer})` : s.customer }) : null,
    h('td', { class: 'num', text: fmtMoney(cost.total, cost.currency) }),
    h('td', { text: fmtTime(s.created_at) }));
}

/* The service page: sections built once, the changing ones refreshed. */
async function pageService(ctx, id) {
  const title = h('h1', { text: id });
  const body = h('div', {}, loading());
  mount(h('p', { class: 'crumbs' }, h('a', { href: '#/services', text: 'Services' }), ' / ', id), title, body);
  let svc;
  try { svc = await api('GET', `/v1/services/${enc(id)}`); } catch (err) { failed(body, err); return; }
  if (!ctx.alive) return;
  fill(title, svc.name, ' ', badge(svc.state, 'state'));
  document.title = `${svc.name} · vcdn`;
  const parts = {
    facts: h('div'), entry: h('section', { id: 'entry-point', class: 'card', 'aria-labelledby': 'entry-h' }),
    usage: h('section', { class: 'card', 'aria-labelledby': 'usage-h' }), instances: h('section', { 'aria-labelledby': 'inst-h' }),
  };
  const ended = ['deleted', 'expired'].includes(svc.state);
  const refresh = async () => {
    const s = await api('GET', `/v1/services/${enc(svc.id)}`);
    if (ctx.alive) showService(s, title, parts);
  };
  fill(body, parts.facts,
    h('div', { class: 'grid2' }, parts.entry, parts.usage),
    parts.instances,
    chartsPanel(ctx, `/v1/services/${enc(svc.id)}/timeseries`, { currency: (svc.cost && svc.cost.currency) || '' }),
    ended ? null : h('section', { 'aria-labelledby': 'content-h' }, h('h2', { id: 'content-h', text: 'Content' }),
      h('div', { class: 'grid2' }, purgeForm(svc), prefetchForm(svc))),
    ended ? null : certificateSection(ctx, svc),
    eventsSection(ctx, svc, refresh),
    ended ? null : deleteSection(svc, (s) => showService(s, title, parts)));
  showService(svc, title, parts);
  every(ctx, 10000, refresh);
}

function showService(s, title, parts) {
  const state = byId('state');
  state.textContent = s.state;
  state.className = `badge tone-${TONES[s.state] || 'info'}`;
  const lease = s.lease || {};
  fill(parts.facts, h('p', { class: 'muted' },
    `${s.id} · flavor ${s.flavor} · lease ${fmtTime(lease.start)} to ${fmtTime(lease.end)}`,
    session.role === 'operator' ? ` · customer ${s.customer}` : ''),
  s.error ? h('div', { class: 'problem', role: 'alert', text: s.error }) : '');
  fill(parts.entry, ...entryPoint(s));
  fill(parts.usage, ...usageView(s));
  fill(parts.instances, ...instancesView(s));
  for (const b of document.querySelectorAll('#delete, #delete-confirm')) b.disabled = ['deleted', 'deleting'].includes(s.state);
}

function entryPoint(s) {
  const ep = s.entry_point || {};
  const dns = splitHostPort(ep.dns_server);
  const dig = `dig @${dns.host}${dns.port && dns.port !== '53' ? ` -p ${dns.port}` : ''} ${ep.hostname} +short`;
  const first = ((s.graph && s.graph.regions) || []).flatMap((r) => r.instances || []).find((i) => i.state === 'running');
  const ip = first ? splitHostPort(first.address).host : null;
  const addr = ip && ip.includes(':') ? `[${ip}]` : ip;
  const curl = addr ? `curl -si --resolve ${ep.hostname}:${ep.port}:${addr} ${ep.url}` : `curl -si ${ep.url}`;
  const status = h('p', { class: 'muted', role: 'status' });
  const accel = s.acceleration;
  return [h('h2', { id: 'entry-h', text: 'Entry point' }),
    dl([['Hostname', h('code', { text: ep.hostname })], ['URL', h('code', { text: ep.url })],
      ep.https_url ? ['HTTPS URL', h('code', { text: ep.https_url })] : null,
      ['DNS server', h('code', { text: ep.dns_server || '—' })],
      ep.http_routing ? ['HTTP routing', h('code', { text: ep.http_routing })] : null,
      accel ? ['Acceleration', `${accel.hostname || ''}: ${(accel.paths || []).join(', ') || 'uncacheable content'}`] : null]),
    h('h3', { text: 'Try it' }),
    commandLine('dig-line', 'dig', dig, status),
    commandLine('curl-line', 'curl', curl, status),
    status];
}

function usageView(s) {
  const u = s.usage || {};
  const c = s.cost || {};
  return [h('h2', { id: 'usage-h', text: 'Usage and cost' }),
    dl([['Requests', fmtInt(u.requests)], ['Bytes', fmtBytes(u.bytes)], ['vCPU-hours', fmtNum((u.vcpu_seconds || 0) / 3600, 3)],
      ['Cost so far', h('strong', { text: fmtMoney(c.total, c.currency) })],
      ['Billing', `${(c.scheme || '').replace('_', ' ')}: base ${fmtMoney(c.base, c.currency)}, usage ${fmtMoney(c.extra, c.currency)}`]])];
}

function instancesView(s) {
  const graph = s.graph || {};
  const qoe = s.qoe || {};
  const load = s.load || {};
  const demand = new Map((s.regions || []).map((r) => [r.region, r]));
  const rows = [];
  const summary = [];
  for (const r of graph.regions || []) {
    const inst = r.instances || [];
    const q = qoe[r.region] || {};
    const d = demand.get(r.region) || {};
    summary.push(h('li', {}, h('strong', { text: r.region }),
      ` · ${d.peak_users ? `${fmtInt(d.peak_users)} peak users` : d.requests_per_s ? `${d.requests_per_s} requests/s` : 'demand —'}`,
      ` · ${plural(inst.length, 'instance')} · load ${fmtNum(load[r.region] || 0)}`,
      q.estimated_mos != null ? ` · MOS estimated ${fmtNum(q.estimated_mos)}` : '',
      q.reported_mos != null ? `, reported ${fmtNum(q.reported_mos)}` : ''));
    for (const i of inst) rows.push(instanceRow(r.region, i));
  }
  for (const p of (graph.accel && graph.accel.proxies) || []) rows.push(instanceRow(p.location || '—', Object.assign({ role: 'proxy' }, p)));
  return [h('h2', { id: 'inst-h', text: 'Regions and instances' }), h('ul', { class: 'chips' }, summary),
    table({ id: 'instances' }, ['Region', 'Instance', 'Role', 'Host', 'Address', 'vCPUs', 'State', 'Started'], rows, 'Instances per region')];
}
function instanceRow(region, i) {
  return h('tr', {}, h('th', { scope: 'row', text: region }), h('td', { text: i.id }), h('td', { text: i.role || 'cache' }),
    h('td', { text: i.host }), h('td', {}, h('code', { text: i.address })), h('td', { class: 'num', text: i.vcpus == null ? '—' : i.vcpus }),
    h('td', {}, badge(i.state)), h('td', { text: fmtTime(i.started_at) }));
}

/** Sums a purge or prefetch answer: how many caches did it, and what failed. */
function perInstance(answer, what) {
  const all = (answer && answer.instances) || [];
  const ok = all.filter((i) => i.status >= 200 && i.status < 300);
  const bad = all.filter((i) => !(i.status >= 200 && i.status < 300));
  let text = `${what(ok)} on ${ok.length} of ${plural(all.length, 'cache')}.`;
  for (const b of bad) text += ` ${b.instance} (${b.region}): ${b.status} ${(b.result && (b.result.detail || b.result.error)) || ''}`;
  return text;
}

function purgeForm(svc) {
  const box = problemBox('purge-problem');
  const result = statusBox('purge-result');
  const url = h('input', { id: 'purge-url', name: 'purge-url', autocomplete: 'off', placeholder: '/video/title/' });
  const mode = (value, label, checked) => h('label', { class: 'radio' },
    h('input', { type: 'radio', name: 'purge-mode', value, checked, onchange: () => { url.disabled = value === 'all'; } }), ` ${label}`);
  const form = h('form', { id: 'purge', class: 'card', novalidate: true },
    h('h3', { text: 'Purge' }),
    h('fieldset', { class: 'inline' }, h('legend', { text: 'What to purge' }),
      mode('url', 'One URL', true), mode('prefix', 'Everything under a prefix'), mode('all', 'Everything')),
    field('purge-url', 'Path or prefix', url, 'A path on the service, starting with /.'),
    box, h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn', text: 'Purge' })), result);
  onSubmit(form, box, async () => {
    result.textContent = '';
    const m = form.querySelector('input[name=purge-mode]:checked').value;
    const path = url.value.trim();
    if (m !== 'all' && !path.startsWith('/')) throw new ApiError(0, { title: 'Path missing.', detail: 'Give a path starting with /, or choose Everything.' });
    const a = await api('POST', `/v1/services/${enc(svc.id)}/purge`, m === 'all' ? { all: true } : { [m]: path });
    result.textContent = perInstance(a, (ok) => `Purged ${plural(ok.reduce((n, i) => n + ((i.result && i.result.purged) || 0), 0), 'object')}`);
  }, () => url);
  return form;
}

function prefetchForm(svc) {
  const box = problemBox('prefetch-problem');
  const result = statusBox('prefetch-result');
  const url = h('input', { id: 'prefetch-url', name: 'prefetch-url', autocomplete: 'off', placeholder: '/video/title/manifest.mpd' });
  const form = h('form', { id: 'prefetch', class: 'card', novalidate: true },
    h('h3', { text: 'Prefetch' }),
    h('p', { class: 'muted', text: 'Fetch an object into every cache before viewers ask for it.' }),
    field('prefetch-url', 'Path', url),
    box, h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn', text: 'Prefetch' })), result);
  onSubmit(form, box, async () => {
    result.textContent = '';
    const path = url.value.trim();
    if (!path.startsWith('/')) throw new ApiError(0, { title: 'Path missing.', detail: 'Give a path starting with /.' });
    const a = await api('POST', `/v1/services/${enc(svc.id)}/prefetch`, { url: path });
    const first = ((a && a.instances) || []).find((i) => i.result) || {};
    const r = first.result || {};
    result.textContent = perInstance(a, () => `Fetched ${path}${r.status ? ` (origin answered ${r.status}, ${fmtBytes(r.bytes)})` : ''}`);
  }, () => url);
  return form;
}

function certificateSection(ctx, svc) {
  const view = h('div', {}, loading());
  const box = problemBox('cert-problem');
  const result = statusBox('cert-result');
  const path = `/v1/services/${enc(svc.id)}/certificate`;
  const show = (c) => {
    fill(view, dl([['Source', badge(c.source)], ['Names', (c.names || []).join(', ')], ['Issuer', c.issuer],
      ['Valid', `${c.not_before || '—'} to ${c.not_after || '—'}`], ['Fingerprint', h('code', { class: 'wrap', text: c.fingerprint })]]),
    c.source === 'uploaded' ? h('button', { id: 'cert-revert', type: 'button', class: 'btn', text: 'Revert to the internal CA', onclick: revert }) : null);
  };
  const load = async () => { try { const c = await api('GET', path); if (ctx.alive) show(c); } catch (err) { failed(view, err); } };
  const revert = async () => {
    clearProblem(box, form);
    try { show(await api('DELETE', path).then(() => api('GET', path))); result.textContent = 'The internal CA issued a new certificate.'; } catch (err) { showProblem(box, err, form); }
  };
  const certPem = h('textarea', { id: 'cert-pem', name: 'cert-pem', rows: '5', spellcheck: 'false' });
  const keyPem = h('textarea', { id: 'key-pem', name: 'key-pem', rows: '5', spellcheck: 'false', autocomplete: 'off' });
  const form = h('form', { id: 'certificate-upload', novalidate: true },
    h('h3', { text: 'Upload your own' }),
    h('div', { class: 'grid2' }, field('cert-pem', 'Certificate chain (PEM)', certPem, 'The server certificate first, then each issuer.'),
      field('key-pem', 'Private key (PEM)', keyPem, 'PKCS#8, SEC1 EC or PKCS#1 RSA; sent once, never shown again.')),
    box, h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn', text: 'Upload certificate' })), result);
  onSubmit(form, box, async () => {
    result.textContent = '';
    const c = await api('PUT', path, { cert_pem: certPem.value, key_pem: keyPem.value });
    keyPem.value = '';
    certPem.value = '';
    show(c && c.fingerprint ? c : await api('GET', path));
    result.textContent = 'Certificate uploaded; the caches serve it now.';
  }, (f) => (f === 'cert_pem' ? certPem : f === 'key_pem' ? keyPem : null));
  load();
  return h('section', { id: 'certificate', class: 'card', 'aria-labelledby': 'cert-h' }, h('h2', { id: 'cert-h', text: 'Certificate' }), view, form);
}

/** The event stream: all events, then every 2 s those after the last one. */
function eventsSection(ctx, svc, onNew) {
  const list = h('ol', { id: 'events', class: 'events', 'aria-live': 'polite', 'aria-relevant': 'additions', tabindex: '0', 'aria-label': 'Events, oldest first' });
  let last = 0;
  const add = (events) => {
    const atEnd = list.scrollTop + list.clientHeight >= list.scrollHeight - 8;
    const frag = document.createDocumentFragment();
    for (const e of events) {
      last = Math.max(last, e.seq);
      const d = new Date(e.at_ms);
      frag.append(h('li', {}, h('time', { datetime: d.toISOString(), text: `${fmtTime(e.at_ms / 1000)}:${pad2(d.getSeconds())}` }),
        ' ', badge(e.kind), ' ', h('span', { text: e.detail || '' })));
    }
    list.append(frag);
    if (atEnd) list.scrollTop = list.scrollHeight;
  };
  const poll = async () => {
    const a = await api('GET', `/v1/services/${enc(svc.id)}/events?after=${last}`);
    if (!ctx.alive || !a.events || !a.events.length) return;
    const first = last === 0;
    add(a.events);
    if (!first) onNew().catch(() => {});
  };
  every(ctx, 2000, poll, true);
  return h('section', { 'aria-labelledby': 'events-h' }, h('h2', { id: 'events-h', text: 'Events' }), list);
}

/** Delete in two steps: Delete shows Confirm delete. */
function deleteSection(svc, onDeleted) {
  const box = problemBox('delete-problem');
  const result = statusBox('delete-result');
  const confirm = h('button', { id: 'delete-confirm', type: 'button', class: 'btn btn-danger', text: 'Confirm delete' });
  const cancel = h('button', { type: 'button', class: 'btn btn-quiet', text: 'Cancel' });
  const ask = h('div', { id: 'delete-ask', class: 'actions', hidden: true },
    h('span', { text: 'Its caches stop and its hostname stops answering. ' }), confirm, cancel);
  const del = h('button', { id: 'delete', type: 'button', class: 'btn btn-danger-quiet', 'aria-expanded': 'false', 'aria-controls': 'delete-ask', text: 'Delete' });
  del.addEventListener('click', () => { ask.hidden = false; del.setAttribute('aria-expanded', 'true'); confirm.focus(); });
  cancel.addEventListener('click', () => { ask.hidden = true; del.setAttribute('aria-expanded', 'false'); del.focus(); });
  confirm.addEventListener('click', async () => {
    confirm.disabled = true;
    box.replaceChildren();
    try {
      const s = await api('DELETE', `/v1/services/${enc(svc.id)}`);
      ask.hidden = true;
      result.textContent = 'The service is deleted.';
      if (s && s.state) onDeleted(s);
    } catch (err) {
      confirm.disabled = false;
      showProblem(box, err);
    }
  });
  return h('section', { class: 'card danger', 'aria-labelledby': 'delete-h' }, h('h2', { id: 'delete-h', text: 'Delete the service' }),
    h('div', { class: 'actions' }, del), ask, box, result);
}

/* ---------- 6. Operator pages ---------- */

async function pageMap(ctx) {
  const body = h('div', {}, loading());
  mount(h('h1', { text: 'Regions' }), body);
  let regions, hosts;
  try {
    [regions, hosts] = await Promise.all([api('GET', '/v1/regions'), api('GET', '/v1/hosts')]);
  } catch (err) { failed(body, err); return; }
  if (!ctx.alive) return;
  const cap = capacityByRegion(hosts.hosts || []);
  const rs = regions.regions || [];
  const width = Math.round(Math.min(1200, Math.max(300, body.clientWidth - 18)));
  fill(body, h('figure', { class: 'card map' }, regionMap(rs, cap, width),
    h('figcaption', { class: 'muted', text: 'Equirectangular projection of the regions’ coordinates; dot size follows vCPUs, colour how many are used.' })),
  table({ id: 'regions' }, ['Region', 'Latitude', 'Longitude', 'Hosts', 'vCPUs used', 'vCPUs total', 'Instance block', 'Client ranges'],
    rs.map((r) => {
      const c = cap.get(r.name) || { hosts: 0, used: 0, total: 0 };
      return h('tr', {}, h('th', { scope: 'row', text: r.name }), h('td', { text: r.lat == null ? '—' : fmtNum(r.lat) }), h('td', { text: r.lon == null ? '—' : fmtNum(r.lon) }),
        h('td', { class: 'num', text: c.hosts }), h('td', { class: 'num', text: c.used }), h('td', { class: 'num', text: c.total }),
        h('td', {}, h('code', { text: r.instance_block })), h('td', { text: (r.clients || []).join(', ') || '—' }));
    }), 'Regions'));
}
function capacityByRegion(hosts) {
  const m = new Map();
  for (const x of hosts) {
    const c = m.get(x.region) || { hosts: 0, used: 0, total: 0 };
    c.hosts++; c.used += x.used_vcpus || 0; c.total += x.vcpus || 0;
    m.set(x.region, c);
  }
  return m;
}

/** An SVG map: x = lon·cos(mean lat), y = −lat, fit to the regions with margins. */
function regionMap(regions, cap, W) {
  const placed = regions.filter((r) => typeof r.lat === 'number' && typeof r.lon === 'number');
  const lat0 = placed.length ? placed.reduce((a, r) => a + r.lat, 0) / placed.length : 0;
  const k = Math.cos((lat0 * Math.PI) / 180);
  const pts = placed.map((r) => ({ r, x: r.lon * k, y: -r.lat }));
  const xs = pts.map((p) => p.x), ys = pts.map((p) => p.y);
  let [x0, x1, y0, y1] = pts.length ? [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)] : [-10, 10, -10, 10];
  const span = Math.max(x1 - x0, y1 - y0, 2);
  const m = span * 0.25;
  x0 -= m; x1 += m; y0 -= m; y1 += m;
  // Keep a wide picture (a squarer one on a phone) by widening the short side.
  const [lo, hi] = W < 600 ? [1, 1.5] : [1.9, 2.6];
  const grow = (a, b, want) => [a - (want - (b - a)) / 2, b + (want - (b - a)) / 2];
  if ((x1 - x0) / (y1 - y0) < lo) [x0, x1] = grow(x0, x1, (y1 - y0) * lo);
  if ((x1 - x0) / (y1 - y0) > hi) [y0, y1] = grow(y0, y1, (x1 - x0) / hi);
  const s = W / (x1 - x0), H = Math.round((y1 - y0) * s);
  const X = (x) => (x - x0) * s, Y = (y) => (y - y0) * s;
  const g = [];
  const step = [0.5, 1, 2, 5, 10, 15, 30, 45].find((d) => (y1 - y0) / d <= 6) || 90;
  const deg = (v, pos, neg) => `${fmtNum(Math.abs(v), 1)}°${v > 0 ? pos : v < 0 ? neg : ''}`;
  for (let lat = Math.ceil(-y1 / step) * step; lat <= -y0; lat += step) {
    g.push(svg('line', { x1: 0, x2: W, y1: Y(-lat), y2: Y(-lat), class: 'grat' }));
    if (Y(-lat) > 18 && Y(-lat) < H - 24) g.push(svg('text', { x: 6, y: Y(-lat) - 4, class: 'grat-label', text: deg(lat, 'N', 'S') }));
  }
  for (let lon = Math.ceil(x0 / k / step) * step; lon * k <= x1; lon += step) {
    g.push(svg('line', { x1: X(lon * k), x2: X(lon * k), y1: 0, y2: H, class: 'grat' }));
    if (X(lon * k) > 40 && X(lon * k) < W - 40) g.push(svg('text', { x: X(lon * k) + 4, y: H - 6, class: 'grat-label', text: deg(lon, 'E', 'W') }));
  }
  const maxCap = Math.max(1, ...[...cap.values()].map((c) => c.total));
  const dots = pts.map(({ r, x, y }) => {
    const c = cap.get(r.name) || { used: 0, total: 0 };
    const rad = 7 + 9 * Math.sqrt(c.total / maxCap);
    const use = c.total ? c.used / c.total : 0;
    const left = X(x) > W - 170;
    return svg('g', { class: `site ${use > 0.8 ? 'hot' : use > 0 ? 'busy' : ''}` },
      svg('circle', { 'data-region': r.name, cx: X(x), cy: Y(y), r: rad.toFixed(1) }),
      svg('text', { x: X(x) + (left ? -rad - 6 : rad + 6), y: Y(y) - 2, class: 'site-name', 'text-anchor': left ? 'end' : 'start', text: r.name }),
      svg('text', { x: X(x) + (left ? -rad - 6 : rad + 6), y: Y(y) + 14, class: 'site-cap', 'text-anchor': left ? 'end' : 'start', text: `${c.used} of ${c.total} vCPUs used` }));
  });
  return svg('svg', { id: 'map', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': 'map-title' },
    svg('title', { id: 'map-title', text: `Map of ${plural(placed.length, 'region')}: ${placed.map((r) => r.name).join(', ')}` }),
    svg('rect', { x: 0, y: 0, width: W, height: H, class: 'sea' }), g, dots);
}

async function pageHosts(ctx) {
  const body = h('div', {}, loading());
  mount(h('h1', { text: 'Hosts' }), body);
  let a;
  try { a = await api('GET', '/v1/hosts'); } catch (err) { failed(body, err); return; }
  if (!ctx.alive) return;
  const hosts = a.hosts || [];
  let used = 0, total = 0;
  const rows = hosts.map((x) => {
    const u = x.used_vcpus || 0, m = x.used_memory_mib || 0;
    used += u; total += x.vcpus;
    const pct = x.vcpus ? Math.round((100 * u) / x.vcpus) : 0;
    const fill = h('span');
    fill.style.width = `${pct}%`;
    return h('tr', { 'data-host': x.name }, h('th', { scope: 'row', text: x.name }), h('td', { text: x.region }),
      h('td', { class: 'num vcpus-used', text: u }), h('td', { class: 'num vcpus-free', text: x.vcpus - u }),
      h('td', { class: 'num', text: `${fmtInt(m)} MiB` }), h('td', { class: 'num', text: `${fmtInt(x.memory_mib - m)} MiB` }),
      h('td', { class: 'num', text: x.instances || 0 }),
      h('td', { class: 'use' }, h('span', { class: `bar${pct > 80 ? ' hot' : ''}`, 'aria-hidden': 'true' }, fill), ` ${pct}%`));
  });
  fill(body, h('p', { class: 'muted', text: `${plural(hosts.length, 'host')}: ${used} of ${total} vCPUs used.` }),
    table({ id: 'hosts' }, ['Host', 'Region', 'vCPUs used', 'vCPUs free', 'Memory used', 'Memory free', 'Instances', 'vCPU use'], rows, 'Hosts and their capacity'));
}

async function pageCustomers(ctx) {
  const list = h('div', {}, loading());
  const keyBox = h('div', { id: 'new-key', role: 'status' });
  const box = problemBox('customer-problem');
  const name = h('input', { id: 'customer-name', name: 'customer-name', autocomplete: 'off', required: true });
  const allow = h('input', { id: 'customer-allow', name: 'customer-allow', autocomplete: 'off' });
  const form = h('form', { id: 'create-customer', class: 'card', novalidate: true }, h('h2', { text: 'New customer' }),
    h('div', { class: 'grid2' }, field('customer-name', 'Name', name),
      field('customer-allow', 'Origin exceptions (optional)', allow, 'Comma separated, like 127.0.0.1:9000 or 10.1.0.0/16.')),
    box, h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn btn-primary', text: 'Create customer' })));
  const reload = async () => {
    let a;
    try { a = await api('GET', '/v1/customers'); } catch (err) { failed(list, err); return; }
    if (ctx.alive) fill(list, customersTable(a.customers || [], keyBox, reload));
  };
  onSubmit(form, box, async () => {
    const body = { name: name.value.trim() };
    const rules = allow.value.split(',').map((x) => x.trim()).filter(Boolean);
    if (rules.length) body.origin_allow = rules;
    const c = await api('POST', '/v1/customers', body);
    name.value = ''; allow.value = '';
    showKey(keyBox, c.name || c.id, c.api_key);
    await reload();
  }, (f) => (f.startsWith('origin_allow') ? allow : name));
  mount(h('h1', { text: 'Customers' }), keyBox, list, form);
  reload();
}
/** A new API key, shown this once. */
function showKey(where, who, key) {
  const status = h('span', { class: 'muted', role: 'status' });
  fill(where, h('div', { class: 'notice' },
    h('p', {}, h('strong', { text: `New API key for ${who}.` }), ' It is shown only now: copy it and hand it over.'),
    commandLine('api-key', 'API key', key, status), status));
}
function customersTable(customers, keyBox, reload) {
  if (!customers.length) return h('p', { text: 'No customers yet.' });
  const rows = customers.map((c) => {
    const problem = h('div', { class: 'problem', role: 'alert' });
    const act = async (btn, fn) => { btn.disabled = true; problem.replaceChildren(); try { await fn(); } catch (err) { showProblem(problem, err); } finally { btn.disabled = false; } };
    const rotate = h('button', { type: 'button', class: 'btn btn-small' }, 'Rotate key', h('span', { class: 'vh', text: ` of ${c.name}` }));
    rotate.addEventListener('click', () => act(rotate, async () => { const k = await api('POST', `/v1/customers/${enc(c.id)}/key`); showKey(keyBox, c.name, k.api_key); keyBox.scrollIntoView(); }));
    const delText = h('span', { text: 'Delete' });
    const del = h('button', { type: 'button', class: 'btn btn-small btn-danger-quiet' }, delText, h('span', { class: 'vh', text: ` ${c.name}` }));
    del.addEventListener('click', () => {
      if (del.dataset.armed) { act(del, async () => { await api('DELETE', `/v1/customers/${enc(c.id)}`); await reload(); }); return; }
      del.dataset.armed = '1';
      delText.textContent = 'Confirm delete';
    });
    const q = c.quota;
    return h('tr', { 'data-customer': c.id }, h('th', { scope: 'row', text: c.name }), h('td', {}, h('code', { text: c.id })),
      h('td', { text: fmtTime(c.created_at) }), h('td', { text: (c.origin_allow || []).join(', ') || '—' }),
      h('td', { text: q ? `${q.max_services} services, ${q.max_vcpus} vCPUs` : 'default' }),
      h('td', {}, h('div', { class: 'row-actions' }, rotate, del), problem));
  });
  return table({ id: 'customers' }, ['Name', 'ID', 'Created', 'Origin exceptions', 'Quota', 'Actions'], rows, 'Customers');
}

async function pageFlavors(ctx) {
  const body = h('div', {}, loading());
  mount(h('h1', { text: 'Flavors' }), body);
  let a;
  try { a = await api('GET', '/v1/flavors'); } catch (err) { failed(body, err); return; }
  if (!ctx.alive) return;
  fill(body, table({ id: 'flavors' }, ['Flavor', 'Kind', 'Pricing', 'Instances per region', 'Each instance', 'Placement', 'Regions', 'Origin exceptions'],
    (a.flavors || []).map((f) => {
      const t = f.template || {};
      return h('tr', {}, h('th', { scope: 'row' }, f.name, h('div', { class: 'muted small', text: f.description || '' })), h('td', {}, badge(f.kind)),
        h('td', { text: `${f.pricing.scheme.replace('_', ' ')}: ${pricingText(f.pricing)}` }),
        h('td', { class: 'num', text: instanceRange(t) }),
        h('td', { text: `${t.vcpus_per_instance} vCPU, ${t.memory_mib_per_instance} MiB` }), h('td', { text: t.placement || 'consolidate' }),
        h('td', { text: (t.allowed_regions || []).join(', ') || 'all' }), h('td', { text: (f.origin_allow || []).join(', ') || '—' }));
    }), 'Flavors on offer'));
}

function pagePlatform(ctx) {
  const opts = { currency: '', costWords: 'Cost so far of the live services' };
  api('GET', '/v1/flavors').then((a) => {
    const cur = [...new Set((a.flavors || []).map((f) => f.pricing.currency))];
    if (cur.length === 1) opts.currency = cur[0];
  }).catch(() => {});
  mount(h('h1', { text: 'Platform' }), h('p', { class: 'lead', text: 'Every service of every customer, summed per region.' }), chartsPanel(ctx, '/v1/timeseries', opts));
}

/* ---------- 7. Charts ---------- */

let uplotLoading = null;
function loadUplot() {
  if (window.uPlot) return Promise.resolve();
  uplotLoading = uplotLoading || new Promise((resolve, reject) => {
    const s = document.createElement('script');
    s.src = '/portal/uplot.js';
    s.onload = resolve;
    s.onerror = () => { uplotLoading = null; reject(new Error('uplot.js did not load')); };
    document.head.append(s);
  });
  return uplotLoading;
}

const WINDOWS = [
  { key: '1h', label: '1 h', s: 3600, step: 10, words: 'the last hour' },
  { key: '6h', label: '6 h', s: 6 * 3600, step: 10, words: 'the last 6 hours' },
  { key: '24h', label: '24 h', s: 86400, step: 300, words: 'the last 24 hours' },
  { key: '7d', label: '7 d', s: 7 * 86400, step: 3600, words: 'the last 7 days' },
];
const COLORS = ['#1f5fbf', '#c2410c', '#15803d', '#7e22ce', '#0e7490', '#be185d', '#4b5563', '#92400e'];
const CHARTS = [
  ['requests', 'Requests per second'], ['bytes', 'Bytes per second'], ['hit-ratio', 'Hit ratio'],
  ['mos', 'Quality (MOS)'], ['instances', 'Instances'], ['cost', 'Cost so far'],
];

/** The charts section: window selector, six figures, refreshed every 10 s. */
function chartsPanel(ctx, path, opts) {
  const st = { win: WINDOWS[0], skew: 0, plots: {}, last: null, seq: 0 };
  const status = h('p', { class: 'muted small', role: 'status' });
  const buttons = WINDOWS.map((w) => h('button', { type: 'button', class: 'seg', 'aria-pressed': String(w === st.win), text: w.label,
    onclick: () => {
      st.win = w;
      for (const b of buttons) b.setAttribute('aria-pressed', String(b.textContent === w.label));
      load();
    } }));
  const figs = {};
  const grid = h('div', { class: 'charts' }, CHARTS.map(([id, title]) => {
    figs[id] = { plot: h('div', { class: 'plot', 'aria-hidden': 'true' }), summary: h('p', { id: `summary-${id}`, class: 'summary', text: 'Loading…' }) };
    return h('figure', { class: 'chart card' }, h('h3', { text: title }), figs[id].plot, figs[id].summary);
  }));
  const load = async () => {
    const my = ++st.seq;
    const now = Math.floor(Date.now() / 1000) + st.skew;
    const q = st.last ? `?from=${now - st.win.s}&to=${now}&step=${st.win.step}` : `?step=${st.win.step}`;
    let ts;
    try { ts = await api('GET', path + q); } catch (err) { status.textContent = `Charts not updated: ${err.message}`; return; }
    if (!ctx.alive || my !== st.seq) return;
    if (!st.last) st.skew = ts.to - Math.floor(Date.now() / 1000);
    if (!st.last && st.win.s !== 3600) { st.last = ts; load(); return; }
    st.last = ts;
    status.textContent = '';
    const specs = chartSpecs(ts, st.win, opts);
    for (const [id] of CHARTS) figs[id].summary.textContent = specs[id].summary;
    try { await loadUplot(); } catch { status.textContent = 'Charts could not be drawn; the summaries above each say what they show.'; return; }
    if (ctx.alive && my === st.seq) for (const [id] of CHARTS) drawChart(st, id, figs[id].plot, specs[id], ts);
  };
  let resizeTimer;
  const onResize = () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => { for (const [id, u] of Object.entries(st.plots)) u.setSize(plotSize(figs[id].plot)); }, 150);
  };
  window.addEventListener('resize', onResize);
  ctx.cleanups.push(() => { window.removeEventListener('resize', onResize); for (const u of Object.values(st.plots)) u.destroy(); });
  every(ctx, 10000, load, true);
  return h('section', { class: 'charts-section', 'aria-labelledby': 'charts-h' },
    h('div', { class: 'page-head' }, h('h2', { id: 'charts-h', text: 'Traffic and quality' }),
      h('div', { class: 'segmented', role: 'group', 'aria-label': 'Time window' }, buttons)), status, grid);
}

function plotSize(el) { return { width: Math.max(260, el.clientWidth), height: 200 }; }

/** Aligns each region's sparse column on the union of their times. */
function align(regions, pick) {
  const ts = [...new Set(regions.flatMap((r) => r.t))].sort((a, b) => a - b);
  const at = new Map(ts.map((t, i) => [t, i]));
  const cols = regions.map((r) => {
    const col = new Array(ts.length).fill(null);
    r.t.forEach((t, i) => { col[at.get(t)] = pick(r, i); });
    return col;
  });
  return [ts, cols];
}
const sum = (a) => a.reduce((x, y) => x + (y || 0), 0);
const lastOf = (a) => { for (let i = a.length - 1; i >= 0; i--) if (a[i] != null) return a[i]; return null; };

/** What each chart shows: series, aligned data, y format and a text summary. */
function chartSpecs(ts, win, opts) {
  const regions = (ts.regions || []).slice().sort((a, b) => a.region.localeCompare(b.region));
  const step = ts.step_s || win.step;
  const names = regions.map((r) => r.region);
  const line = (label, i, extra) => Object.assign({ label, stroke: COLORS[i % COLORS.length], width: 2 }, extra);
  const per = (key, f) => align(regions, (r, i) => (r[key][i] == null ? null : f(r[key][i], r, i)));
  const w = win.words;
  const spec = {};

  const totalReq = sum(regions.map((r) => sum(r.requests)));
  const [tq, rq] = per('requests', (v) => v / step);
  const peak = Math.max(0, ...rq.flat().filter((v) => v != null));
  spec.requests = { x: tq, cols: rq, series: names.map((n, i) => line(n, i)), fmt: fmtRate, min0: true,
    summary: `${totalReq} requests in ${w}${regions.length > 1 ? ` (${regions.map((r) => `${r.region} ${sum(r.requests)}`).join(', ')})` : ''}; peak ${fmtRate(peak)} requests/s.` };

  const totalBytes = sum(regions.map((r) => sum(r.bytes)));
  const [tb, rb] = per('bytes', (v) => v / step);
  spec.bytes = { x: tb, cols: rb, series: names.map((n, i) => line(n, i)), fmt: (v) => `${fmtBytes(v)}/s`, min0: true, axis: 84,
    summary: `${totalBytes} bytes (${fmtBytes(totalBytes)}) served in ${w}; peak ${fmtBytes(Math.max(0, ...rb.flat().filter((v) => v != null)))}/s.` };

  const [th, rh] = per('hit_ratio', (v) => v * 100);
  const hitText = regions.map((r) => {
    let hits = 0, n = 0;
    r.hit_ratio.forEach((v, i) => { if (v != null) { hits += v * (r.requests[i] || 1); n += r.requests[i] || 1; } });
    return n ? `${r.region} ${Math.round((100 * hits) / n)}%` : null;
  }).filter(Boolean);
  spec['hit-ratio'] = { x: th, cols: rh, series: names.map((n, i) => line(n, i)), fmt: (v) => `${Math.round(v)}%`, range: [0, 100],
    summary: hitText.length ? `Hit ratio in ${w}, weighted by requests: ${hitText.join(', ')}.` : `No cache lookups in ${w}.` };

  // The MOS chart's times include the window's ends, so the target spans it.
  const withEnds = regions.concat([{ t: [ts.from, ts.to], ends: true }]);
  const [tm, estAll] = align(withEnds, (r, i) => (r.ends ? null : r.mos_estimated[i]));
  const [, repAll] = align(withEnds, (r, i) => (r.ends ? null : r.mos_reported[i]));
  const est = estAll.slice(0, -1), rep = repAll.slice(0, -1);
  const mosSeries = [], mosCols = [];
  regions.forEach((r, i) => {
    mosSeries.push(line(`${r.region} estimated`, i)); mosCols.push(est[i]);
    if (rep[i].some((v) => v != null)) { mosSeries.push(line(`${r.region} reported`, i, { dash: [6, 4] })); mosCols.push(rep[i]); }
  });
  const target = ts.target_mos;
  if (target != null) { mosSeries.push({ label: 'target', stroke: '#b91c1c', width: 1.5, dash: [3, 3], points: { show: false } }); mosCols.push(tm.map(() => target)); }
  const mosText = regions.map((r, i) => {
    const e = est[i].filter((v) => v != null), p = rep[i].filter((v) => v != null);
    if (!e.length && !p.length) return null;
    return `${r.region}: estimated ${e.length ? `${fmtNum(lastOf(e))} now, lowest ${fmtNum(Math.min(...e))}` : 'none'}${p.length ? `; reported lowest ${fmtNum(Math.min(...p))}` : ''}`;
  }).filter(Boolean);
  spec.mos = { x: tm, cols: mosCols, series: mosSeries, fmt: (v) => fmtNum(v, 1), range: [1, 5],
    summary: `${mosText.length ? `MOS in ${w}: ${mosText.join('; ')}.` : `No MOS in ${w}.`}${target != null ? ` Target ${target.toFixed(1)}.` : ''}` };

  const [ti, ri] = per('instances', (v) => v);
  const instText = regions.map((r, i) => `${r.region} ${fmtNum(lastOf(ri[i]) || 0, 1)} (most ${fmtNum(Math.max(0, ...ri[i].filter((v) => v != null)), 1)})`);
  spec.instances = { x: ti, cols: ri, series: names.map((n, i) => line(n, i)), fmt: (v) => fmtNum(v, 1), min0: true, stepped: true,
    summary: instText.length ? `Instances now: ${instText.join(', ')}.` : `No instances recorded in ${w}.` };

  const total = ts.total || { t: [], cost: [] };
  const cost = lastOf(total.cost || []);
  spec.cost = { x: total.t || [], cols: [total.cost || []], series: [line('cost', 0, { fill: 'rgba(31,95,191,0.08)' })], fmt: (v) => fmtMoney(v, ''), min0: true,
    summary: cost == null ? `No cost recorded in ${w}.` : `${opts.costWords || 'Cost so far'}: ${fmtMoney(cost, opts.currency)}.` };
  return spec;
}

function axisTime(t, span) {
  const d = new Date(t * 1000);
  const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  return span > 2 * 86400 ? `${pad2(d.getDate())}/${pad2(d.getMonth() + 1)}${d.getHours() || d.getMinutes() ? ` ${hm}` : ''}` : hm;
}

/** Draws one chart, or updates it in place when its series are unchanged. */
function drawChart(st, id, el, spec, ts) {
  const data = [spec.x, ...spec.cols];
  const key = spec.series.map((s) => s.label).join('|');
  const old = st.plots[id];
  if (old && old.vcdnKey === key) { old.setData(data); return; }
  if (old) old.destroy();
  el.replaceChildren();
  const yRange = spec.range ? () => spec.range : (u, min, max) => [spec.min0 ? 0 : min, max > 0 ? max * 1.15 : 1];
  const opts = Object.assign(plotSize(el), {
    scales: { x: { time: true, range: () => [st.last.from, st.last.to] }, y: { range: yRange } },
    series: [{ label: 'time', value: (u, v) => (v == null ? '—' : fmtTime(v)) }, ...spec.series.map((s) => Object.assign({ value: (u, v) => (v == null ? '—' : spec.fmt(v)),
      paths: spec.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined }, s))],
    axes: [{ stroke: '#57606a', grid: { stroke: '#eaeef2' }, values: (u, vals) => vals.map((t) => axisTime(t, st.last.to - st.last.from)) }, { stroke: '#57606a', grid: { stroke: '#eaeef2' }, size: spec.axis || 60, values: (u, vals) => vals.map(spec.fmt) }],
    legend: { live: true },
    cursor: { drag: { x: false, y: false } },
  });
  const u = new uPlot(opts, data, el);
  u.vcdnKey = key;
  st.plots[id] = u;
}

document.addEventListener('DOMContentLoaded', start);
