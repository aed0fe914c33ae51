// goreactor dashboard: stalled runs (GET /api/stalls): the overview's
// Stalled tile and list with its kind filter, the run page's banner, and
// the re-dispatch action (POST /api/runs/{id}/redispatch).
(function () {
  'use strict';
  var GR = window.GR, h = GR.h, $ = GR.$;

  GR.actions.redispatch = {
    verb: 'Re-dispatch',
    one: function (id) {
      return 'Re-dispatch run ' + id + ': the sweeper\'s recovery re-enqueues what it lost now (its wake-up, its maps\' element and rollback tasks), ' +
        'nothing that is still queued or held. A worker serving its queue then carries on.';
    },
    many: function (n) { return 'Re-dispatch ' + n + ' runs: the sweeper\'s recovery re-enqueues what each one lost.'; }
  };

  var kindLabels = {
    no_worker: 'no worker', tasks_pending: 'tasks pending', element_lock: 'element lock held',
    no_definition: 'no definition', lost: 'tasks lost', waiting_for_person: 'waiting for a person',
    waiting_for_payload: 'waiting for a payload'
  };

  // ---- run page ------------------------------------------------------------
  // renderStall shows "Stalled: <why>" above the run, or hides it.
  GR.renderStall = function (s) {
    var box = $('stall-banner');
    if (!box) return;
    box.hidden = !s;
    GR.clear(box);
    if (!s) { delete box.dataset.kind; return; }
    box.dataset.kind = s.kind;
    box.classList.toggle('stall-waiting', !s.stalled);
    box.appendChild(h('strong', { class: 'stall-title' }, s.stalled ? 'Stalled: ' : 'Waiting: '));
    box.appendChild(h('span', { class: 'stall-why' }, s.why));
    box.appendChild(h('span', { class: 'muted small stall-idle' }, ' (idle ' + GR.fmtDur(s.idle_ms) + ', queue ' + s.queue +
      (s.queue_default ? ' (default)' : '') + ')'));
    var more = (s.details || []).filter(function (d) { return d !== s.why; });
    if (more.length) box.appendChild(h('ul', { class: 'stall-details' }, more.map(function (d) { return h('li', null, d); })));
  };

  // ---- overview ------------------------------------------------------------
  var kind = '';      // the kind filter, '' for every kind
  var lastStalls = '';
  var page = null;

  GR.refreshStalls = function () {
    if (!$('stalls-panel')) return null;
    return GR.api('/api/stalls').then(function (res) {
      var key = JSON.stringify(res.data);
      if (key === lastStalls) return;
      lastStalls = key;
      page = res.data || {};
      renderStalls();
    }, function (err) {
      lastStalls = '';
      $('stalls-text').textContent = 'could not load: ' + err.message;
    });
  };

  function renderStalls() {
    var p = page || {}, runs = p.runs || [];
    var n = p.stalled || 0;
    $('stalls-count').textContent = String(n) + (p.truncated ? '+' : '');
    $('stalls-tile').classList.toggle('zero', n === 0);
    $('stalls-panel').dataset.count = String(n);
    $('stalls-text').textContent = 'no progress for ' + GR.fmtDur(p.stall_after_ms || 0) + ', longest first' +
      (p.waiting_for_person ? '; ' + p.waiting_for_person + ' waiting for a person' : '') +
      (p.truncated ? '; ' + p.examined + ' of ' + p.active + ' live runs examined' : '');
    var kinds = GR.clear($('stalls-kinds'));
    var by = p.by_kind || {};
    var chip = function (k, label, count) {
      var b = h('button', { type: 'button', class: 'btn btn-chip' + (kind === k ? ' active' : ''), dataset: { kind: k } }, label + ' ' + count);
      b.addEventListener('click', function () { kind = kind === k && k !== '' ? '' : k; renderStalls(); });
      kinds.appendChild(b);
    };
    chip('', 'all', runs.length);
    Object.keys(kindLabels).forEach(function (k) { if (by[k]) chip(k, kindLabels[k], by[k]); });
    var ul = GR.clear($('stalls-list'));
    var shown = runs.filter(function (s) { return !kind || s.kind === kind; });
    if (!shown.length) { ul.appendChild(h('li', { class: 'muted stalls-none' }, 'Nothing is stalled.')); return; }
    shown.forEach(function (s) {
      var li = h('li', { class: 'stall-run', dataset: { id: s.run_id, kind: s.kind } },
        GR.runLink(s.run_id, 'stall-link'),
        h('span', { class: 'muted' }, s.reactor),
        GR.badge(s.status),
        h('span', { class: 'stall-kind' }, kindLabels[s.kind] || s.kind),
        h('span', { class: 'mono small', title: s.queue_default ? 'the run recorded no queue: the dashboard\'s control queue' : 'the run\'s queue' },
          s.queue + (s.queue_default ? ' (default)' : '')),
        h('span', { class: 'muted small' }, 'idle ' + GR.fmtDur(s.idle_ms)),
        h('span', { class: 'stall-why' }, s.why));
      if (s.stalled) {
        var b = h('button', { type: 'button', class: 'btn btn-small', dataset: { redispatch: s.run_id } }, 'Re-dispatch');
        b.title = GR.actions.redispatch.one(s.run_id);
        b.addEventListener('click', function () { GR.runAction(s.run_id, 'redispatch'); });
        li.appendChild(b);
      }
      ul.appendChild(li);
    });
  }
})();
