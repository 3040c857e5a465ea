/**
 * The operator page's HTML, script and style: served from memory, no CDN, no network beyond the page's
 * own JSON. Charts are inline SVG drawn by the script.
 */

export const PAGE_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>idemkey operator</title>
<link rel="stylesheet" href="page.css">
<script src="page.js" defer></script>
</head>
<body>
<header><h1>idemkey</h1><span id="store" class="pill">…</span><span id="updated"></span></header>
<form id="login" hidden><label>Bearer token <input id="token" type="password" autocomplete="off"></label><button>Open</button><p id="login-error"></p></form>
<main id="main">
<section><h2>Records by state</h2><table id="counts"><tbody></tbody></table></section>
<section><h2>Rates <small>(per second, 10 s buckets, last 5 minutes)</small></h2><div id="charts"></div></section>
<section><h2>Holders past their lease without an outcome</h2><p class="hint">Their holder crashed or stalled: the next retry takes the record over and runs the work again.</p><p id="holders-unchecked" class="hint" hidden></p><table id="stuck"><thead><tr><th>scope</th><th>key</th><th>key hash</th><th>token</th><th>lease ended</th><th>attempts</th></tr></thead><tbody></tbody></table>
<h3>Running in their transaction</h3><p class="hint">Past their lease, alive: the holder's open transaction holds the record's row (the lease is not renewed from its first step on). Duplicates wait for its commit.</p><table id="in-transaction"><thead><tr><th>scope</th><th>key</th><th>key hash</th><th>token</th><th>lease ended</th><th>attempts</th></tr></thead><tbody></tbody></table></section>
<section><h2>Recent mismatches</h2><p class="hint">A key reused with another request: a client bug, or a key that is not unique enough.</p><table id="mismatches"><thead><tr><th>when</th><th>key hash</th></tr></thead><tbody></tbody></table></section>
<section id="inbox-section" hidden><h2>Inboxes <small>(oldest kept message ID)</small></h2><p class="hint">How far back each inbox's dedup window reaches. Older than the retention: purge() is not running. The retention must cover the broker's redelivery horizon.</p><table id="inboxes"><thead><tr><th>consumer</th><th>retention</th><th>oldest kept</th><th>age</th><th>message ID</th></tr></thead><tbody></tbody></table><h3>Failing messages <small>(attempts recorded against maxAttempts)</small></h3><p class="hint">Failing, or delivered again and running. One that reaches maxAttempts is given up on (dead-lettered).</p><table id="failing"><thead><tr><th>consumer</th><th>attempts</th><th>last attempt</th><th>age</th><th>message ID</th></tr></thead><tbody></tbody></table></section>
<section id="durability-section" hidden><h2>Durability <small>(idemkey doctor)</small></h2><p class="hint">What the store's server settings can lose, per failure, and the setting that closes it; see docs/durability.md.</p><p id="durability-status"></p><table id="durability"><thead><tr><th>failure</th><th>verdict</th><th>can lose</th><th>closed by</th></tr></thead><tbody></tbody></table></section>
<section id="relay-section" hidden><h2>CDC relay slots <small>(WAL held for the broker)</small></h2><p class="hint">A slot keeps the WAL its relay has not had confirmed by the broker. Missing, lost or past the relay's maxLagBytes: its ready() (/readyz) fails; see docs/messaging.md, "CDC relay".</p><table id="relays"><thead><tr><th>slot</th><th>state</th><th>lag</th><th>max lag</th><th>read by a relay</th><th>WAL status</th></tr></thead><tbody></tbody></table></section>
<section><h2>Look up a record</h2>
<form id="lookup"><label>scope <input id="lookup-scope" placeholder="default"></label><label>key <input id="lookup-key" required></label><label><input id="lookup-bodies" type="checkbox"> show stored body</label><button>Look up</button></form>
<pre id="record"></pre></section>
</main>
</body>
</html>
`

export const PAGE_CSS = `[hidden]{display:none!important}
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{display:flex;gap:12px;align-items:center;padding:10px 20px;background:#1d2330;color:#fff}
h1{font-size:18px;margin:0}h2{font-size:15px;margin:0 0 8px}
main{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:16px;padding:16px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:12px 16px}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:3px 8px;border-bottom:1px solid #eef0f3;font-variant-numeric:tabular-nums}
.pill{padding:2px 8px;border-radius:10px;background:#5b6472}.up{background:#1f8a4c}.down{background:#c62f2f}
.hint{color:#5b6472;margin:0 0 8px}.chart{margin-bottom:10px}.chart svg{width:100%;height:70px;background:#fafbfc;border:1px solid #eef0f3}
.chart .label{display:flex;justify-content:space-between}pre{white-space:pre-wrap;word-break:break-all;background:#fafbfc;padding:8px}
td .pill{color:#fff}#relays td:nth-child(n+3){white-space:nowrap}form label{margin-right:10px}#login{padding:20px}#updated{margin-left:auto;color:#c9ced6}`

export const PAGE_JS = `'use strict'
;(() => {
  const COLORS = { executed: '#2f6fd6', replayed: '#1f8a4c', in_progress: '#d68a00', mismatch: '#8a3fd6', store_error: '#c62f2f', unrecorded: '#000' }
  const LABELS = { executed: 'executed', replayed: 'replayed', in_progress: '409 in progress', mismatch: '422 mismatch', store_error: 'store errors', unrecorded: 'unrecorded' }
  const $ = (id) => document.getElementById(id)
  let token = sessionStorage.getItem('idemkey-token') || ''
  const get = async (path) => {
    const response = await fetch(path, { headers: token ? { authorization: 'Bearer ' + token } : {} })
    if (response.status === 401) { showLogin(token ? 'That token was refused.' : ''); throw new Error('unauthorized') }
    return { status: response.status, body: await response.json() }
  }
  const cell = (row, text) => { const td = document.createElement('td'); td.textContent = String(text); row.appendChild(td) }
  const fill = (table, rows, empty) => {
    const body = table.querySelector('tbody'); body.replaceChildren()
    if (rows.length === 0) { const tr = body.insertRow(); cell(tr, empty); return }
    for (const values of rows) { const tr = body.insertRow(); values.forEach((v) => cell(tr, v)) }
  }
  const when = (ms) => new Date(ms).toISOString().replace('T', ' ').slice(0, 19)
  const bytes = (n) => n >= 1073741824 ? (n / 1073741824).toFixed(1) + ' GiB' : n >= 1048576 ? (n / 1048576).toFixed(1) + ' MiB' : n >= 1024 ? (n / 1024).toFixed(1) + ' KiB' : n + ' B'
  const span = (ms) => ms >= 86400000 ? (ms / 86400000).toFixed(1) + ' d' : ms >= 3600000 ? (ms / 3600000).toFixed(1) + ' h' : ms >= 60000 ? (ms / 60000).toFixed(1) + ' min' : Math.round(ms / 1000) + ' s'
  const chart = (name, values, bucketMs) => {
    const rates = values.map((v) => v / (bucketMs / 1000))
    const max = Math.max(...rates, 0.1)
    const w = 300, h = 60, step = w / Math.max(1, rates.length - 1)
    const points = rates.map((r, i) => (i * step).toFixed(1) + ',' + (h - (r / max) * (h - 4) - 2).toFixed(1)).join(' ')
    const div = document.createElement('div'); div.className = 'chart'; div.dataset.series = name
    const label = document.createElement('div'); label.className = 'label'
    const title = document.createElement('span'); title.textContent = LABELS[name]
    const now = document.createElement('span'); now.className = 'rate'; now.textContent = rates[rates.length - 1].toFixed(2) + '/s, peak ' + max.toFixed(2) + '/s, total ' + values.reduce((a, b) => a + b, 0)
    label.append(title, now)
    const ns = 'http://www.w3.org/2000/svg'
    const svg = document.createElementNS(ns, 'svg'); svg.setAttribute('viewBox', '0 0 ' + w + ' ' + h); svg.setAttribute('preserveAspectRatio', 'none')
    svg.setAttribute('role', 'img'); svg.setAttribute('aria-label', LABELS[name] + ' per second')
    const line = document.createElementNS(ns, 'polyline'); line.setAttribute('points', points); line.setAttribute('fill', 'none')
    line.setAttribute('stroke', COLORS[name]); line.setAttribute('stroke-width', '2'); line.setAttribute('vector-effect', 'non-scaling-stroke')
    svg.appendChild(line); div.append(label, svg)
    return div
  }
  const render = (s) => {
    const store = $('store'); store.textContent = s.store.name + (s.store.up ? ' up' : ' down: ' + s.store.error)
    store.className = 'pill ' + (s.store.up ? 'up' : 'down')
    $('updated').textContent = 'updated ' + when(s.generatedAtMs)
    fill($('counts'), Object.entries(s.counts).map(([state, c]) => [state, (c.capped ? '≥ ' : '') + c.count]), 'store unavailable')
    const holders = (list) => list.map((r) => [r.scope, r.key, r.keyHash, r.token, when(r.lockedUntilMs), r.attempts])
    fill($('stuck'), holders(s.stuck), 'none')
    fill($('in-transaction'), holders(s.inTransaction), 'none')
    $('holders-unchecked').hidden = !s.holdersUnchecked
    $('holders-unchecked').textContent = s.holdersUnchecked ? 'The store could not say which run in their transaction (' + s.holdersUnchecked + '): those are listed here.' : ''
    fill($('mismatches'), s.activity.mismatches.map((m) => [when(m.atMs), m.keyHash]), 'none')
    $('inbox-section').hidden = s.inboxes.length === 0
    fill($('inboxes'), s.inboxes.map((i) => [i.consumer, i.retentionMs === null ? '-' : span(i.retentionMs),
      i.error ? 'unavailable: ' + i.error : i.oldest ? when(i.oldest.processedAtMs) : 'none kept',
      i.oldest ? span(Math.max(0, s.generatedAtMs - i.oldest.processedAtMs)) : '-', i.oldest ? i.oldest.messageId : '-']), 'none')
    fill($('failing'), s.inboxes.flatMap((i) => i.failing.map((f) => [i.consumer, f.attempts, when(f.lastAttemptAtMs),
      span(Math.max(0, s.generatedAtMs - f.lastAttemptAtMs)), f.messageId])), 'none')
    $('durability-section').hidden = !s.durability
    if (s.durability) {
      const d = s.durability
      $('durability-status').textContent = d.error ? 'not proven: ' + d.error : d.status.toUpperCase() + (d.losing.length ? ': ' + d.losing.join(', ') + ' can lose acknowledged records' : '') + (d.unchecked.length ? ' (not checked: ' + d.unchecked.join('; ') + ')' : '')
      fill($('durability'), d.report ? d.report.findings.map((f) => [f.failure, f.verdict, f.loses, f.fix || '-']) : [])
    }
    $('relay-section').hidden = s.relays.length === 0
    fill($('relays'), s.relays.map((r) => [r.slot === null ? '?' : r.slot, r.problem === 'unavailable' ? 'unavailable: ' + r.error : r.problem || 'ok',
      r.lagBytes === null ? '-' : bytes(r.lagBytes), bytes(r.maxLagBytes), r.active === null ? '-' : r.active ? 'yes' : 'no', r.walStatus || '-']), 'none')
    s.relays.forEach((r, i) => {
      const state = $('relays').tBodies[0].rows[i].cells[1]
      const pill = document.createElement('span'); pill.className = 'pill ' + (r.problem ? 'down' : 'up'); pill.textContent = r.problem || 'ok'
      state.replaceChildren(pill, r.error ? ': ' + r.error : '')
    })
    $('charts').replaceChildren(...Object.keys(LABELS).map((name) => chart(name, s.activity.series[name], s.activity.bucketMs)))
    document.body.dataset.loaded = 'true'
  }
  const refresh = () => get('api/summary').then((r) => render(r.body)).catch(() => {})
  const showLogin = (message) => { $('main').hidden = true; $('login').hidden = false; $('login-error').textContent = message }
  $('login').addEventListener('submit', (e) => {
    e.preventDefault(); token = $('token').value; sessionStorage.setItem('idemkey-token', token)
    $('login').hidden = true; $('main').hidden = false; refresh()
  })
  $('lookup').addEventListener('submit', async (e) => {
    e.preventDefault()
    const q = new URLSearchParams({ key: $('lookup-key').value, scope: $('lookup-scope').value || 'default' })
    if ($('lookup-bodies').checked) q.set('bodies', '1')
    try { const r = await get('api/record?' + q); $('record').textContent = JSON.stringify(r.body, null, 2) } catch {}
  })
  refresh()
  setInterval(refresh, 5000)
})()
`
