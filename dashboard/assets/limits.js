// goreactor dashboard: who holds a step limit's key, its recent admissions
// and who waits (GET /api/limits?name=&key=).
(function () {
  'use strict';
  var GR = window.GR, h = GR.h, $ = GR.$;
  if (document.body.dataset.page !== 'limits') return;
  var params = new URLSearchParams(location.search);
  var name = params.get('name') || '';
  var key = params.get('key') || '';
  var last = '';

  function stepCell(s) { return h('td', { class: 'mono' }, s || h('span', { class: 'muted' }, '—')); }

  function waitersEl(ws, none) {
    if (!ws.recorded) {
      return h('p', { class: 'muted small waiters-unrecorded' }, 'Waiters are not recorded: ' + none +
        ' An attempt that finds the limit full waits in its worker for up to a second, then its task is snoozed; the workers\' events (reactor.limit.waited, reactor.limit.refused) and their metrics goreactor_limit_waits_total and goreactor_limit_refusals_total count them.');
    }
    var rows = (ws.waiters || []).map(function (x) {
      return h('tr', { class: 'limit-waiter', dataset: { id: x.run_id } },
        h('td', null, GR.runLink(x.run_id)), stepCell(x.step),
        h('td', null, GR.timeEl(x.last_refused, 'short'), ' ', h('span', { class: 'muted small' }, '(' + GR.fmtDur(x.ago_ms) + ' ago)')),
        h('td', null, x.holds ? h('span', { class: 'small' }, 'holds a slot now') : h('span', { class: 'muted small' }, 'waiting')));
    });
    return h('div', null,
      h('p', { class: 'muted small' }, ws.count + ' recorded' + (ws.count > rows.length ? ', the latest ' + rows.length + ' shown' : '') + ', latest refusal first.'),
      h('div', { class: 'table-scroll' }, h('table', { class: 'table compact limit-waiters' },
        h('thead', null, h('tr', null, h('th', null, 'run'), h('th', null, 'step'), h('th', null, 'last refused'), h('th', null, 'now'))),
        h('tbody', null, rows))));
  }

  function render(d) {
    $('limit-view').hidden = false;
    var lt = $('limits-text');
    lt.textContent = 'limit ' + d.name + ', key ' + (d.key === '' ? '(none)' : d.key) + ', as of ';
    lt.appendChild(GR.timeEl(d.now, 'short'));
    var c = d.concurrency, body = GR.clear($('holders'));
    (c.holders || []).forEach(function (x) {
      body.appendChild(h('tr', { class: 'limit-holder' + (x.expired ? ' muted' : ''), dataset: { id: x.run_id, expired: String(x.expired), parked: String(!!x.parked) } },
        h('td', null, GR.runLink(x.run_id)), stepCell(x.step),
        x.parked ? h('td', { title: x.holder }, h('span', { class: 'muted small' }, 'no lease: the run waits (paused, on a map, at a checkpoint)'))
          : h('td', { title: x.holder }, GR.timeEl(x.lease_ends, 'short'), ' ',
            h('span', { class: 'muted small' }, x.expired ? '(ended)' : '(' + GR.fmtDur(x.lease_left_ms) + ' left)')),
        h('td', null, x.expired ? h('span', { class: 'warn small', title: 'The holder stopped renewing its lease (its process died?): the next acquire drops it' }, 'lease ended')
          : x.parked ? h('span', { class: 'small', title: 'A run limit (reactor.RunLimits): held until the run ends' }, 'held by a waiting run') : 'holding')));
    });
    $('holders-text').textContent = c.held + ' holding' + (c.expired ? ', ' + c.expired + ' with an ended lease' : '') + (c.truncated ? ' (the first ' + c.holders.length + ' listed)' : '');
    var he = $('holders-empty');
    he.textContent = 'No holder: nothing runs under this limit and key now (or it is no concurrency limit).';
    he.hidden = (c.holders || []).length !== 0;
    GR.clear($('waiters')).appendChild(waitersEl(c.waiters, 'the workers do not note refused attempts in ' + c.waiters.redis_key + ', or none was refused lately.'));

    var fp = $('fair-panel'), f = d.fair;
    fp.hidden = !f;
    if (f) {
      $('fair-text').textContent = f.held + ' of its slots held, ' + f.tenants.length + ' key(s) holding or waiting';
      var tb = GR.clear($('fair-tenants'));
      f.tenants.forEach(function (x) {
        tb.appendChild(h('tr', { class: 'limit-tenant' + (x.key === d.key ? ' strong' : ''), dataset: { key: x.key } },
          h('td', { class: 'mono' }, x.key === '' ? h('span', { class: 'muted' }, '(none)') : x.key),
          h('td', null, String(x.holds)), h('td', null, String(x.waiting))));
      });
      var fb = GR.clear($('fair-holders'));
      f.holders.forEach(function (x) {
        fb.appendChild(h('tr', { class: 'limit-fair-holder' + (x.expired ? ' muted' : ''), dataset: { id: x.run_id } },
          h('td', null, GR.runLink(x.run_id)), stepCell(x.step), h('td', { class: 'mono' }, x.key),
          h('td', { title: x.holder }, GR.timeEl(x.lease_ends, 'short'), ' ',
            h('span', { class: 'muted small' }, x.expired ? '(ended)' : '(' + GR.fmtDur(x.lease_left_ms) + ' left)'))));
      });
      GR.clear($('fair-waiters')).appendChild(waitersEl(f.waiters, 'none was refused in the last few seconds.'));
    }

    var r = d.rate;
    GR.clear($('rate-counts')).appendChild(h('ul', { class: 'limit-count-list' },
      [['last 1 s', r.last_1s, 'count-1s'], ['last 10 s', r.last_10s, 'count-10s'], ['last 60 s', r.last_60s, 'count-60s']].map(function (x) {
        return h('li', { class: 'limit-count', id: x[2] }, h('span', { class: 'strong' }, String(x[1])), ' ', h('span', { class: 'muted small' }, x[0]));
      })));
    $('rate-text').textContent = r.kept + ' kept (the limit keeps its longest window)' + (r.last_admitted ? ', last ' : '');
    if (r.last_admitted) $('rate-text').appendChild(GR.timeEl(r.last_admitted, 'short'));
    var rb = GR.clear($('recent'));
    (r.recent || []).forEach(function (x) {
      rb.appendChild(h('tr', { class: 'limit-admission', dataset: { id: x.run_id } }, h('td', null, GR.runLink(x.run_id)), stepCell(x.step), h('td', null, GR.timeEl(x.at, 'short'))));
    });
    var re = $('recent-empty');
    re.textContent = 'No admission kept: nothing started under this limit and key within its window (or it is no rate limit).';
    re.hidden = (r.recent || []).length !== 0;
    GR.clear($('rate-waiters')).appendChild(waitersEl(r.waiters, 'the workers do not note refused attempts in ' + r.waiters.redis_key + ', or none was refused lately.'));
  }

  function refresh() {
    if (!name) return Promise.resolve();
    return GR.api('/api/limits' + GR.query({ name: name, key: key })).then(function (res) {
      $('limits-error').hidden = true;
      var d = res.data || {};
      var text = JSON.stringify([d.concurrency, d.rate, d.fair, Math.floor(Date.now() / 1000)]);
      if (text === last) return;
      last = text;
      render(d);
    }, function (err) {
      var e = $('limits-error');
      e.textContent = 'Could not read the limit: ' + err.message;
      e.hidden = false;
      throw err;
    });
  }

  document.addEventListener('DOMContentLoaded', function () {
    $('limit-name').value = name;
    $('limit-key').value = key;
    if (!name) $('limit-name').focus();
    GR.poller.start(refresh);
  });
})();
