// goreactor dashboard: the overview (counts, queues, the run list).
(function () {
  'use strict';
  if (document.body.dataset.page !== 'overview') return;
  var GR = window.GR, h = GR.h, $ = GR.$;
  var pageSize = 50;

  var filters = { status: '', reactor: '', q: '', failure: '', from: '', to: '', sort: '' };
  var filterNames = Object.keys(filters);
  // matchingAll, when set, is "every run the filter matches" as counted:
  // {count, filter (the server's, its range ended at the count)}.
  var matchingAll = null;
  var matchCount = null; // the count offered for the current page selection
  var matchGen = 0;
  var runs = [];          // rows shown, newest first
  var nextCursor = '';    // cursor after the last loaded page
  var partial = false;    // the last page stopped at the server's scan budget
  var pagesLoaded = 0;
  var selected = {};      // run id -> true
  var generation = 0;     // bumped when the filters change, drops stale answers
  var lastStats = '';

  function readURL() {
    var p = new URLSearchParams(location.search);
    filterNames.forEach(function (k) { filters[k] = p.get(k) || ''; });
  }

  function writeURL() {
    var q = GR.query(filters);
    history.replaceState(null, '', location.pathname + q);
  }

  function syncInputs() {
    $('filter-status').value = filters.status;
    if ($('filter-reactor').value !== filters.reactor) $('filter-reactor').value = filters.reactor;
    if ($('filter-q').value !== filters.q) $('filter-q').value = filters.q;
    if ($('filter-failure').value !== filters.failure) $('filter-failure').value = filters.failure;
    $('filter-from').value = GR.toInput(filters.from);
    $('filter-to').value = GR.toInput(filters.to);
    // Without a status the only order is by creation (no index orders
    // every run by its last update: docs/dashboard-api.md).
    var sort = $('filter-sort');
    sort.querySelector('option[value="entered"]').disabled = !filters.status;
    sort.value = filters.sort || (filters.status ? 'entered' : 'created');
    Array.prototype.forEach.call(document.querySelectorAll('.zone-name'), function (z) { z.textContent = '(' + GR.zoneName(new Date()) + ')'; });
    $('only-failed').classList.toggle('active', filters.status === 'failed');
  }

  function setFilters(patch) {
    Object.keys(patch).forEach(function (k) { filters[k] = patch[k]; });
    if (!filters.status && filters.sort === 'entered') filters.sort = '';
    selected = {}; // never act on runs the new filter hides
    matchingAll = null;
    matchCount = null;
    syncInputs();
    writeURL();
    renderTiles();
    renderReactors();
    reload();
  }

  function listPath(cursor) {
    return '/api/runs' + GR.query(Object.assign({}, filters, { limit: pageSize, cursor: cursor }));
  }

  // reload starts the list again from its first page (filters changed).
  function reload() {
    generation++;
    runs = [];
    nextCursor = '';
    pagesLoaded = 0;
    $('runs').dataset.loading = 'true';
    return refreshList();
  }

  // refreshList fetches the first page and merges it in: rows of the fresh
  // page replace what was shown down to the page's oldest row; the older
  // rows that "load more" brought in stay.
  function refreshList() {
    var gen = generation;
    return GR.api(listPath('')).then(function (res) {
      if (gen !== generation) return;
      var fresh = (res.data && res.data.runs) || [];
      if (pagesLoaded <= 1) {
        runs = fresh;
        nextCursor = res.data.next_cursor || '';
        partial = !!res.data.partial;
        pagesLoaded = 1;
      } else {
        var seen = {};
        fresh.forEach(function (r) { seen[r.id] = true; });
        // The rows shown after the fresh page's last row, in the list's
        // own order (by creation, by entry into a status, or by id: only
        // the index knows, so positions decide, never a timestamp).
        var lastID = fresh.length ? fresh[fresh.length - 1].id : '';
        var at = -1;
        runs.forEach(function (r, i) { if (r.id === lastID) at = i; });
        var tail = (at >= 0 ? runs.slice(at + 1) : runs).filter(function (r) { return !seen[r.id]; });
        runs = fresh.concat(tail);
      }
      $('runs').dataset.loading = 'false';
      renderRuns();
    }, function (err) {
      if (gen === generation && !runs.length) {
        var empty = $('runs-empty');
        empty.textContent = 'Could not load the runs: ' + err.message;
        empty.hidden = false;
      }
      throw err;
    });
  }

  function loadMore() {
    if (!nextCursor) return;
    var gen = generation;
    var btn = $('load-more');
    btn.disabled = true;
    GR.api(listPath(nextCursor)).then(function (res) {
      if (gen !== generation) return;
      var have = {};
      runs.forEach(function (r) { have[r.id] = true; });
      ((res.data && res.data.runs) || []).forEach(function (r) { if (!have[r.id]) runs.push(r); });
      nextCursor = res.data.next_cursor || '';
      partial = !!res.data.partial;
      pagesLoaded++;
      renderRuns();
    }, function (err) {
      GR.message('error', 'Could not load more runs', err.message);
    }).then(function () { btn.disabled = false; });
  }

  // ---- stats ---------------------------------------------------------------
  var stats = null;

  function refreshStats() {
    return GR.api('/api/stats').then(function (res) {
      stats = res.data || {};
      var key = JSON.stringify(stats);
      if (key === lastStats) return;
      lastStats = key;
      renderWarnings();
      renderTiles();
      renderQueues();
      renderReactors();
    });
  }

  function renderTiles() {
    if (!stats) return;
    var by = stats.by_status || {};
    var total = 0;
    Object.keys(by).forEach(function (k) { total += by[k] || 0; });
    var box = GR.clear($('status-tiles'));
    function tile(status, label, n) {
      var active = filters.status === status;
      var t = h('button', {
        type: 'button', class: 'tile' + (status ? ' tile-' + status : ' tile-all') + (active ? ' active' : '') + (n ? '' : ' zero'),
        dataset: { status: status }, 'aria-pressed': active ? 'true' : 'false',
        title: status ? 'Show ' + label + ' runs' : 'Show every run'
      }, h('span', { class: 'tile-n' }, GR.fmtNum(n)), h('span', { class: 'tile-label' }, label));
      t.addEventListener('click', function () { setFilters({ status: active && status ? '' : status }); });
      box.appendChild(t);
    }
    tile('', 'all', total);
    GR.statuses.forEach(function (s) { tile(s, s.replace(/_/g, ' '), by[s] || 0); });
    $('total-runs').textContent = GR.fmtNum(total) + ' stored runs';
  }

  // renderWarnings lists what an operator must act on (a configured queue
  // no worker serves), or hides the panel.
  function renderWarnings() {
    var ws = (stats && stats.warnings) || [];
    var list = GR.clear($('warnings'));
    ws.forEach(function (w) { list.appendChild(h('li', null, w)); });
    $('warnings-panel').hidden = !ws.length;
  }

  function renderQueues() {
    var tb = GR.clear($('queues'));
    var qs = (stats && stats.queues) || [];
    if (!qs.length) {
      tb.appendChild(h('tr', null, h('td', { colspan: '8', class: 'muted' }, 'no goreactor queues yet')));
      return;
    }
    qs.forEach(function (q) {
      var age = q.oldest_pending_age_ms;
      tb.appendChild(h('tr', { dataset: { queue: q.queue, served: q.served ? 'true' : 'false' } },
        h('td', { class: 'mono' }, q.queue),
        h('td', { class: q.served ? '' : 'bad' }, q.served ? 'serving' : 'none'),
        h('td', { class: 'num' + (q.pending ? ' strong' : '') }, GR.fmtNum(q.pending)),
        h('td', { class: 'num' }, GR.fmtNum(q.active)),
        h('td', { class: 'num' }, GR.fmtNum(q.scheduled)),
        h('td', { class: 'num' + (q.retry ? ' warn' : '') }, GR.fmtNum(q.retry)),
        h('td', { class: 'num' + (q.archived ? ' bad' : '') }, GR.fmtNum(q.archived)),
        h('td', { class: 'num' }, age ? GR.fmtDur(age) : '—')));
    });
  }

  function renderReactors() {
    var by = (stats && stats.by_reactor) || {};
    var names = Object.keys(by).sort();
    var dl = GR.clear($('reactor-names'));
    names.forEach(function (name) { dl.appendChild(h('option', { value: name })); });
    var tb = GR.clear($('reactors'));
    if (!names.length) {
      tb.appendChild(h('tr', null, h('td', { colspan: '5', class: 'muted' }, 'no runs yet')));
      return;
    }
    names.forEach(function (name) {
      var c = by[name] || {}, total = 0;
      Object.keys(c).forEach(function (k) { total += c[k] || 0; });
      var active = (c.pending || 0) + (c.running || 0) + (c.paused || 0);
      var pick = function (status) {
        return function (e) { e.preventDefault(); setFilters({ reactor: name, status: status }); };
      };
      var cell = function (n, status, cls) {
        if (!n) return h('td', { class: 'num zero' }, '0');
        return h('td', { class: 'num' }, h('a', { href: GR.base + '/' + GR.query({ reactor: name, status: status }), class: cls || '', onclick: pick(status), title: 'Show ' + (status ? status.replace(/_/g, ' ') + ' ' : '') + 'runs of ' + name }, GR.fmtNum(n)));
      };
      tb.appendChild(h('tr', { class: filters.reactor === name ? 'active' : '', dataset: { reactor: name } },
        h('td', { class: 'reactor-name' }, h('a', { href: GR.base + '/' + GR.query({ reactor: name }), onclick: pick(''), title: 'Show the runs of ' + name }, name)),
        cell(total, ''),
        h('td', { class: 'num' + (active ? '' : ' zero') }, GR.fmtNum(active)),
        cell(c.rolling_back, 'rolling_back', 'warn'),
        cell(c.failed, 'failed', 'bad')));
    });
  }

  // ---- run list ------------------------------------------------------------
  function selectedIds() { return Object.keys(selected).filter(function (k) { return selected[k]; }); }

  function renderBatch() {
    var ids = selectedIds();
    $('batch-bar').hidden = ids.length === 0 && !matchingAll;
    $('batch-count').textContent = matchingAll ? 'All ' + GR.fmtNum(matchingAll.count) + ' matching runs selected' :
      ids.length + (ids.length === 1 ? ' run selected' : ' runs selected');
    var all = $('select-all');
    var shown = runs.length && runs.every(function (r) { return selected[r.id]; });
    all.checked = !!shown;
    all.indeterminate = !shown && runs.some(function (r) { return selected[r.id]; });
    renderMatching(!!shown);
  }

  // renderMatching offers "select all N matching" while every row shown is
  // selected and the list goes on: N is what GET /api/matching counts.
  function renderMatching(pageSelected) {
    var box = GR.clear($('select-matching'));
    if (matchingAll) {
      box.hidden = false;
      box.dataset.state = 'all';
      box.appendChild(h('span', null, 'every run matching this filter, as counted at ' + GR.fmtShort(matchingAll.filter.to) + ' ' + GR.zoneName(new Date(matchingAll.filter.to))));
      return;
    }
    if (!pageSelected || !nextCursor) { box.hidden = true; matchCount = null; return; }
    box.hidden = false;
    if (!matchCount || matchCount.pending) {
      // One count per selection: a refresh while it runs does not start
      // another.
      box.dataset.state = 'counting';
      box.appendChild(h('span', { class: 'muted' }, 'counting the runs that match…'));
      if (!matchCount) countMatching();
      return;
    }
    if (matchCount.error) {
      box.dataset.state = 'error';
      box.appendChild(h('span', { class: 'bad-text' }, 'could not count the matching runs: ' + matchCount.error));
      return;
    }
    if (!matchCount.complete) {
      box.dataset.state = 'over';
      box.appendChild(h('span', { class: 'muted' }, 'Only the ' + runs.length + ' shown can be selected: ' + matchCount.reason));
      return;
    }
    box.dataset.state = 'offer';
    box.appendChild(h('button', { type: 'button', class: 'btn btn-link', id: 'select-matching-button', onclick: function () {
      matchingAll = { count: matchCount.count, filter: matchCount.filter };
      renderBatch();
    } }, 'Select all ' + GR.fmtNum(matchCount.count) + ' matching'));
  }

  function countMatching() {
    var gen = ++matchGen, fgen = generation;
    matchCount = { pending: true };
    GR.api('/api/matching' + GR.query(filters)).then(function (res) {
      if (gen !== matchGen || fgen !== generation) return;
      matchCount = res.data || {};
      renderBatch();
    }, function (err) {
      if (gen !== matchGen || fgen !== generation) return;
      matchCount = { error: err.message };
      renderBatch();
    });
  }

  // describeFilter is the filter as lines for a confirmation.
  function describeFilter(f) {
    var lines = [];
    if (f.status) lines.push('status ' + f.status);
    if (f.reactor) lines.push('reactor ' + f.reactor);
    if (f.q) lines.push('id starting with ' + f.q);
    if (f.failure) lines.push('failure containing \u201c' + f.failure + '\u201d');
    var by = f.sort === 'entered' ? 'entered its status' : 'created';
    if (f.from) lines.push(by + ' from ' + GR.fmtTime(f.from) + ' ' + GR.zoneName(new Date(f.from)));
    if (f.to) lines.push(by + ' up to ' + GR.fmtTime(f.to) + ' ' + GR.zoneName(new Date(f.to)));
    return lines;
  }

  function renderRuns() {
    // A run that left the list (another filter, a new status) is no longer
    // selected: an action only ever applies to rows the user can see.
    var shown = {};
    runs.forEach(function (r) { shown[r.id] = true; });
    Object.keys(selected).forEach(function (id) { if (!shown[id]) delete selected[id]; });
    var tb = GR.clear($('runs'));
    runs.forEach(function (r) {
      var box = h('input', { type: 'checkbox', class: 'row-check', title: 'Select ' + r.id });
      box.checked = !!selected[r.id];
      box.addEventListener('change', function () { selected[r.id] = box.checked; if (!box.checked) { delete selected[r.id]; matchingAll = null; } renderBatch(); });
      var f = r.failure;
      tb.appendChild(h('tr', { class: 'row st-row-' + r.status, dataset: { id: r.id, status: r.status } },
        h('td', { class: 'check' }, box),
        h('td', { class: 'id-cell' }, GR.runLink(r.id, 'run-link')),
        h('td', { class: 'reactor-cell', title: r.reactor }, r.reactor),
        h('td', null, GR.badge(r.status)),
        h('td', { class: 'time-cell' }, GR.timeEl(r.created_at, 'short')),
        h('td', { class: 'time-cell' }, GR.timeEl(r.updated_at, 'ago')),
        h('td', { class: 'num' }, GR.fmtDur(r.elapsed_ms)),
        h('td', { class: 'failure-cell', title: f ? f.step + ': ' + f.message : '' },
          f ? [h('span', { class: 'fail-step' }, f.step), ' ', h('span', { class: 'fail-msg' }, f.message)] : '')));
    });
    var filtered = filterNames.some(function (k) { return k !== 'sort' && filters[k]; });
    $('runs-empty').textContent = !filtered ? 'No runs yet: runs appear here once an engine starts one (see the README\u2019s first command).' :
      nextCursor ? 'No match among the runs searched so far: \u201cSearch further\u201d reads on.' :
      'No runs match these filters.';
    $('runs-empty').hidden = runs.length !== 0;
    $('load-more').textContent = runs.length || !nextCursor ? 'Load more' : 'Search further';
    $('load-more').hidden = !nextCursor;
    $('runs-shown').textContent = (runs.length ? runs.length + ' shown' + (nextCursor ? ', more below' : '') : '') +
      (partial ? (runs.length ? '; ' : '') + 'the last request stopped at its scan limit: “' + $('load-more').textContent + '” searches on' : '');
    renderBatch();
  }

  // ---- needs a person -------------------------------------------------------
  // Runs (root or map element runs) whose guarded undo conflicted and that
  // no person resolved yet: each links to its run page, which says what to do.
  var needsLimit = 20;
  var lastNeeds = '';

  function refreshNeeds() {
    return GR.api('/api/needs-human' + GR.query({ limit: needsLimit })).then(function (res) {
      var page = res.data || {};
      var key = JSON.stringify(page);
      if (key === lastNeeds) return;
      lastNeeds = key;
      renderNeeds(page.runs || [], !!page.more);
    }, function (err) {
      lastNeeds = ''; // the next good answer renders again
      // Unknown, not zero: a count nobody could read must not read as
      // "nothing waits".
      $('needs-count').textContent = '?';
      $('needs-tile').classList.remove('zero');
      $('needs-tile').classList.add('unknown');
      $('needs-panel').dataset.count = 'unknown';
      $('needs-text').textContent = 'could not load: ' + err.message;
      throw err;
    });
  }

  function renderNeeds(list, more) {
    var n = list.length;
    $('needs-tile').classList.remove('unknown');
    $('needs-count').textContent = n + (more ? '+' : '');
    $('needs-tile').classList.toggle('zero', n === 0);
    $('needs-panel').dataset.count = String(n);
    $('needs-text').textContent = n ? 'conflicted undos nobody resolved yet, newest first' : '';
    var ul = GR.clear($('needs-list'));
    if (!n && !more) { ul.appendChild(h('li', { class: 'muted needs-none' }, 'Nothing is waiting for a person.')); return; }
    list.forEach(function (r) {
      var items = r.action_required || [];
      ul.appendChild(h('li', { class: 'needs-run', dataset: { id: r.id } },
        GR.runLink(r.id, 'needs-link'),
        h('span', { class: 'muted' }, r.reactor),
        GR.badge(r.status),
        r.element ? h('span', { class: 'muted small' }, 'element ' + r.element.index + ' of ' + r.element.owner) : null,
        h('span', { class: 'needs-entries' }, items.map(function (a) {
          return h('span', { class: 'needs-entry mono', title: a.why },
            a.id + (a.resource ? ' on ' + a.resource : (a.run && a.run !== r.id ? ' of ' + a.run : '')) + ' ');
        }))));
    });
    if (more) ul.appendChild(h('li', { class: 'muted small' }, 'more are waiting: the newest ' + needsLimit + ' are shown'));
  }

  function refresh() { return Promise.all([refreshStats(), refreshList(), refreshNeeds(), GR.refreshStalls()]); } // stalls.js

  document.addEventListener('DOMContentLoaded', function () {
    readURL();
    var sel = $('filter-status');
    GR.statuses.forEach(function (s) { sel.appendChild(h('option', { value: s }, s.replace(/_/g, ' '))); });
    syncInputs();

    sel.addEventListener('change', function () { setFilters({ status: sel.value }); });
    var typing = null;
    function typed() {
      clearTimeout(typing);
      typing = setTimeout(function () {
        setFilters({ reactor: $('filter-reactor').value.trim(), q: $('filter-q').value.trim(), failure: $('filter-failure').value.trim() });
      }, 250);
    }
    $('filter-reactor').addEventListener('input', typed);
    $('filter-q').addEventListener('input', typed);
    $('filter-failure').addEventListener('input', typed);
    $('filter-from').addEventListener('change', function () { setFilters({ from: GR.fromInput($('filter-from').value) }); });
    $('filter-to').addEventListener('change', function () { setFilters({ to: GR.fromInput($('filter-to').value) }); });
    $('filter-sort').addEventListener('change', function () {
      var v = $('filter-sort').value;
      setFilters({ sort: v === (filters.status ? 'entered' : 'created') ? '' : v });
    });
    // The range inputs read in the shown zone: show it, and the range in it.
    document.addEventListener('gr:zone', function () { syncInputs(); renderBatch(); });
    $('filters').addEventListener('submit', function (e) { e.preventDefault(); typed(); });
    $('only-failed').addEventListener('click', function () { setFilters({ status: filters.status === 'failed' ? '' : 'failed' }); });
    $('clear-filters').addEventListener('click', function () { setFilters({ status: '', reactor: '', q: '', failure: '', from: '', to: '', sort: '' }); });
    $('load-more').addEventListener('click', loadMore);
    $('select-all').addEventListener('change', function (e) {
      runs.forEach(function (r) { if (e.target.checked) selected[r.id] = true; else delete selected[r.id]; });
      if (!e.target.checked) matchingAll = null;
      matchCount = null; // count again for this selection
      renderRuns();
    });
    $('batch-clear').addEventListener('click', function () { selected = {}; matchingAll = null; matchCount = null; renderRuns(); });
    Array.prototype.forEach.call(document.querySelectorAll('[data-batch]'), function (b) {
      b.addEventListener('click', function () {
        if (matchingAll) {
          var m = matchingAll;
          GR.runMatching(m.filter, m.count, b.dataset.batch, describeFilter(m.filter)).then(function (results) {
            if (!results) return;
            // Done, or refused because the count changed: either way the
            // confirmed count is spent; with the page still selected the
            // offer counts again.
            matchingAll = null; matchCount = null;
            if (!results.conflict) selected = {};
            renderRuns();
          });
          return;
        }
        var ids = selectedIds();
        if (!ids.length) return;
        GR.runBatch(ids, b.dataset.batch).then(function (results) {
          if (!results) return;
          results.forEach(function (r) { if (r.status_code >= 200 && r.status_code < 300) delete selected[r.run_id]; });
          renderRuns();
        });
      });
    });

    pagesLoaded = 0;
    GR.poller.start(refresh);
  });
})();
