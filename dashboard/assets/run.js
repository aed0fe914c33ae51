// goreactor dashboard: one run (header, failure, rollback, step timeline,
// maps with their element grids, inputs, children, rollback log).
(function () {
  'use strict';
  if (document.body.dataset.page !== 'run') return;
  var GR = window.GR, h = GR.h, $ = GR.$;

  var runID = '';
  var last = {};          // section -> JSON of what it last drew
  var openDetails = {};   // step name -> result shown
  var maps = {};          // step -> {key, summary, polls, picked, box}

  function changed(section, data) {
    var k = JSON.stringify(data);
    if (last[section] === k) return false;
    last[section] = k;
    return true;
  }

  function show(id, on) { $(id).hidden = !on; }

  // ---- header --------------------------------------------------------------
  function fact(dl, label, value) {
    if (value === null || value === undefined || value === '' || (Array.isArray(value) && !value.length)) return;
    dl.appendChild(h('div', { class: 'fact' }, h('dt', null, label), h('dd', null, value)));
  }

  function renderHead(r) {
    var st = GR.clear($('run-status'));
    st.appendChild(GR.badge(r.status, 'badge-lg'));
    $('run-reactor').textContent = r.reactor;
    document.title = r.id + ' · ' + r.reactor + ' · goreactor';
    var dl = GR.clear($('run-facts'));
    fact(dl, 'created', GR.timeEl(r.created_at));
    fact(dl, 'updated', h('span', null, GR.timeEl(r.updated_at), ' ', h('span', { class: 'muted' }, '(' + GR.fmtAgo(r.updated_at) + ')')));
    fact(dl, 'elapsed', GR.fmtDur(r.elapsed_ms));
    fact(dl, 'queue', r.queue ? h('span', { class: 'mono', title: r.queue_default ? 'the run recorded no queue: the dashboard\'s control queue, where its actions go' : '' },
      r.queue + (r.queue_default ? ' (default)' : '')) : '');
    fact(dl, 'element of', r.element ? h('span', null, GR.runLink(r.element.owner, 'owner-link'), ' \u00b7 map ',
      h('span', { class: 'mono' }, r.element.step), ' \u00b7 element ' + r.element.index) : '');
    fact(dl, 'trace', r.trace_id ? h('span', { class: 'mono', title: r.trace_id }, r.trace_id) : '');
    fact(dl, 'reason', r.reason);
    var def = r.definition || {};
    fact(dl, 'definition', def.fingerprint ? h('span', { class: 'mono', title: 'fingerprint ' + def.fingerprint }, 'v' + def.version + ' (' + def.fingerprint + ')') : '');
    var wf = r.waiting_for;
    fact(dl, 'waiting', r.waiting ? h('span', { class: 'bad-text', title: wf && wf.by ? 'refused by ' + wf.by + ' at ' + wf.at : '' },
      r.waiting + (wf && wf.have && wf.have.length ? '; the worker that refused it has ' +
        wf.have.map(function (v) { return 'v' + v.version + ' (' + v.fingerprint + ')'; }).join(', ') : '')) : '');
    fact(dl, 'retry of', r.retry_of ? GR.runLink(r.retry_of, 'retry-of') : '');
    fact(dl, 'retried by', (r.retried_by || []).length ? h('span', { class: 'links' }, r.retried_by.map(function (id) { return GR.runLink(id, 'retried-by'); })) : '');
    var sb = r.spawned_by;
    fact(dl, 'spawned by', sb ? h('span', null, GR.runLink(sb.run, 'spawned-by'), h('span', { class: 'muted small' }, ' step '), h('span', { class: 'mono' }, sb.step)) : '');
    fact(dl, 'spawned', (r.spawned || []).length ? h('span', { class: 'links' }, r.spawned.map(function (l) {
      return h('span', { class: 'spawned', title: l.reactor + ', spawned by step ' + l.step }, GR.runLink(l.run, 'spawned-run'),
        h('span', { class: 'muted small' }, ' (' + l.step + ')'));
    })) : '');
  }

  // ---- failure -------------------------------------------------------------
  function renderFailure(f) {
    show('failure-panel', !!f);
    var box = GR.clear($('failure'));
    if (!f) return;
    box.appendChild(h('div', { class: 'failure-main' },
      h('span', { class: 'fail-step' }, f.step || '(run)'),
      h('span', { class: 'failure-msg' }, f.message)));
    // A step that panicked: its stack, folded (it can run to many lines).
    if (f.stack) {
      box.appendChild(h('details', { class: 'failure-stack' },
        h('summary', null, 'stack (the step panicked)'),
        h('pre', { class: 'json' }, f.stack)));
    }
    var rf = f.rollback_failures || [];
    if (rf.length) {
      box.appendChild(h('h3', { class: 'sub' }, 'Rollback failures (' + rf.length + ')'));
      box.appendChild(h('table', { class: 'table compact' },
        h('thead', null, h('tr', null, h('th', null, 'step'), h('th', null, 'kind'), h('th', null, 'message'))),
        h('tbody', null, rf.map(function (x) {
          return h('tr', null, h('td', { class: 'mono' }, x.step), h('td', null, x.kind), h('td', { class: 'bad-text' }, x.message));
        }))));
    }
  }

  // ---- progress bars -------------------------------------------------------
  // bar draws segments [{cls, n, label}] out of total.
  function bar(kind, total, segs, attrs) {
    var el = h('div', Object.assign({ class: 'bar bar-' + kind, role: 'progressbar', 'aria-valuemin': '0', 'aria-valuemax': String(total) }, attrs || {}));
    var sum = 0;
    segs.forEach(function (s) {
      if (!s.n || s.n < 0 || !total) return;
      var seg = h('div', { class: 'seg ' + s.cls, title: s.label + ': ' + GR.fmtNum(s.n) });
      seg.style.width = Math.min(100, (s.n / total) * 100) + '%';
      el.appendChild(seg);
      sum += s.n;
    });
    el.setAttribute('aria-valuenow', String(sum));
    return el;
  }

  function rollbackBar(rb, kind) {
    var failed = rb.failed || 0, settled = rb.settled || 0;
    return bar(kind || 'rollback', rb.total, [
      { cls: 'seg-undone', n: settled - failed, label: 'undone' },
      { cls: 'seg-undo_failed', n: failed, label: 'undo failed' }
    ], { dataset: { settled: String(settled), total: String(rb.total), failed: String(failed) } });
  }

  function pct(n, total) { return total ? Math.floor((n / total) * 100) + '%' : '0%'; }

  function renderRollback(rb) {
    show('rollback-panel', !!rb);
    var box = GR.clear($('rollback-bar'));
    if (!rb) return;
    $('rollback-text').textContent = GR.fmtNum(rb.settled) + ' of ' + GR.fmtNum(rb.total) + ' undone (' + pct(rb.settled, rb.total) + ')' +
      ' · ' + GR.fmtNum(rb.outstanding) + ' outstanding' + (rb.failed ? ' · ' + GR.fmtNum(rb.failed) + ' failed' : '');
    box.appendChild(rollbackBar(rb, 'run-rollback'));
  }

  // ---- timeline ------------------------------------------------------------
  function renderTimeline(r) {
    var steps = r.steps || [];
    var box = GR.clear($('timeline'));
    if (!steps.length) { box.appendChild(h('p', { class: 'muted' }, 'No steps recorded yet.')); return; }
    var now = Date.now();
    var t0 = Infinity, t1 = -Infinity;
    steps.forEach(function (s) {
      if (!s.started_at) return;
      var a = Date.parse(s.started_at);
      var b = s.finished_at ? Date.parse(s.finished_at) : (s.status === 'running' || s.status === 'paused' ? now : a + (s.duration_ms || 0));
      t0 = Math.min(t0, a); t1 = Math.max(t1, b);
    });
    if (!isFinite(t0)) { t0 = Date.parse(r.created_at) || now; t1 = t0 + 1; }
    var span = Math.max(1, t1 - t0);
    $('steps-span').textContent = steps.length + ' steps · ' + GR.fmtDur(span);

    var axis = h('div', { class: 'tl-axis' });
    [0, 0.25, 0.5, 0.75, 1].forEach(function (f) {
      var tick = h('span', { class: 'tl-tick' }, f === 0 ? GR.fmtClock(new Date(t0).toISOString()) : '+' + GR.fmtDur(span * f));
      tick.style.left = (f * 100) + '%';
      axis.appendChild(tick);
    });
    box.appendChild(h('div', { class: 'tl-row tl-head' },
      h('div', { class: 'tl-name' }, 'step'), h('div', { class: 'tl-status' }, 'status'),
      h('div', { class: 'tl-att num' }, 'tries'), h('div', { class: 'tl-dur num' }, 'duration'),
      h('div', { class: 'tl-track tl-axis-track' }, axis)));

    steps.forEach(function (s) {
      var track = h('div', { class: 'tl-track' });
      if (s.started_at) {
        var a = Date.parse(s.started_at);
        var d = s.finished_at ? Date.parse(s.finished_at) - a : (s.status === 'running' || s.status === 'paused' ? now - a : (s.duration_ms || 0));
        var b = h('div', { class: 'tl-bar st-bg-' + s.status, title: s.name + ' · ' + s.status + ' · ' + GR.fmtDur(s.duration_ms) + ' · started ' + s.started_at });
        b.style.left = ((a - t0) / span) * 100 + '%';
        b.style.width = Math.max(0.4, (d / span) * 100) + '%';
        track.appendChild(b);
      }
      var hasResult = s.result !== null && s.result !== undefined;
      var more = stepAttempts(s); // its attempts and args, or null
      var opens = hasResult || !!more;
      var name = opens
        ? h('button', { type: 'button', class: 'tl-name tl-toggle mono' + (openDetails[s.name] ? ' open' : ''), title: 'Show the ' + (more ? 'attempts, args and result' : 'result') + ' of ' + s.name, 'aria-expanded': openDetails[s.name] ? 'true' : 'false' }, s.name)
        : h('div', { class: 'tl-name mono', title: s.name }, s.name);
      var row = h('div', { class: 'tl-row' + (s.needs_human ? ' tl-row-needs' : ''), dataset: { step: s.name, status: s.status, needsHuman: s.needs_human ? 'true' : 'false' } },
        name,
        h('div', { class: 'tl-status' }, GR.badge(s.status),
          s.task ? h('span', { class: 'badge tl-task', title: 'runs as an asynq task of its own' + (s.worker ? '; latest attempt on ' + s.worker : '') }, 'task') : null,
          s.needs_human ? h('span', { class: 'badge st-needs-human tl-needs', title: 'an undo of this step waits for a person: see Action required' }, 'needs a person') : null),
        h('div', { class: 'tl-att num' }, s.attempts ? String(s.attempts) : ''),
        h('div', { class: 'tl-dur num' }, s.started_at ? GR.fmtDur(s.finished_at ? s.duration_ms : (s.status === 'running' || s.status === 'paused' ? now - Date.parse(s.started_at) : s.duration_ms)) : ''),
        track);
      box.appendChild(row);
      var extra = [];
      if (s.error) extra.push(h('div', { class: 'tl-error' }, s.error));
      var result = null;
      if (opens) {
        result = h('div', { class: 'tl-detail' }, more,
          hasResult ? h('div', { class: 'tl-result' }, h('span', { class: 'muted small' }, 'result '), GR.valueEl(s.result)) : null);
        result.hidden = !openDetails[s.name];
        extra.push(result);
        name.addEventListener('click', function () {
          openDetails[s.name] = !openDetails[s.name];
          result.hidden = !openDetails[s.name];
          name.classList.toggle('open', !!openDetails[s.name]);
          name.setAttribute('aria-expanded', openDetails[s.name] ? 'true' : 'false');
          ext.hidden = !s.error && !openDetails[s.name];
        });
      }
      var ext = h('div', { class: 'tl-extra' }, extra);
      ext.hidden = !s.error && !openDetails[s.name];
      if (extra.length) box.appendChild(ext);
    });
  }

  // ---- a step's attempts and args ------------------------------------------
  // stepAttempts is what a step row opens to besides its result: each
  // attempt (number, start, duration, error) when there was more than one,
  // or one that failed, and the args the step ran with. null when there is
  // nothing to show.
  function stepAttempts(s) {
    var log = s.attempt_log || [];
    var hasArgs = s.args !== null && s.args !== undefined;
    var many = log.length > 1 || s.attempts_dropped > 0 || log.some(function (a) { return !!a.error; }) || (s.task && log.length > 0);
    var workers = log.some(function (a) { return !!a.worker; });
    if (!many && !hasArgs) return null;
    var box = h('div', { class: 'tl-attempts-box' });
    if (many) {
      var rows = log.map(function (a) {
        return h('tr', { class: 'tl-attempt', dataset: { attempt: String(a.attempt), outcome: a.error ? 'error' : 'ok' } },
          h('td', { class: 'num' }, '#' + a.attempt),
          h('td', null, GR.h('time', { datetime: a.started_at, title: a.started_at }, GR.fmtClock(a.started_at))),
          h('td', { class: 'num' }, a.ended_at ? GR.fmtDur(a.duration_ms) : h('span', { class: 'muted', title: 'no end recorded: its worker died, or it still runs' }, '…')),
          workers ? h('td', { class: 'mono small tl-attempt-worker' }, a.worker || '') : null,
          h('td', { class: 'tl-attempt-error' }, a.error
            ? [h('span', { class: 'tl-error' }, a.error), a.retryable ? null : h('span', { class: 'muted small' }, ' (permanent)')]
            : h('span', { class: 'muted' }, 'ok')));
      });
      if (s.attempts_dropped > 0) {
        rows.unshift(h('tr', { class: 'tl-attempt-dropped' }, h('td', { colspan: workers ? 5 : 4, class: 'muted small' },
          GR.fmtNum(s.attempts_dropped) + ' earlier attempt' + (s.attempts_dropped === 1 ? '' : 's') + ' not kept')));
      }
      box.appendChild(h('table', { class: 'table tl-attempts' },
        h('thead', null, h('tr', null, (workers ? ['attempt', 'started', 'took', 'worker', 'error'] : ['attempt', 'started', 'took', 'error']).map(function (c) { return h('th', null, c); }))),
        h('tbody', null, rows)));
    }
    if (hasArgs) box.appendChild(h('div', { class: 'tl-result tl-args' }, h('span', { class: 'muted small' }, 'args '), GR.valueEl(s.args)));
    return box;
  }

  // ---- applied steps (undo stack) ------------------------------------------
  // A finished run that kept its effects lists the steps still applied; the
  // operator ticks some and undoes only those (POST .../undo-steps).
  var keeps = { completed: true, halted: true, aborted: true };
  var picked = {};        // step path -> ticked
  var undoStatus = '';    // the run's status as the panel last drew it

  function pickedSteps() {
    return Object.keys(picked).filter(function (k) { return picked[k]; });
  }

  function updatePicked() {
    var n = pickedSteps().length;
    $('undo-steps-button').disabled = n === 0;
    $('undosteps-picked').textContent = n ? n + (n === 1 ? ' step' : ' steps') + ' selected' : 'tick the steps to undo';
  }

  function renderUndoSteps(status, ledger) {
    var on = !!keeps[status] && ledger.length > 0;
    show('undosteps-panel', on);
    undoStatus = status;
    var box = GR.clear($('undosteps'));
    var still = {};
    ledger.forEach(function (e) { still[e.step] = true; });
    Object.keys(picked).forEach(function (k) { if (!still[k]) delete picked[k]; });
    if (!on) { picked = {}; updatePicked(); return; }
    $('undosteps-text').textContent = ledger.length + (ledger.length === 1 ? ' entry' : ' entries') + ' on the undo stack, oldest first';
    var seen = {};
    box.appendChild(h('table', { class: 'table compact undo-stack' },
      h('thead', null, h('tr', null, ['', '#', 'step', 'resource', 'status'].map(function (c) { return h('th', null, c); }))),
      h('tbody', null, ledger.map(function (e) {
        // One box per step path: undoing a step undoes all its entries.
        var first = !seen[e.step];
        seen[e.step] = true;
        var tick = null;
        if (first) {
          tick = h('input', { type: 'checkbox', class: 'undo-pick', 'aria-label': 'undo step ' + e.step, dataset: { step: e.step } });
          tick.checked = !!picked[e.step];
          tick.addEventListener('change', function () { picked[e.step] = tick.checked; updatePicked(); });
        }
        return h('tr', { dataset: { step: e.step } },
          h('td', null, tick),
          h('td', { class: 'num' }, String(e.ordinal)),
          h('td', { class: 'mono' }, e.step, e.interrupted ? h('span', { class: 'muted small' }, ' (interrupted)') : null),
          h('td', { class: 'mono muted' }, e.resource || ''),
          // pending: not undone yet, so still applied; otherwise what its
          // last undo left (compensation_failed, out_of_window, ...).
          h('td', null, h('span', { class: 'rb-status rb-' + String(e.status).replace(/[^a-z_]/g, ''), title: e.status },
            e.status === 'pending' ? 'applied' : e.status)));
      }))));
    updatePicked();
  }

  function undoSelected() {
    var steps = pickedSteps();
    if (!steps.length) return;
    var n = steps.length, what = n === 1 ? '1 step' : n + ' steps';
    GR.confirmReason('Undo ' + what + ' of run ' + runID + '?',
      'Undo only the steps listed, newest first, with their undo functions. The other steps stay applied and the run stays ' +
        undoStatus + '. A step that changed a resource a later step changed too can only be undone with that later step.',
      steps, 'Undo ' + what).then(function (why) {
      if (why === null) return null;
      return GR.post('/api/runs/' + encodeURIComponent(runID) + '/undo-steps', { steps: steps, reason: why }).then(function (res) {
        var d = res.data || {};
        if (d.warning) GR.message('warn', 'Undo of ' + what + ' queued for run ' + runID + ' but nothing will carry it out yet', d.warning);
        else GR.message('ok', 'Undo of ' + what + ' requested for run ' + runID,
          (d.duplicate ? 'Already requested; the same control task is queued.' : 'A worker carries it out.') +
          (d.task_id ? ' Task ' + d.task_id + '.' : ''));
        picked = {};
        Array.prototype.forEach.call(document.querySelectorAll('#undosteps .undo-pick'), function (b) { b.checked = false; });
        updatePicked();
        return res;
      }, function (err) {
        GR.message('error', 'Undo of ' + what + ' of run ' + runID + (err.status ? ' refused (' + err.status + ')' : ' not sent'), err.message);
        return null;
      });
    }).then(function (r) { GR.poller.nudge(); return r; });
  }

  // ---- maps ----------------------------------------------------------------
  function dominant(c) {
    // Ties go to the state an operator most needs to see.
    var order = ['undo_failed', 'failed', 'running', 'undone', 'completed', 'unavailable', 'pending'];
    var best = 'pending', n = -1;
    order.forEach(function (s) { if ((c[s] || 0) > n) { best = s; n = c[s] || 0; } });
    return best;
  }

  function cellRange(cells, i, total) {
    // "to" may be inclusive or exclusive; adjacent cells tell which.
    var c = cells[i];
    var exclusive = cells.length > 1 ? cells[1].from === cells[0].to : c.to === total;
    return { from: c.from, last: exclusive ? c.to - 1 : c.to };
  }

  function renderGrid(m, st) {
    var s = st.summary;
    // Rebuilt on every poll: a cell that had the focus gets it back.
    var hadFocus = st.grid.contains(document.activeElement);
    var grid = GR.clear(st.grid);
    if (!s || !s.cells) return;
    if (!(st.focus >= 0 && st.focus < s.cells.length)) st.focus = 0;
    var cells = s.cells;
    var tally = {};
    GR.cellStates.forEach(function (k) { tally[k] = 0; });
    cells.forEach(function (c, i) {
      var d = dominant(c);
      var rng = cellRange(cells, i, st.total);
      var counts = GR.cellStates.filter(function (k) { return c[k]; }).map(function (k) { return k.replace(/_/g, ' ') + ' ' + c[k]; });
      var label = (rng.from === rng.last ? 'element ' + rng.from : 'elements ' + rng.from + '–' + rng.last) + (counts.length ? ': ' + counts.join(', ') : '');
      // One tab stop for the whole grid (a thousand would trap a keyboard
      // user): the focused cell has tabindex 0, the arrow keys move it,
      // Enter or Space opens its elements (gridKeys); one listener on the
      // grid opens a clicked cell's.
      // A failure never hides behind a majority: a cell holding one is
      // ringed even when most of its elements are fine.
      var flag = d !== 'undo_failed' && c.undo_failed ? ' has-undo_failed' : (d !== 'failed' && d !== 'undo_failed' && c.failed ? ' has-failed' : '');
      grid.appendChild(h('div', { class: 'cell cs-' + d + flag + (st.picked === i ? ' picked' : ''), title: label, role: 'button',
        tabindex: i === st.focus ? '0' : '-1', 'aria-label': label, 'aria-pressed': st.picked === i ? 'true' : 'false', dataset: { state: d, index: String(i) } }));
      tally[d]++;
    });
    if (hadFocus && grid.children[st.focus]) grid.children[st.focus].focus();
    grid.dataset.cells = String(cells.length);
    GR.cellStates.forEach(function (k) { grid.dataset[k.replace(/_(\w)/g, function (_, c) { return c.toUpperCase(); })] = String(tally[k]); });
    st.scale.textContent = cells.length + ' cells · ' + (s.bucket_size > 1 ? GR.fmtNum(s.bucket_size) + ' elements each' : 'one element each') + ' · click a cell (or Tab to the grid, arrows, Enter) for its elements';
  }

  function pickCell(m, st, i) {
    var cells = st.summary.cells;
    var rng = cellRange(cells, i, st.total);
    var limit = Math.min(50, rng.last - rng.from + 1);
    var path = '/api/runs/' + encodeURIComponent(runID) + '/maps/' + encodeURIComponent(m.step) + '/elements' + GR.query({ from: rng.from, limit: limit });
    GR.api(path).then(function (res) {
      var els = (res.data && res.data.elements) || [];
      var box = GR.clear(st.elements);
      box.appendChild(h('div', { class: 'el-head' },
        h('strong', null, 'Elements ' + rng.from + (rng.last > rng.from ? '–' + Math.min(rng.last, rng.from + limit - 1) : '')),
        h('button', { type: 'button', class: 'btn btn-link', onclick: function () { st.picked = -1; GR.clear(st.elements); renderGrid(m, st); } }, 'close')));
      box.appendChild(h('table', { class: 'table compact elements' },
        h('thead', null, h('tr', null, h('th', { class: 'num' }, '#'), h('th', null, 'state'), h('th', null, 'rollback'), h('th', null, 'error'))),
        h('tbody', null, els.map(function (e) {
          return h('tr', null,
            h('td', { class: 'num' }, h('a', { href: GR.runURL(m.map_id + '.' + e.index), class: 'mono', title: 'element run ' + m.map_id + '.' + e.index }, String(e.index))),
            h('td', null, GR.badge(e.state)),
            h('td', null, e.rollback_outcome || ''),
            h('td', { class: 'bad-text' }, e.error || ''));
        }))));
    }, function (err) { GR.message('error', 'Could not load the elements of map ' + m.step, err.message); });
  }

  // gridKeys moves the grid's focus (arrows by cell and row, Home, End)
  // and opens the focused cell on Enter or Space.
  function gridKeys(e, st, open) {
    var cell = e.target.closest('.cell');
    if (!cell) return;
    var cells = st.grid.children, i = Number(cell.dataset.index), n = cells.length;
    if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); open(cell); return; }
    var cols = 1;
    while (cols < n && cells[cols].offsetTop === cells[0].offsetTop) cols++;
    var to = { ArrowRight: i + 1, ArrowLeft: i - 1, ArrowDown: i + cols, ArrowUp: i - cols, Home: 0, End: n - 1 }[e.key];
    if (to === undefined) return;
    e.preventDefault();
    to = Math.max(0, Math.min(n - 1, to));
    cell.tabIndex = -1;
    cells[to].tabIndex = 0;
    cells[to].focus();
    st.focus = to;
  }

  function mapCard(m) {
    var st = maps[m.step];
    if (!st) {
      st = maps[m.step] = { picked: -1, polls: 0, key: '' };
      st.grid = h('div', { class: 'grid', role: 'group', 'aria-label': 'element grid of map ' + m.step + ': arrow keys move between cells, Enter opens a cell\u2019s elements', dataset: { step: m.step } });
      var open = function (cell) {
        if (!cell || !st.summary) return;
        st.picked = st.focus = Number(cell.dataset.index);
        pickCell(st.map, st, st.picked);
        renderGrid(st.map, st);
      };
      st.grid.addEventListener('click', function (e) { open(e.target.closest('.cell')); });
      st.grid.addEventListener('keydown', function (e) { gridKeys(e, st, open); });
      st.scale = h('span', { class: 'muted grid-scale' });
      st.elements = h('div', { class: 'elements-box' });
      st.head = h('div', { class: 'map-head' });
      st.bars = h('div', { class: 'map-bars' });
      st.box = h('div', { class: 'map', dataset: { step: m.step } }, st.head, st.bars,
        h('div', { class: 'grid-wrap' }, st.grid, h('div', { class: 'grid-foot' }, legend(), st.scale)), st.elements);
    }
    st.total = m.total;
    st.map = m;
    return st;
  }

  function legend() {
    return h('div', { class: 'legend' }, GR.cellStates.map(function (k) {
      return h('span', { class: 'legend-item' }, h('span', { class: 'cell-sw cs-' + k }), k.replace(/_/g, ' '));
    }));
  }

  function renderMapHead(m, st) {
    var head = GR.clear(st.head);
    head.appendChild(h('div', { class: 'map-title' },
      h('span', { class: 'mono strong' }, m.step),
      h('span', { class: 'mode mode-' + m.mode }, m.mode),
      h('span', { class: 'muted mono map-id', title: 'map id' }, m.map_id)));
    head.appendChild(h('div', { class: 'map-counts' },
      h('span', null, h('b', null, GR.fmtNum(m.settled)), ' / ' + GR.fmtNum(m.total) + ' settled (' + pct(m.settled, m.total) + ')'),
      h('span', null, GR.fmtNum(m.dispatched) + ' dispatched'),
      m.failed ? h('span', { class: 'bad-text' }, GR.fmtNum(m.failed) + ' failed') : null));
    var bars = GR.clear(st.bars);
    var inflight = Math.max(0, (m.dispatched || 0) - (m.settled || 0));
    bars.appendChild(h('div', { class: 'bar-label' }, 'forward'));
    bars.appendChild(bar('map', m.total, [
      { cls: 'seg-completed', n: (m.settled || 0) - (m.failed || 0), label: 'completed' },
      { cls: 'seg-failed', n: m.failed, label: 'failed' },
      { cls: 'seg-running', n: inflight, label: 'in flight' }
    ], { dataset: { settled: String(m.settled), total: String(m.total), failed: String(m.failed) } }));
    if (m.rollback) {
      var rb = m.rollback;
      bars.appendChild(h('div', { class: 'bar-label' }, 'rollback #' + rb.generation));
      bars.appendChild(rollbackBar(rb, 'map-rollback'));
      bars.appendChild(h('div', { class: 'bar-note' }, GR.fmtNum(rb.settled) + ' / ' + GR.fmtNum(rb.total) + ' undone (' + pct(rb.settled, rb.total) + ') · ' +
        GR.fmtNum(rb.outstanding) + ' outstanding' + (rb.failed ? ' · ' + GR.fmtNum(rb.failed) + ' failed' : '')));
    }
  }

  function refreshMap(m, st) {
    // Counters move whenever the grid does; refetch on a change, and every
    // fifth poll regardless, so a missed move is never stuck on screen.
    var key = JSON.stringify(m);
    st.polls++;
    if (st.summary && key === st.key && st.polls % 5 !== 0) return Promise.resolve();
    var path = '/api/runs/' + encodeURIComponent(runID) + '/maps/' + encodeURIComponent(m.step) + '/elements' + GR.query({ from: 0, limit: 1 });
    return GR.api(path).then(function (res) {
      st.key = key;
      st.summary = (res.data && res.data.summary) || null;
      if (res.data && res.data.total !== undefined) st.total = res.data.total;
      st.scale.classList.remove('bad-text');
      renderGrid(m, st);
      if (st.picked >= 0 && st.summary && st.picked < st.summary.cells.length) pickCell(m, st, st.picked); // keep the open cell live
    }, function (err) {
      // One map's picture failing must not stop the rest of the page.
      st.scale.textContent = 'element grid unavailable: ' + err.message;
      st.scale.classList.add('bad-text');
    });
  }

  function renderMaps(list) {
    show('maps-panel', list.length > 0);
    var box = $('maps');
    var want = {};
    var jobs = [];
    list.forEach(function (m) {
      want[m.step] = true;
      var st = mapCard(m);
      if (st.box.parentNode !== box) box.appendChild(st.box);
      renderMapHead(m, st);
      jobs.push(refreshMap(m, st));
    });
    Object.keys(maps).forEach(function (k) { if (!want[k]) { maps[k].box.remove(); delete maps[k]; } });
    return Promise.all(jobs);
  }

  // ---- side panels ---------------------------------------------------------
  function renderInputs(inputs, redacted) {
    var box = GR.clear($('inputs'));
    var keys = Object.keys(inputs || {});
    if (redacted) box.appendChild(redactedNote('inputs-redacted', 'This is a sensitive run: its input values are shown only with the dashboard token.'));
    if (!keys.length) { box.appendChild(h('p', { class: 'muted' }, 'No inputs.')); return; }
    box.appendChild(h('table', { class: 'table kv' }, h('tbody', null, keys.sort().map(function (k) {
      return h('tr', null, h('th', { class: 'mono' }, k), h('td', null, GR.valueEl(inputs[k])));
    }))));
  }

  function renderValue(r) {
    var has = r.value !== null && r.value !== undefined;
    show('value-panel', has);
    var box = GR.clear($('value'));
    if (has) box.appendChild(GR.valueEl(r.value));
  }

  function renderChildren(list) {
    show('children-panel', list.length > 0);
    var box = GR.clear($('children'));
    if (!list.length) return;
    box.appendChild(h('ul', { class: 'children' }, list.map(function (c) {
      return h('li', { class: 'child' },
        h('div', { class: 'child-top' }, h('span', { class: 'mono strong' }, c.step), GR.badge(c.status)),
        // A composed child lives inside this run's state (it has no page
        // of its own): its id is shown, not linked.
        c.run_id ? h('div', { class: 'child-run' }, h('span', { class: 'mono child-link', title: c.run_id }, c.run_id)) : null,
        c.reactor ? h('div', { class: 'muted small' }, c.reactor) : null,
        // A finished child: its undo entries, folded into this run.
        (c.entries || []).length ? h('ul', { class: 'child-entries' }, c.entries.map(function (e) {
          return h('li', { class: 'child-entry', dataset: { status: e.status } }, h('span', { class: 'mono' }, e.step), ' ',
            h('span', { class: 'rb-status rb-' + String(e.status).replace(/[^a-z_]/g, '') }, e.status));
        })) : null);
    })));
  }

  function renderRollbacks(list) {
    show('rollbacks-panel', list.length > 0);
    var box = GR.clear($('rollbacks'));
    if (!list.length) return;
    box.appendChild(h('ol', { class: 'audit' }, list.map(function (e) {
      return h('li', { class: 'audit-item' },
        h('div', { class: 'audit-top' }, h('span', { class: 'mono strong' }, e.step), ' ', h('span', { class: 'rb-status rb-' + String(e.status).replace(/[^a-z_]/g, '') }, e.status),
          h('span', { class: 'muted audit-at' }, GR.timeEl(e.at, 'clock'))),
        (e.kind || e.reason) ? h('div', { class: 'muted small' }, [e.kind, e.reason].filter(Boolean).join(' · ')) : null,
        e.message ? h('div', { class: 'bad-text small' }, e.message) : null);
    })));
  }

  // ---- rollback status and audit ---------------------------------------------
  function renderRollbackStatus(rep) {
    show('rbstatus-panel', !!rep);
    var box = GR.clear($('rbstatus'));
    if (!rep) return;
    var sum = rep.summary || {};
    $('rbstatus-text').textContent = rep.rollback_id + ' · generation ' + rep.generation;
    box.appendChild(h('div', { class: 'rb-summary' },
      h('span', { class: 'rb-status rb-outcome rb-' + String(sum.outcome).replace(/[^a-z_]/g, '') }, String(sum.outcome || '').replace(/_/g, ' ')),
      ' ', h('span', { class: 'muted small' }, (sum.compensated || 0) + ' compensated · ' + (sum.failed || 0) + ' failed · ' +
        (sum.outstanding || 0) + ' outstanding · ' + ((sum.kept || []).length) + ' kept (no undo registered)')));
    var entries = rep.entries || [];
    if (!entries.length) return;
    box.appendChild(h('div', { class: 'scroll-x' }, h('table', { class: 'table compact rb-entries' },
      h('thead', null, h('tr', null, ['#', 'step', 'status', 'action', 'attempts', 'resource', 'fingerprints', 'blocked by', 'finished', 'reason'].map(function (c) { return h('th', null, c); }))),
      h('tbody', null, entries.map(function (e) {
        return h('tr', { dataset: { entry: e.id || '', status: e.status } },
          h('td', { class: 'num' }, String(e.order)),
          h('td', { class: 'mono' }, e.step),
          h('td', null, h('span', { class: 'rb-status rb-' + String(e.status).replace(/[^a-z_]/g, '') }, e.status)),
          h('td', null, e.action || ''),
          h('td', { class: 'num' }, e.attempts ? String(e.attempts) : ''),
          h('td', { class: 'mono muted rb-resource', title: e.label || '' }, e.resource || ''),
          h('td', { class: 'fp-cell' }, fpLine('expected', e.expected, e.expected_value), fpLine('observed', e.observed, e.observed_value),
            fpLine('restore to', e.restore_to, e.restore_to_value)),
          h('td', { class: 'mono rb-blocked-by' }, e.blocked_by || ''),
          h('td', { class: 'muted' }, e.finished_at ? GR.timeEl(e.finished_at, 'clock') : ''),
          h('td', { class: 'rb-reason ' + (e.message ? 'bad-text small' : 'muted small'), title: e.message || '' }, [e.reason, e.message].filter(Boolean).join(': ')));
      })))));
  }

  // fpShort shortens a fingerprint ("sha256:91c37282…"); the full value is
  // the element's title.
  function fpShort(fp) {
    fp = String(fp || '');
    return fp.length > 19 ? fp.slice(0, 18) + '…' : fp;
  }

  // fpLine is one state of a guarded entry: its fingerprint, shortened,
  // and its value (fingerprint.Format's text) under it when the report has
  // it.
  function fpLine(label, fp, value) {
    if (!fp) return null;
    return h('div', null, h('span', { class: 'fp-k' }, label), h('span', { class: 'fp', title: fp, dataset: { fp: fp } }, fpShort(fp)),
      value ? h('pre', { class: 'fp-val' + (value === redactedValue ? ' redacted' : '') }, value) : null);
  }

  // redactedValue is what replaces a value of a sensitive run for a request
  // without the token (reactor.RedactedValue).
  var redactedValue = '(redacted: sensitive run)';

  // redactedNote says why values are hidden, with a button to set the token
  // (closing the dialog refreshes the page's data).
  function redactedNote(cls, text) {
    var wrong = !!GR.token();
    var b = h('button', { type: 'button', class: 'btn btn-link' }, wrong ? 'Change token' : 'Set token');
    b.addEventListener('click', function () { GR.askToken(wrong ? 'The token set in this tab was not accepted.' : ''); });
    return h('p', { class: 'muted small redacted-note ' + cls },
      text + (wrong ? ' The token set in this tab was not accepted.' : '') + ' ', b);
  }

  // stateRow is one state of an action item: the fingerprint, and the value
  // under it when known.
  function stateRow(label, cls, help, fp, value) {
    return h('tr', null, h('th', null, label), h('td', { title: help },
      h('div', { class: cls }, fp),
      value ? h('pre', { class: 'ai-value ' + cls + '-value' + (value === redactedValue ? ' redacted' : '') }, value) : null));
  }

  // ---- action required (guarded undo conflicts) ------------------------------
  // Each entry whose guarded undo conflicted is listed with its fingerprints
  // and a form: the person says what they did (manually reverted / left
  // applied) with a note, and the dashboard records it (POST
  // .../entries/{entry}/resolve). What was typed survives the live refresh.
  var drafts = {};   // entry id -> {kind, note}

  function renderActionRequired(rep) {
    var items = (rep && rep.action_required) || [];
    // Element conflicts past what the owner's failure lists are counted
    // in elements_held; the element runs are on the overview's list.
    var listed = items.filter(function (a) { return a.run && a.run !== rep.run_id; }).length;
    var unlisted = Math.max(((rep && rep.elements_held && rep.elements_held.waiting) || 0) - listed, 0);
    show('action-panel', items.length + unlisted > 0);
    var box = GR.clear($('action-required'));
    $('action-required-text').textContent = (rep && rep.action_required_text) || '';
    var want = {};
    items.forEach(function (a) { want[a.id] = true; });
    Object.keys(drafts).forEach(function (k) { if (!want[k]) delete drafts[k]; });
    if (!items.length && !unlisted) return;
    var n = items.length + unlisted;
    $('action-text').textContent = n + (n === 1 ? ' entry needs' : ' entries need') + ' a person';
    if (unlisted) box.appendChild(h('p', { class: 'muted small elements-unlisted' }, unlisted +
      ' more conflict(s) of this run\'s map elements are not listed here: the overview\'s "Needs a person" lists every element run that waits.'));
    if (rep.values_redacted) box.appendChild(redactedNote('values-redacted', 'This is a sensitive run: the values of these states are shown only with the dashboard token.'));
    items.forEach(function (a, i) { box.appendChild(actionItem(a, i)); });
  }

  function actionItem(a, i) {
    var d = drafts[a.id] || (drafts[a.id] = { kind: '', note: '' });
    var name = 'resolve-kind-' + i;
    function radio(kind, label, help) {
      var r = h('input', { type: 'radio', name: name, value: kind, class: 'resolve-kind', dataset: { kind: kind } });
      r.checked = d.kind === kind;
      r.addEventListener('change', function () { if (r.checked) { d.kind = kind; update(); } });
      return h('label', { title: help }, r, ' ' + label);
    }
    var note = h('textarea', { class: 'resolve-note', rows: '2', maxlength: '4000', required: true,
      placeholder: 'What did you do, or why does it stay? (required: it is kept on the run and audited)', 'aria-label': 'note for ' + a.id });
    note.value = d.note;
    var btn = h('button', { type: 'button', class: 'btn btn-primary resolve-button' }, 'Resolve');
    var hint = h('span', { class: 'muted small resolve-hint' });
    function update() {
      var empty = !note.value.trim();
      btn.disabled = empty || !d.kind;
      hint.textContent = empty ? 'write a note to resolve' : (!d.kind ? 'pick what you did' : '');
    }
    note.addEventListener('input', function () { d.note = note.value; update(); });
    btn.addEventListener('click', function () { resolveEntry(a, d); });
    update();
    var blocked = a.blocked || [];
    if (a.run && a.run !== runID) {
      // A map element's conflict, listed on its owner: the element's page
      // has the fingerprints; it can be resolved from here too.
      return h('div', { class: 'action-item', dataset: { entry: a.id } },
        h('div', { class: 'action-top' },
          h('span', { class: 'mono strong ai-id' }, a.id),
          h('span', { class: 'muted' }, 'of map element run'),
          GR.runLink(a.run, 'ai-run'),
          h('span', { class: 'muted small' }, '(' + a.step + ')')),
        h('p', { class: 'action-why bad-text ai-why' }, a.why),
        h('div', { class: 'action-form' },
          h('div', { class: 'action-kinds' },
            radio('manually_reverted', 'manually reverted', 'you put the resource back to the restore-to state'),
            radio('left_applied', 'left applied', 'the resource stays as it is, and so do the entries it blocks')),
          note,
          h('div', null, btn, ' ', hint)));
    }
    return h('div', { class: 'action-item', dataset: { entry: a.id } },
      h('div', { class: 'action-top' },
        h('span', { class: 'mono strong ai-id' }, a.id),
        h('span', { class: 'muted' }, 'on'),
        h('span', { class: 'mono ai-resource' }, a.resource),
        a.label ? h('span', { class: 'muted ai-label' }, '· ' + a.label) : null),
      h('p', { class: 'action-why bad-text ai-why' }, a.why),
      h('table', { class: 'table compact kv action-fps' }, h('tbody', null,
        stateRow('expected', 'ai-expected', 'the state the step left', a.expected, a.expected_value),
        stateRow('observed', 'ai-observed', 'what the rollback read instead', a.observed, a.observed_value),
        stateRow('restore to', 'ai-restore-to', 'the state before the step', a.restore_to, a.restore_to_value))),
      blocked.length ? h('div', { class: 'small ai-blocked' }, h('span', { class: 'muted' }, 'blocked by it, not attempted: '),
        h('span', { class: 'mono' }, blocked.join(', '))) : null,
      h('div', { class: 'action-form' },
        h('div', { class: 'action-kinds' },
          radio('manually_reverted', 'manually reverted', 'you put the resource back to the restore-to state'),
          radio('left_applied', 'left applied', 'the resource stays as it is, and so do the entries it blocks')),
        note,
        h('div', null, btn, ' ', hint)));
  }

  function resolveEntry(a, d) {
    var note = d.note.trim();
    if (!note || !d.kind) return;
    var what = d.kind === 'manually_reverted' ? 'manually reverted' : 'left applied';
    var text = d.kind === 'manually_reverted'
      ? 'Record that you put ' + a.resource + ' back to its restore-to state. The entries it blocked are undone by the next "Retry rollback".'
      : 'Record that ' + a.resource + ' stays as it is. The entries it blocked stay applied for good.';
    GR.confirm('Resolve ' + a.id + ' as ' + what + '?', text, ['note: ' + note], 'Resolve as ' + what).then(function (ok) {
      if (!ok) return null;
      var on = a.run || runID; // an owner lists its map elements' conflicts
      var path = '/api/runs/' + encodeURIComponent(on) + '/entries/' + encodeURIComponent(a.id) + '/resolve';
      return GR.post(path, { kind: d.kind, note: d.note }).then(function (res) {
        delete drafts[a.id];
        GR.message('ok', a.id + ' of run ' + runID + ' resolved as ' + what,
          d.kind === 'manually_reverted' && (a.blocked || []).length ? 'Retry the rollback to undo the entries it blocked.' : '');
        if (res.data && changed('rbstatus', res.data)) { renderRollbackStatus(res.data); renderActionRequired(res.data); }
        return res;
      }, function (err) {
        GR.message('error', 'Resolution of ' + a.id + ' of run ' + runID + (err.status ? ' refused (' + err.status + ')' : ' not sent'), err.message);
        return null;
      });
    }).then(function (r) { GR.poller.nudge(); return r; });
  }

  function copyActionText() {
    var pre = $('action-required-text');
    var text = pre.textContent;
    var done = function () { GR.message('ok', 'Copied', 'The action-required text is on the clipboard.'); };
    var select = function () {
      var range = document.createRange();
      range.selectNodeContents(pre);
      var sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      GR.message('ok', 'Text selected', 'The clipboard is not available here; copy the selection.');
    };
    if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(text).then(done, select);
    else select();
  }

  function renderAudit(entries) {
    show('audit-panel', entries.length > 0);
    var box = GR.clear($('audit'));
    if (!entries.length) return;
    $('audit-text').textContent = entries.length + ' entries · trace ' + (entries[0].trace_id || '');
    box.appendChild(h('ol', { class: 'audit audit-trail' }, entries.map(function (a) {
      var bits = [a.step, a.status, a.action, a.generation ? 'gen ' + a.generation : '', a.reason].filter(Boolean);
      return h('li', { class: 'audit-item' },
        h('div', { class: 'audit-top' }, h('span', { class: 'mono strong' }, String(a.kind).replace(/_/g, ' ')), ' ',
          h('span', { class: 'muted small' }, bits.join(' · ')),
          h('span', { class: 'muted audit-at' }, GR.timeEl(a.at, 'clock'))),
        a.message_sha256 ? h('div', { class: 'muted small mono', title: 'the message is kept on the run; the audit holds its hash' }, a.message_sha256.slice(0, 23) + '…') : null,
        a.kind === 'operator_request' ? h('div', { class: 'audit-request' },
          h('span', { class: 'strong' }, (a.request || '').replace(/_/g, ' ')), ' by ',
          h('span', { class: 'audit-operator strong' }, a.operator || 'a token holder'),
          a.step ? [' (', h('span', { class: 'mono' }, a.step), ')'] : null,
          ': ', h('q', { class: 'audit-reason' }, a.note || '')) : null);
    })));
  }

  // The rollback status and the audit trail, for a run that rolled back.
  function refreshRollback(r) {
    var base = '/api/runs/' + encodeURIComponent(runID);
    // The audit holds the operators' requests too, on any run.
    var audit = GR.api(base + '/audit').then(function (res) {
      var list = (res.data && res.data.entries) || [];
      if (changed('audit', list)) renderAudit(list);
    }, function () { renderAudit([]); });
    if (!(r.rollbacks || []).length && r.status !== 'rolling_back') {
      renderRollbackStatus(null);
      renderActionRequired(null);
      return audit;
    }
    return Promise.all([
      audit,
      GR.api(base + '/rollback-status').then(function (res) {
        if (changed('rbstatus', res.data)) { renderRollbackStatus(res.data); renderActionRequired(res.data); }
      }, function () {
        // One failed poll keeps what is shown (and any half-typed note);
        // the next good answer renders again.
        delete last.rbstatus;
      })
    ]);
  }

  // ---- interrupt -----------------------------------------------------------
  // The payload textarea keeps what the operator typed across polls: it is
  // filled with the example only while untouched.
  var payloadTouched = false;
  var intr = null;

  function renderInterrupt(v, act) {
    intr = v;
    show('interrupt-panel', !!v);
    if (!v) return;
    $('interrupt-text').textContent = v.received + ' of ' + v.accepts + ' payload' + (v.accepts === 1 ? '' : 's') + ' received';
    var dl = GR.clear($('interrupt-facts'));
    fact(dl, 'step', h('span', { class: 'mono' }, v.step));
    fact(dl, 'correlation', v.correlation ? h('span', { class: 'mono' }, v.correlation) : '');
    fact(dl, 'since', h('span', null, GR.timeEl(v.since), ' ', h('span', { class: 'muted' }, '(' + GR.fmtDur(v.paused_ms) + ')')));
    fact(dl, 'deadline', GR.deadlineEl(v)); // paused.js
    fact(dl, 'expects', GR.expectedEl(v));
    fact(dl, 'last refusal', v.refused ? h('span', { class: 'bad-text', title: v.refused_at }, v.refused, ' ', h('span', { class: 'muted small' }, GR.fmtAgo(v.refused_at))) : '');
    var box = GR.clear($('interrupt-payloads'));
    var ps = v.payloads || [];
    if (ps.length) {
      box.appendChild(h('table', { class: 'table compact interrupt-received' },
        h('thead', null, h('tr', null, ['#', 'received', 'by', 'payload'].map(function (c) { return h('th', null, c); }))),
        h('tbody', null, ps.map(function (p, i) {
          return h('tr', { class: 'received-payload' }, h('td', null, String(i + 1)), h('td', null, GR.timeEl(p.at, 'clock')),
            h('td', { class: 'mono' }, p.by || h('span', { class: 'muted' }, '—')), h('td', null, GR.valueEl(p.payload)));
        }))));
      if (v.payloads_redacted) box.appendChild(redactedNote('payloads-redacted', 'The payloads of a sensitive run show only with the token.'));
    }
    $('continue-step').value = v.step;
    var ta = $('continue-payload');
    if (!payloadTouched) ta.value = exampleText(v);
    var ok = !!(act && act.allowed);
    $('continue-button').disabled = !ok;
    $('continue-why').textContent = ok ? '' : ((act && act.reason) || '');
  }

  function exampleText(v) {
    return v.example === null || v.example === undefined ? '{}' : GR.jsonText(v.example, '');
  }

  function submitContinue(e) {
    e.preventDefault();
    if (!intr) return;
    var step = intr.step, payload;
    try {
      payload = JSON.parse($('continue-payload').value);
    } catch (err) {
      GR.message('error', 'The payload is not JSON; nothing was sent', err.message);
      return;
    }
    var reason = $('continue-reason').value.trim();
    if (!reason) {
      GR.message('error', 'A reason is required; nothing was sent', 'Say why you continue the run: it is kept in the run\'s audit with your name.');
      return;
    }
    GR.confirm('Continue run ' + runID + '?', 'Send this payload to step ' + step + ' of run ' + runID + '. It is taken once: a second payload is refused.',
      [JSON.stringify(payload).slice(0, 200), 'reason: ' + reason], 'Continue run').then(function (yes) {
      if (!yes) return null;
      return GR.post('/api/runs/' + encodeURIComponent(runID) + '/continue', { step: step, payload: payload, reason: reason }).then(function (res) {
        var d = res.data || {};
        payloadTouched = false;
        $('continue-reason').value = '';
        if (d.warning) GR.message('warn', 'Payload recorded for run ' + runID + ', but nothing carries the run on yet', d.warning);
        else GR.message('ok', 'Payload recorded for run ' + runID, d.received + ' of ' + d.accepts + ' received' +
          (d.woken ? '; a worker carries the run on.' : d.received < d.accepts ? '; it waits for more.' : '.') +
          (d.checked ? '' : ' The worker checks the payload; a refusal shows here.'));
        return res;
      }, function (err) {
        GR.message('error', 'Continue of run ' + runID + (err.status ? ' refused (' + err.status + ')' : ' not sent'), err.message);
        return null;
      });
    }).then(function (r) { GR.poller.nudge(); return r; });
  }

  // ---- refresh -------------------------------------------------------------
  // renderActions offers the actions the engine would accept on the run
  // now; the others stay disabled, their reason on hover and read out by
  // screen readers.
  function renderActions(acts) {
    Array.prototype.forEach.call(document.querySelectorAll('.run-actions [data-action]'), function (b) {
      var a = acts[b.dataset.action];
      var ok = !!(a && a.allowed);
      b.disabled = !ok;
      b.title = ok ? GR.actions[b.dataset.action].one(runID) : ((a && a.reason) || 'not offered for this run');
      b.setAttribute('aria-description', ok ? '' : b.title);
      b.dataset.allowed = ok ? 'true' : 'false';
    });
  }

  function refresh() {
    return GR.api('/api/runs/' + encodeURIComponent(runID)).then(function (res) {
      var r = res.data;
      show('run-missing', false);
      $('run').classList.remove('gone');
      var running = (r.steps || []).some(function (s) { return s.status === 'running' || s.status === 'paused'; });
      if (changed('head', [r.id, r.status, r.reactor, r.created_at, r.updated_at, r.elapsed_ms, r.queue, r.queue_default, r.element, r.trace_id, r.reason, r.waiting, (r.definition || {}).fingerprint, r.retry_of, r.retried_by, r.spawned_by, r.spawned, Math.floor(Date.now() / 10000)])) renderHead(r);
      if (changed('actions', r.actions)) renderActions(r.actions || {});
      if (changed('stall', r.stall)) GR.renderStall(r.stall); // stalls.js
      if (changed('interrupt', [r.interrupt, (r.actions || {}).continue, Math.floor(Date.now() / 10000)])) renderInterrupt(r.interrupt, (r.actions || {}).continue);
      if (changed('failure', r.failure)) renderFailure(r.failure);
      if (changed('rollback', r.rollback)) renderRollback(r.rollback);
      if (changed('steps', r.steps) || running) renderTimeline(r);
      if (changed('inputs', [r.inputs, r.inputs_redacted])) renderInputs(r.inputs, r.inputs_redacted);
      if (changed('value', r.value)) renderValue(r);
      if (changed('children', r.children)) renderChildren(r.children || []);
      if (changed('rollbacks', r.rollbacks)) renderRollbacks(r.rollbacks || []);
      // A map element's steps are undone with its map, from the owner.
      if (changed('ledger', [r.status, r.ledger, !!r.element])) renderUndoSteps(r.status, r.element ? [] : (r.ledger || []));
      $('run').dataset.status = r.status;
      // A finished run changes rarely: poll it slower.
      GR.poller.setInterval(GR.terminal[r.status] ? 5000 : 2000);
      return Promise.all([renderMaps(r.maps || []), refreshRollback(r)]);
    }, function (err) {
      if (err.status === 404) {
        var p = $('run-missing');
        p.textContent = err.message || ('No run ' + runID + '.');
        p.hidden = false;
        $('run').classList.add('gone');
        return;
      }
      throw err;
    });
  }

  document.addEventListener('DOMContentLoaded', function () {
    runID = $('run').dataset.runId;
    Array.prototype.forEach.call(document.querySelectorAll('[data-action]'), function (b) {
      b.title = GR.actions[b.dataset.action].one(runID);
      // Disabled until the run's first read says which ones the engine
      // would accept.
      if (b.closest('.run-actions')) b.disabled = true;
      b.addEventListener('click', function () { GR.runAction(runID, b.dataset.action); });
    });
    $('undo-steps-button').addEventListener('click', undoSelected);
    $('continue-form').addEventListener('submit', submitContinue);
    $('continue-payload').addEventListener('input', function () { payloadTouched = true; });
    $('continue-example').addEventListener('click', function () { payloadTouched = false; if (intr) $('continue-payload').value = exampleText(intr); });
    $('action-copy').addEventListener('click', copyActionText);
    GR.poller.start(refresh);
  });
})();
