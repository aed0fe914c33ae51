// goreactor dashboard: the runs paused at an interrupt step (GET
// /api/paused), each with what it waits for.
(function () {
  'use strict';
  var GR = window.GR, h = GR.h, $ = GR.$;

  // GR.deadlineEl shows an interrupt's deadline with the time left.
  GR.deadlineEl = function (v) {
    if (!v.deadline) return h('span', { class: 'muted' }, 'none');
    var left = v.time_left_ms;
    return h('span', { class: 'deadline' + (left === 0 ? ' bad-text' : left < 5 * 60 * 1000 ? ' warn' : '') },
      GR.timeEl(v.deadline, 'short'), ' ',
      h('span', { class: 'muted small time-left' }, left === 0 ? '(passed)' : '(' + GR.fmtDur(left) + ' left)'));
  };

  // GR.expectedEl shows the payload an interrupt expects: its type and an
  // example, or why the dashboard cannot say.
  GR.expectedEl = function (v) {
    if (!v.payload_type) return h('span', { class: 'muted small', title: 'Give the dashboard the definitions (dashboard.Config.Definitions) to show the payload type' }, 'unknown to the dashboard');
    return h('span', { class: 'expected' }, h('span', { class: 'mono strong' }, v.payload_type), ' ',
      h('code', { class: 'mono small example' }, v.example === null || v.example === undefined ? '' : JSON.stringify(v.example)));
  };

  // The paused page (the helpers above serve the run page too).
  if (document.body.dataset.page !== 'paused') return;
  var params = new URLSearchParams(location.search);
  var reactor = params.get('reactor') || '';
  var cursor = params.get('cursor') || '';
  var last = '';

  function refresh() {
    return GR.api('/api/paused' + GR.query({ reactor: reactor, cursor: cursor })).then(function (res) {
      var data = res.data || {};
      var text = JSON.stringify([data.runs, data.next_cursor, Math.floor(Date.now() / 10000)]);
      if (text === last) return;
      last = text;
      render(data);
    }, function (err) {
      var empty = $('paused-empty');
      empty.textContent = 'Could not load the paused runs: ' + err.message;
      empty.hidden = false;
      throw err;
    });
  }

  function render(data) {
    var runs = data.runs || [];
    var body = GR.clear($('paused'));
    runs.forEach(function (p) {
      body.appendChild(h('tr', { class: 'paused-run', dataset: { id: p.id, step: p.step } },
        h('td', null, GR.runLink(p.id, 'paused-link')),
        h('td', { class: 'muted' }, p.reactor),
        h('td', { class: 'mono' }, p.step),
        h('td', { class: 'mono' }, p.correlation || h('span', { class: 'muted' }, '—')),
        h('td', null, GR.timeEl(p.since, 'short'), ' ', h('span', { class: 'muted small' }, '(' + GR.fmtDur(p.paused_ms) + ')')),
        h('td', null, GR.deadlineEl(p)),
        h('td', { class: 'num' }, p.received + ' / ' + p.accepts),
        h('td', null, GR.expectedEl(p)),
        h('td', null, p.refused ? h('span', { class: 'bad-text small', title: p.refused_at }, p.refused) : h('span', { class: 'muted' }, '—'))));
    });
    $('paused-text').textContent = runs.length + ' run' + (runs.length === 1 ? '' : 's') + (data.next_cursor ? ' on this page' : '') +
      (reactor ? ' of reactor ' + reactor : '');
    var empty = $('paused-empty');
    empty.textContent = 'No run is paused at an interrupt.';
    empty.hidden = runs.length !== 0;
    var more = $('paused-more');
    more.hidden = !data.next_cursor;
    more.onclick = function () { cursor = data.next_cursor; last = ''; GR.poller.nudge(); };
  }

  document.addEventListener('DOMContentLoaded', function () { GR.poller.start(refresh); });
})();
