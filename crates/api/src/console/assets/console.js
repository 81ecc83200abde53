// The Bulkhead console: a hash-routed page over the console's JSON API (/console/api/...,
// which replays the REST routes the SDKs use, with the session's key kept on the server).
//
// Everything a sandbox or a user controls (ids, template names, metadata, file names,
// command lines, hosts) reaches the page only through text nodes and attribute values set
// with DOM calls: never through HTML strings. The CSP allows no inline script anyway.
'use strict';
(function () {
  const Charts = window.BulkheadCharts;
  const main = document.getElementById('main');
  let view = 0; // bumped on every navigation: stale refresh loops and answers stop
  const history = new Map(); // sandbox id -> recent list samples for the sparklines

  // ---- DOM helpers ---------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }
  function table(headers, rows, attrs) {
    return el('table', attrs, el('thead', null, el('tr', null, headers.map((h) =>
      el('th', { class: h.endsWith('#') ? 'num' : null }, h.replace(/#$/, ''))))), el('tbody', null, rows));
  }
  // Replaces the contents of the element `id` (a fixed container of the current view).
  function replace(id, node) {
    const box = document.getElementById(id);
    if (box) box.replaceChildren(node);
  }

  // ---- formatting ----------------------------------------------------------------------------
  function bytes(n) {
    if (!(n >= 0)) return '–';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(n >= 100 ? 0 : 1) : String(n)) + ' ' + u[i];
  }
  function age(iso) {
    const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
    return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  }
  function when(iso) { return iso ? new Date(iso).toLocaleString() : '–'; }
  function num(v, digits) { return v === undefined || v === null ? '–' : Number(v).toFixed(digits); }

  // ---- API -----------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }
  async function api(method, path) {
    const headers = { Accept: 'application/json' };
    if (method !== 'GET') headers['X-Bulkhead-Console'] = '1';
    const r = await fetch('/console/api' + path, { method, headers, credentials: 'same-origin', cache: 'no-store' });
    if (r.status === 204) return null;
    const body = await r.json().catch(() => ({}));
    if (r.status === 401) {
      signedOut(body.message || 'Not logged in');
      throw new ApiError(401, body.message || 'Not logged in');
    }
    if (!r.ok) throw new ApiError(r.status, body.message || ('HTTP ' + r.status));
    return body;
  }

  // ---- session -------------------------------------------------------------------------------
  function signedOut(message) {
    view++;
    document.getElementById('top').hidden = true;
    main.replaceChildren();
    document.getElementById('login').hidden = false;
    document.getElementById('login-error').textContent = message || '';
    document.getElementById('api-key').focus();
  }
  function signedIn(who) {
    document.getElementById('login').hidden = true;
    document.getElementById('top').hidden = false;
    document.getElementById('who').textContent = 'team ' + who.teamID;
    route();
  }
  document.getElementById('login-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const input = document.getElementById('api-key');
    const errBox = document.getElementById('login-error');
    errBox.textContent = '';
    const r = await fetch('/console/api/login', {
      method: 'POST', credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', 'X-Bulkhead-Console': '1' },
      body: JSON.stringify({ apiKey: input.value }),
    });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) { errBox.textContent = body.message || ('Login failed (HTTP ' + r.status + ')'); return; }
    input.value = '';
    signedIn(body);
  });
  document.getElementById('logout').addEventListener('click', async () => {
    await api('POST', '/logout').catch(() => null);
    signedOut('Logged out.');
  });

  // ---- routing -------------------------------------------------------------------------------
  function route() {
    const token = ++view;
    const hash = location.hash.replace(/^#\/?/, '');
    const parts = hash.split('/').map(decodeURIComponent);
    for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === (parts[0] || 'sandboxes'));
    if (parts[0] === 'sandboxes' && parts[1]) return detailView(token, parts[1]);
    if (parts[0] === 'usage') return usageView(token);
    if (parts[0] === 'keys') return keysView(token);
    return listView(token);
  }
  window.addEventListener('hashchange', () => {
    if (!document.getElementById('top').hidden) route();
  });
  // Runs `fn` now and every `ms` while the view is current; errors show in `onError`.
  async function every(token, ms, fn, onError) {
    while (token === view) {
      try { await fn(); } catch (e) { if (token === view && e.status !== 401) onError(e); }
      await new Promise((r) => setTimeout(r, ms));
    }
  }
  function errorNotice(e) { return el('p', { class: 'notice' }, e.message); }

  // ---- sandboxes -----------------------------------------------------------------------------
  function listView(token) {
    main.replaceChildren(
      el('div', { class: 'row' }, el('h1', null, 'Sandboxes'), el('span', { id: 'list-status', class: 'muted' })),
      el('div', { id: 'list' }, el('p', { class: 'muted' }, 'Loading…')));
    every(token, 2000, async () => {
      const list = await api('GET', '/v2/sandboxes?state=running,paused&limit=100');
      const running = list.filter((s) => s.state === 'running').map((s) => s.sandboxID);
      const metrics = running.length
        ? (await api('GET', '/sandboxes/metrics?sandbox_ids=' + running.map(encodeURIComponent).join(','))).sandboxes
        : {};
      if (token !== view) return;
      for (const [id, m] of Object.entries(metrics)) {
        const h = history.get(id) || [];
        h.push(m);
        history.set(id, h.slice(-30));
      }
      replace('list', list.length === 0
        ? el('p', { class: 'muted' }, 'No running or paused sandboxes. Create one with an SDK and it appears here.')
        : table(['ID', 'State', 'Template', 'Age', 'CPU', 'Memory', 'Metadata'], list.map((s) => sandboxRow(s, metrics[s.sandboxID])),
          { id: 'sandboxes' }));
      document.getElementById('list-status').textContent =
        `${list.length} sandbox${list.length === 1 ? '' : 'es'} · updated ${new Date().toLocaleTimeString()}`;
    }, (e) => replace('list', errorNotice(e)));
  }
  function sandboxRow(s, m) {
    const h = history.get(s.sandboxID) || [];
    const cpu = m ? el('span', null, num(m.cpuUsedPct, 0) + '% of ' + s.cpuCount + ' vCPU ',
      Charts.spark(h.map((x) => x.cpuUsedPct), { max: 100, label: 'CPU trend' })) : '–';
    const mem = m ? el('span', null, bytes(m.memUsed) + ' / ' + s.memoryMB + ' MiB ',
      Charts.spark(h.map((x) => x.memUsed), { max: m.memTotal || s.memoryMB * 1048576, cls: 'series-mem', label: 'memory trend' })) : s.memoryMB + ' MiB';
    const md = Object.entries(s.metadata || {}).map(([k, v]) => el('div', { class: 'mono' }, k + '=' + v));
    return el('tr', { 'data-sandbox-id': s.sandboxID },
      el('td', null, el('a', { class: 'mono', href: '#/sandboxes/' + encodeURIComponent(s.sandboxID) }, s.sandboxID)),
      el('td', { class: 'state-' + s.state }, s.state),
      el('td', null, s.alias || s.templateID),
      el('td', null, age(s.startedAt)),
      el('td', null, cpu),
      el('td', null, mem),
      el('td', { class: 'metadata' }, md));
  }

  // ---- one sandbox ---------------------------------------------------------------------------
  function detailView(token, id) {
    const base = '/sandboxes/' + encodeURIComponent(id);
    const own = '/bulkhead/v1' + base;
    let cwd = '.';
    const killBtn = el('button', {
      class: 'danger', type: 'button', id: 'kill',
      onclick: async () => {
        if (!confirm('Kill sandbox ' + id + '? Its processes and files are gone for good.')) return;
        try { await api('DELETE', base); location.hash = '#/sandboxes'; } catch (e) { alert(e.message); }
      },
    }, 'Kill');
    main.replaceChildren(
      el('p', null, el('a', { href: '#/sandboxes' }, '← Sandboxes')),
      el('div', { class: 'row' }, el('h1', null, 'Sandbox ', el('span', { class: 'mono' }, id)), killBtn),
      el('div', { id: 'info' }),
      el('h2', null, 'CPU and memory (last 15 minutes)'), el('div', { id: 'charts', class: 'charts' }),
      el('h2', null, 'Processes'), el('div', { id: 'procs' }, el('p', { class: 'muted' }, 'Loading…')),
      el('h2', null, 'Files'), el('div', { id: 'files' }),
      el('h2', null, 'Egress audit trail'), el('div', { id: 'egress' }, el('p', { class: 'muted' }, 'Loading…')));

    async function showFiles(path) {
      try {
        const l = await api('GET', own + '/files?path=' + encodeURIComponent(path));
        if (token !== view) return;
        cwd = l.path;
        const input = el('input', { id: 'file-path', value: l.path, size: 50, 'aria-label': 'directory' });
        const form = el('form', { class: 'row', onsubmit: (ev) => { ev.preventDefault(); showFiles(input.value); } },
          input, el('button', { type: 'submit' }, 'Open'),
          el('button', { type: 'button', onclick: () => showFiles(parentOf(cwd)) }, 'Up'),
          el('button', { type: 'button', onclick: () => showFiles(cwd) }, 'Refresh'));
        const rows = l.entries.map((f) => el('tr', { 'data-file': f.name },
          el('td', null, f.type === 'dir'
            ? el('button', { class: 'link mono', type: 'button', onclick: () => showFiles(f.path) }, f.name + '/')
            : el('span', { class: 'mono' }, f.name),
          f.symlinkTarget ? el('span', { class: 'muted' }, ' → ' + f.symlinkTarget) : null),
          el('td', { class: 'num' }, f.type === 'dir' ? '' : bytes(f.size)),
          el('td', { class: 'mono' }, f.permissions),
          el('td', null, when(f.modifiedTime)),
          el('td', null, f.type === 'file' ? el('a', {
            href: '/console/api' + own + '/files/content?path=' + encodeURIComponent(f.path),
            download: f.name, class: 'download',
          }, 'Download') : '')));
        replace('files', el('div', null, form,
          table(['Name', 'Size#', 'Mode', 'Modified', ''], rows, { id: 'file-table' }),
          l.truncated ? el('p', { class: 'muted' }, 'Only the first entries are listed.') : null));
      } catch (e) {
        if (token === view) replace('files', errorNotice(e));
      }
    }
    function parentOf(p) {
      if (p === '.' || p === '') return '..';
      const i = p.replace(/\/+$/, '').lastIndexOf('/');
      return i <= 0 ? '/' : p.slice(0, i);
    }
    showFiles(cwd);

    every(token, 3000, async () => {
      let s;
      try { s = await api('GET', base); } catch (e) {
        if (e.status === 404) {
          view++;
          killBtn.remove();
          replace('info', el('p', { class: 'notice', id: 'gone' }, 'Sandbox ' + id + ' no longer exists: it was killed or timed out.'));
          return;
        }
        throw e;
      }
      if (token !== view) return;
      replace('info', el('dl', { class: 'info' },
        el('dt', null, 'State'), el('dd', { class: 'state-' + s.state }, s.state),
        el('dt', null, 'Template'), el('dd', null, s.alias ? s.alias + ' (' + s.templateID + ')' : s.templateID),
        el('dt', null, 'Started'), el('dd', null, when(s.startedAt) + ' (' + age(s.startedAt) + ' ago)'),
        el('dt', null, 'Ends'), el('dd', null, when(s.endAt)),
        el('dt', null, 'Resources'), el('dd', null, s.cpuCount + ' vCPU, ' + s.memoryMB + ' MiB memory, ' + s.diskSizeMB + ' MiB disk'),
        el('dt', null, 'Internet'), el('dd', null, s.allowInternetAccess ? 'allowed' : 'by policy only'),
        el('dt', null, 'Metadata'), el('dd', { id: 'metadata' }, Object.entries(s.metadata || {}).map(([k, v]) =>
          el('div', { class: 'mono' }, k + ' = ' + v)))));
      const start = Math.floor(Date.now() / 1000) - 900;
      const series = await api('GET', base + '/metrics?start=' + start);
      if (token !== view) return;
      const cpu = series.map((m) => ({ t: m.timestampUnix * 1000, v: m.cpuUsedPct }));
      const mem = series.map((m) => ({ t: m.timestampUnix * 1000, v: m.memUsed }));
      const memMax = series.length ? series[series.length - 1].memTotal : s.memoryMB * 1048576;
      replace('charts', el('div', { class: 'row' },
        el('div', { class: 'chart' }, el('div', { class: 'title' }, 'CPU used, % of ' + s.cpuCount + ' vCPU'),
          Charts.line(cpu, { max: 100, format: (v) => v.toFixed(0) + '%', label: 'CPU usage' })),
        el('div', { class: 'chart' }, el('div', { class: 'title' }, 'Memory used, of ' + bytes(memMax)),
          Charts.line(mem, { max: memMax, format: bytes, cls: 'series-mem', label: 'memory usage' }))));
      if (s.state === 'running') {
        try {
          const procs = await api('GET', own + '/processes');
          if (token !== view) return;
          replace('procs', procs.length === 0 ? el('p', { class: 'muted' }, 'No processes started through the agent.')
            : table(['PID#', 'Command', 'Working directory', 'Tag'], procs.map((p) => el('tr', { 'data-pid': p.pid },
              el('td', { class: 'num' }, p.pid),
              el('td', { class: 'mono cmd' }, [p.cmd].concat(p.args).join(' ')),
              el('td', { class: 'mono' }, p.cwd || ''),
              el('td', { class: 'mono' }, p.tag || ''))), { id: 'proc-table' }));
        } catch (e) { if (token === view) replace('procs', errorNotice(e)); }
      } else {
        replace('procs', el('p', { class: 'muted' }, 'The sandbox is ' + s.state + ': resume it to see its processes.'));
      }
      const events = await api('GET', base + '/network/events?limit=200');
      if (token !== view) return;
      replace('egress', events.length === 0 ? el('p', { class: 'muted' }, 'No outbound connections yet.')
        : table(['Time', 'Decision', 'Protocol', 'Host', 'IP', 'Port#', 'Rule', 'Out#', 'In#'], events.slice().reverse().map((e) =>
          el('tr', { class: 'egress-' + (e.allowed ? 'allow' : 'deny') },
            el('td', null, new Date(e.timestamp).toLocaleTimeString()),
            el('td', { class: e.allowed ? 'allow' : 'deny' }, e.allowed ? 'allowed' : 'denied'),
            el('td', null, e.protocol),
            el('td', { class: 'mono' }, e.host || ''),
            el('td', { class: 'mono' }, e.ip || ''),
            el('td', { class: 'num' }, e.port),
            el('td', { class: 'mono' }, e.rule),
            el('td', { class: 'num' }, bytes(e.bytesOut)),
            el('td', { class: 'num' }, bytes(e.bytesIn)))), { id: 'egress-table' }));
    }, (e) => replace('info', errorNotice(e)));
  }

  // ---- usage and credits ---------------------------------------------------------------------
  function usageView(token) {
    const range = el('select', { id: 'range', 'aria-label': 'time range', onchange: () => load() },
      el('option', { value: '86400' }, 'Last 24 hours'),
      el('option', { value: '604800' }, 'Last 7 days'),
      el('option', { value: '2592000' }, 'Last 30 days'),
      el('option', { value: '0' }, 'All time'));
    main.replaceChildren(el('div', { class: 'row' }, el('h1', null, 'Usage and credits'), range), el('div', { id: 'usage' }));
    async function load() {
      const secs = Number(range.value);
      const q = secs ? '?start=' + (Math.floor(Date.now() / 1000) - secs) : '';
      try {
        const u = await api('GET', '/bulkhead/v1/usage' + q);
        if (token !== view) return;
        const t = u.totals;
        const top = u.sandboxes.slice().sort((a, b) => b.vcpu_seconds - a.vcpu_seconds).slice(0, 15);
        replace('usage', el('div', null,
          el('div', { class: 'cards' },
            el('div', { class: 'card' }, el('div', { class: 'muted' }, 'Credit balance'),
              el('div', { class: 'big', id: 'credits' }, u.credits === null || u.credits === undefined ? 'no limit' : num(u.credits, 4))),
            el('div', { class: 'card' }, el('div', { class: 'muted' }, 'Credits used'), el('div', { class: 'big' }, num(t.cost, 4))),
            el('div', { class: 'card' }, el('div', { class: 'muted' }, 'vCPU-seconds'), el('div', { class: 'big' }, num(t.vcpu_seconds, 1))),
            el('div', { class: 'card' }, el('div', { class: 'muted' }, 'Memory GiB-seconds'), el('div', { class: 'big' }, num(t.memory_gib_seconds, 1))),
            el('div', { class: 'card' }, el('div', { class: 'muted' }, 'Sandboxes'), el('div', { class: 'big' }, u.sandboxes.length))),
          el('h2', null, 'vCPU-seconds per sandbox (top 15)'),
          top.length ? el('div', { class: 'chart' }, Charts.bars(top.map((s) => ({ label: s.sandbox_id, value: s.vcpu_seconds })),
            { format: (v) => v.toFixed(1) + ' s', label: 'vCPU-seconds per sandbox' })) : el('p', { class: 'muted' }, 'Nothing metered in this range.'),
          el('h2', null, 'Per sandbox'),
          table(['Sandbox', 'Key', 'From', 'To', 'Running s#', 'Paused s#', 'vCPU-s#', 'GiB-s#', 'Credits#'], u.sandboxes.map((s) => el('tr', null,
            el('td', { class: 'mono' }, s.sandbox_id), el('td', { class: 'mono' }, s.key_id),
            el('td', null, when(s.start)), el('td', null, when(s.end)),
            el('td', { class: 'num' }, num(s.running_seconds, 0)), el('td', { class: 'num' }, num(s.paused_seconds, 0)),
            el('td', { class: 'num' }, num(s.vcpu_seconds, 1)), el('td', { class: 'num' }, num(s.memory_gib_seconds, 1)),
            el('td', { class: 'num' }, num(s.cost, 4)))), { id: 'usage-table' })));
      } catch (e) { if (token === view) replace('usage', errorNotice(e)); }
    }
    load();
  }

  // ---- keys ----------------------------------------------------------------------------------
  function keysView(token) {
    main.replaceChildren(el('h1', null, 'API keys of your team'),
      el('p', { class: 'muted' }, 'Create keys with `bulkhead keys create --team <team>` on the server. Revoking a key stops it at once, this console\'s sessions included.'),
      el('div', { id: 'keys' }));
    async function load() {
      try {
        const keys = await api('GET', '/bulkhead/v1/keys');
        if (token !== view) return;
        replace('keys', table(['Name', 'Key', 'Created', 'Last used', 'Status', ''], keys.map((k) => el('tr', { 'data-key-id': k.id },
          el('td', null, k.name, k.current ? el('span', { class: 'muted' }, ' (this session)') : null),
          el('td', { class: 'mono' }, k.prefix + '…'),
          el('td', null, when(k.createdAt)),
          el('td', null, k.lastUsedAt ? when(k.lastUsedAt) : 'never'),
          el('td', null, k.revokedAt ? 'revoked ' + when(k.revokedAt) : 'active'),
          el('td', null, k.revokedAt ? '' : el('button', {
            type: 'button', class: 'danger',
            onclick: async () => {
              if (!confirm('Revoke key "' + k.name + '"? Everything using it stops working.')) return;
              try { await api('DELETE', '/bulkhead/v1/keys/' + encodeURIComponent(k.id)); load(); } catch (e) { if (e.status !== 401) alert(e.message); }
            },
          }, 'Revoke')))), { id: 'key-table' }));
      } catch (e) { if (token === view) replace('keys', errorNotice(e)); }
    }
    load();
  }

  // ---- start ---------------------------------------------------------------------------------
  fetch('/console/api/session', { credentials: 'same-origin', cache: 'no-store' })
    .then(async (r) => {
      const body = await r.json().catch(() => ({}));
      if (r.ok) signedIn(body); else signedOut(r.status === 401 && body.message && !/^Not logged in/.test(body.message) ? body.message : '');
    })
    .catch((e) => signedOut('The server did not answer: ' + e.message));
})();
