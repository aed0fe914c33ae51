// goreactor dashboard: shared helpers (DOM building, API calls, polling,
// dialogs, actions). Every piece of run data reaches the page through
// textContent or DOM properties, never an HTML parser, so markup in a reactor
// name, an input or an error shows as text.
(function () {
  'use strict';

  var GR = (window.GR = {});
  var body = document.body;
  GR.base = (body && body.dataset.base) || '';

  // Run statuses in lifecycle order (reactor.Statuses).
  GR.statuses = ['pending', 'running', 'paused', 'rolling_back', 'completed', 'failed', 'halted', 'cancelled', 'aborted'];
  // Element and step states of a map's grid.
  GR.cellStates = ['pending', 'running', 'completed', 'failed', 'undone', 'undo_failed', 'unavailable'];
  GR.terminal = { completed: true, failed: true, halted: true, cancelled: true, aborted: true };

  // h builds an element: h('a', {href: u, class: 'x'}, 'text', child...).
  // Strings become text nodes; attributes are set as properties or with
  // setAttribute, never parsed as HTML.
  GR.h = function (tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === undefined || v === null || v === false) return;
        if (k === 'class') el.className = v;
        else if (k === 'text') el.textContent = v;
        else if (k === 'dataset') Object.keys(v).forEach(function (d) { el.dataset[d] = v[d]; });
        else if (k.slice(0, 2) === 'on') el.addEventListener(k.slice(2), v);
        else if (v === true) el.setAttribute(k, '');
        else el.setAttribute(k, String(v));
      });
    }
    for (var i = 2; i < arguments.length; i++) GR.append(el, arguments[i]);
    return el;
  };

  GR.append = function (el, c) {
    if (c === undefined || c === null || c === false) return;
    if (Array.isArray(c)) { c.forEach(function (x) { GR.append(el, x); }); return; }
    el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  };

  GR.clear = function (el) { while (el.firstChild) el.removeChild(el.firstChild); return el; };
  GR.$ = function (id) { return document.getElementById(id); };

  GR.runURL = function (id) { return GR.base + '/runs/' + encodeURIComponent(id); };
  GR.runLink = function (id, cls) {
    return GR.h('a', { href: GR.runURL(id), class: 'mono ' + (cls || ''), title: id }, id);
  };

  GR.badge = function (status, extra) {
    var s = String(status || 'unknown');
    return GR.h('span', { class: 'badge st-' + s.replace(/[^a-z_]/g, '') + (extra ? ' ' + extra : ''), title: s }, s.replace(/_/g, ' '));
  };

  // ---- formatting ----------------------------------------------------------
  function pad(n, w) { n = String(n); while (n.length < (w || 2)) n = '0' + n; return n; }

  // Times show in UTC or in the browser's zone (the header's toggle, kept
  // in localStorage); every absolute time carries its zone.
  var zoneKey = 'goreactor.dashboard.zone';
  GR.zone = function () {
    try { return localStorage.getItem(zoneKey) === 'utc' ? 'utc' : 'local'; } catch (e) { return 'local'; }
  };
  function parts(d) {
    if (GR.zone() === 'utc') {
      return { y: d.getUTCFullYear(), mo: d.getUTCMonth() + 1, d: d.getUTCDate(), h: d.getUTCHours(), mi: d.getUTCMinutes(), s: d.getUTCSeconds(), ms: d.getUTCMilliseconds() };
    }
    return { y: d.getFullYear(), mo: d.getMonth() + 1, d: d.getDate(), h: d.getHours(), mi: d.getMinutes(), s: d.getSeconds(), ms: d.getMilliseconds() };
  }
  // zoneName is the zone a time at d shows in: "UTC", or the local
  // offset at d ("UTC+1", "UTC-3:30"; it moves with summer time).
  GR.zoneName = function (d) {
    if (GR.zone() === 'utc') return 'UTC';
    var off = -(d || new Date()).getTimezoneOffset();
    var sign = off < 0 ? '-' : '+';
    off = Math.abs(off);
    return 'UTC' + sign + Math.floor(off / 60) + (off % 60 ? ':' + pad(off % 60) : '');
  };

  GR.fmtTime = function (iso) {
    if (!iso) return '';
    var d = new Date(iso);
    if (isNaN(d)) return String(iso);
    var p = parts(d);
    return p.y + '-' + pad(p.mo) + '-' + pad(p.d) + ' ' + pad(p.h) + ':' + pad(p.mi) + ':' + pad(p.s);
  };

  GR.fmtClock = function (iso) {
    if (!iso) return '';
    var d = new Date(iso);
    if (isNaN(d)) return String(iso);
    var p = parts(d);
    return pad(p.h) + ':' + pad(p.mi) + ':' + pad(p.s) + '.' + pad(p.ms, 3);
  };

  GR.fmtDur = function (ms) {
    if (ms === null || ms === undefined || isNaN(ms)) return '';
    ms = Math.max(0, Math.round(ms));
    if (ms < 1000) return ms + ' ms';
    var s = ms / 1000;
    if (s < 60) return (s < 10 ? s.toFixed(2) : s.toFixed(1)) + ' s';
    var m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + pad(Math.floor(s % 60)) + 's';
    var h = Math.floor(m / 60);
    if (h < 48) return h + 'h ' + pad(m % 60) + 'm';
    return Math.floor(h / 24) + 'd ' + (h % 24) + 'h';
  };

  // fmtAgo is a coarse age: "just now", "42s ago", "7m ago", "3h 05m ago".
  GR.fmtAgo = function (iso) {
    if (!iso) return '';
    var t = Date.parse(iso);
    if (isNaN(t)) return '';
    var s = Math.floor((Date.now() - t) / 1000);
    if (s < 5) return 'just now';
    if (s < 60) return s + 's ago';
    var m = Math.floor(s / 60);
    if (m < 60) return m + 'm ago';
    var h = Math.floor(m / 60);
    if (h < 48) return h + 'h ' + pad(m % 60) + 'm ago';
    return Math.floor(h / 24) + 'd ago';
  };

  // fmtShort is a time for a list: the clock for today, the day otherwise.
  GR.fmtShort = function (iso) {
    if (!iso) return '';
    var d = new Date(iso);
    if (isNaN(d)) return String(iso);
    var p = parts(d), n = parts(new Date());
    var clock = pad(p.h) + ':' + pad(p.mi) + ':' + pad(p.s);
    if (p.y === n.y && p.mo === n.mo && p.d === n.d) return clock;
    var day = pad(p.mo) + '-' + pad(p.d) + ' ' + clock.slice(0, 5);
    return p.y === n.y ? day : p.y + '-' + day;
  };

  GR.fmtNum = function (n) { return (n === null || n === undefined) ? '' : Number(n).toLocaleString('en-US'); };

  // toInput is iso as a datetime-local input's value in the shown zone;
  // fromInput reads one back as an ISO time ('' for none).
  GR.toInput = function (iso) {
    if (!iso) return '';
    var d = new Date(iso);
    if (isNaN(d)) return '';
    var p = parts(d);
    return p.y + '-' + pad(p.mo) + '-' + pad(p.d) + 'T' + pad(p.h) + ':' + pad(p.mi) + ':' + pad(p.s);
  };
  GR.fromInput = function (v) {
    if (!v) return '';
    if (v.length === 16) v += ':00';
    var d = GR.zone() === 'utc' ? new Date(v + 'Z') : new Date(v);
    return isNaN(d) ? '' : d.toISOString();
  };

  // timeEl shows a time as mode 'full' (date and clock), 'short' (for a
  // list), 'clock' (with milliseconds) or 'ago', with the exact UTC time
  // and the age on hover. Absolute times end with their zone (a .tz span)
  // and follow the header's UTC/local toggle.
  GR.timeEl = function (iso, mode) {
    if (!iso) return GR.h('span', { class: 'muted' }, '—');
    var el = GR.h('time', { datetime: iso, dataset: { mode: mode || 'full' } });
    fillTime(el);
    return el;
  };
  function fillTime(el) {
    var iso = el.getAttribute('datetime'), mode = el.dataset.mode;
    var text = mode === 'ago' ? GR.fmtAgo(iso) : mode === 'short' ? GR.fmtShort(iso) : mode === 'clock' ? GR.fmtClock(iso) : GR.fmtTime(iso);
    var zone = GR.zoneName(new Date(iso));
    GR.clear(el);
    el.appendChild(document.createTextNode(text));
    if (mode !== 'ago') el.appendChild(GR.h('span', { class: 'tz' }, ' ' + zone));
    el.title = GR.fmtTime(iso) + ' ' + zone + ' · ' + iso + ' · ' + GR.fmtAgo(iso);
  }

  // setZone switches every time on the page to zone ('utc' or 'local').
  GR.setZone = function (z) {
    try { localStorage.setItem(zoneKey, z === 'utc' ? 'utc' : 'local'); } catch (e) { /* storage off */ }
    Array.prototype.forEach.call(document.querySelectorAll('time[data-mode]'), fillTime);
    zoneButton();
    document.dispatchEvent(new CustomEvent('gr:zone'));
  };
  function zoneButton() {
    var b = GR.$('zone-button');
    if (!b) return;
    var utc = GR.zone() === 'utc';
    b.textContent = utc ? 'UTC' : 'local ' + GR.zoneName(new Date()).replace('UTC', '');
    b.setAttribute('aria-pressed', utc ? 'true' : 'false');
    b.title = 'Times show in ' + (utc ? 'UTC' : 'this browser\u2019s zone (' + GR.zoneName(new Date()) + ')') + '; click for ' + (utc ? 'local time' : 'UTC');
  }

  // valueEl renders any JSON value: short scalars inline, the rest as
  // indented JSON text.
  GR.valueEl = function (v) {
    if (v === null || v === undefined) return GR.h('span', { class: 'muted' }, 'null');
    if (typeof v === 'string' && v.length <= 120 && v.indexOf('\n') < 0) return GR.h('span', { class: 'val-str' }, v);
    if (typeof v === 'number' || typeof v === 'boolean') return GR.h('span', { class: 'val-num' }, String(v));
    return GR.h('pre', { class: 'json' }, typeof v === 'string' ? v : GR.jsonText(v, ''));
  };

  // jsonText indents objects like JSON.stringify(v, null, 2) but keeps an
  // array of scalars on one (wrapping) line, so a list of ids stays short.
  GR.jsonText = function (v, indent) {
    if (v === null || typeof v !== 'object') return JSON.stringify(v === undefined ? null : v);
    var inner = indent + '  ';
    if (Array.isArray(v)) {
      if (!v.length) return '[]';
      if (v.every(function (x) { return x === null || typeof x !== 'object'; })) {
        return '[' + v.map(function (x) { return JSON.stringify(x); }).join(', ') + ']';
      }
      return '[\n' + v.map(function (x) { return inner + GR.jsonText(x, inner); }).join(',\n') + '\n' + indent + ']';
    }
    var keys = Object.keys(v);
    if (!keys.length) return '{}';
    return '{\n' + keys.map(function (k) { return inner + JSON.stringify(k) + ': ' + GR.jsonText(v[k], inner); }).join(',\n') + '\n' + indent + '}';
  };

  // ---- API -----------------------------------------------------------------
  GR.api = function (path, opts) {
    opts = opts || {};
    var headers = { Accept: 'application/json' };
    if (opts.body !== undefined) headers['Content-Type'] = 'application/json';
    // Every request carries the tab's token, if one is set: a read with it
    // shows a sensitive run's values (docs/dashboard-api.md).
    var token = opts.token || GR.token();
    if (token) headers.Authorization = 'Bearer ' + token;
    return fetch(GR.base + path, {
      method: opts.method || 'GET',
      headers: headers,
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      credentials: 'same-origin',
      cache: 'no-store'
    }).then(function (resp) {
      return resp.text().then(function (text) {
        var data = null;
        try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
        if (!resp.ok) {
          var msg = (data && typeof data.error === 'string') ? data.error : (text || resp.statusText || ('HTTP ' + resp.status));
          var err = new Error(msg);
          err.status = resp.status;
          err.data = data;
          throw err;
        }
        return { status: resp.status, data: data };
      });
    });
  };

  GR.query = function (params) {
    var parts = [];
    Object.keys(params).forEach(function (k) {
      var v = params[k];
      if (v === undefined || v === null || v === '') return;
      parts.push(encodeURIComponent(k) + '=' + encodeURIComponent(v));
    });
    return parts.length ? '?' + parts.join('&') : '';
  };

  // ---- messages ------------------------------------------------------------
  // message shows the outcome of an action. Errors stay until dismissed;
  // confirmations fade after a while.
  GR.message = function (kind, title, detail, lines) {
    var box = GR.$('messages');
    var close = GR.h('button', { type: 'button', class: 'msg-close', title: 'Dismiss', 'aria-label': 'Dismiss' }, '×');
    var msg = GR.h('div', { class: 'msg msg-' + kind },
      GR.h('div', { class: 'msg-body' },
        GR.h('strong', { class: 'msg-title' }, title),
        detail ? GR.h('span', { class: 'msg-detail' }, detail) : null,
        lines && lines.length ? GR.h('ul', { class: 'msg-lines' }, lines.map(function (l) { return GR.h('li', null, l); })) : null),
      close);
    close.addEventListener('click', function () { msg.remove(); });
    box.insertBefore(msg, box.firstChild);
    while (box.children.length > 4) box.removeChild(box.lastChild);
    if (kind === 'ok') setTimeout(function () { msg.remove(); }, 12000);
    return msg;
  };

  // ---- dialogs -------------------------------------------------------------
  function openDialog(dlg) {
    return new Promise(function (resolve) {
      function done() { dlg.removeEventListener('close', done); resolve(dlg.returnValue); GR.poller.nudge(); }
      dlg.returnValue = 'cancel';
      dlg.addEventListener('close', done);
      dlg.showModal();
      GR.poller.update();
    });
  }

  // confirm asks before a mutation, naming exactly what will happen.
  GR.confirm = function (title, text, items, okLabel) {
    return confirmWith(title, text, items, okLabel, false).then(function (v) { return v !== null; });
  };

  // confirmReason is confirm that also asks why (required: the action and
  // its reason go to the run's audit with the operator's name); resolves to
  // the reason, or null when the user kept things as they are.
  GR.confirmReason = function (title, text, items, okLabel) {
    return confirmWith(title, text, items, okLabel, true);
  };

  function confirmWith(title, text, items, okLabel, withReason) {
    var box = GR.$('confirm-reason-box'), reason = GR.$('confirm-reason');
    box.hidden = !withReason;
    reason.required = withReason;
    reason.value = '';
    GR.$('confirm-title').textContent = title;
    GR.$('confirm-text').textContent = text;
    var list = GR.clear(GR.$('confirm-list'));
    (items || []).slice(0, 12).forEach(function (it) { list.appendChild(GR.h('li', { class: 'mono' }, it)); });
    if (items && items.length > 12) list.appendChild(GR.h('li', { class: 'muted' }, '… and ' + (items.length - 12) + ' more'));
    list.hidden = !items || !items.length;
    GR.$('confirm-yes').textContent = okLabel || 'Confirm';
    var opened = openDialog(GR.$('confirm-dialog'));
    if (withReason) reason.focus();
    return opened.then(function (v) {
      if (v !== 'ok') return null;
      return withReason ? reason.value.trim() : '';
    });
  }

  // ---- token ---------------------------------------------------------------
  var tokenKey = 'goreactor.dashboard.token';
  GR.token = function () { try { return sessionStorage.getItem(tokenKey) || ''; } catch (e) { return ''; } };
  function setToken(t) {
    try { if (t) sessionStorage.setItem(tokenKey, t); else sessionStorage.removeItem(tokenKey); } catch (e) { /* storage off */ }
    var b = GR.$('token-button');
    if (b) { b.textContent = t ? 'Token set' : 'Set token'; b.classList.toggle('has-token', !!t); }
  }

  // askToken prompts for the bearer token; resolves to it, or '' if the
  // user gave none.
  GR.askToken = function (reason) {
    var r = GR.$('token-reason');
    r.textContent = reason || '';
    r.hidden = !reason;
    var input = GR.$('token-input');
    input.value = '';
    return openDialog(GR.$('token-dialog')).then(function (v) {
      if (v === 'forget') { setToken(''); return ''; }
      if (v !== 'ok' || !input.value.trim()) return '';
      setToken(input.value.trim());
      input.value = '';
      return GR.token();
    });
  };

  // post sends a mutation with the bearer token, asking for the token when
  // none is stored and again when the server answers 401.
  GR.post = function (path, payload) {
    function attempt(token, tries) {
      if (!token) return Promise.reject(Object.assign(new Error('no token entered; nothing was sent'), { status: 0, local: true }));
      return GR.api(path, { method: 'POST', body: payload, token: token }).catch(function (err) {
        if (err.status === 401 && tries < 3) {
          setToken('');
          return GR.askToken('The server refused the token: ' + err.message).then(function (t) { return attempt(t, tries + 1); });
        }
        throw err;
      });
    }
    var t = GR.token();
    return (t ? Promise.resolve(t) : GR.askToken('')).then(function (tok) { return attempt(tok, 0); });
  };

  // ---- actions -------------------------------------------------------------
  GR.actions = {
    undo: {
      verb: 'Undo',
      one: function (id) { return 'Undo run ' + id + ': roll back every step it completed, newest first. Its status becomes cancelled.'; },
      many: function (n) { return 'Undo ' + n + ' runs: roll back every step each one completed, newest first.'; }
    },
    cancel: {
      verb: 'Cancel',
      one: function (id) { return 'Cancel run ' + id + ': stop it at its next checkpoint and roll back what it completed.'; },
      many: function (n) { return 'Cancel ' + n + ' runs: stop each at its next checkpoint and roll back what it completed.'; }
    },
    retry: {
      verb: 'Retry',
      one: function (id) { return 'Retry run ' + id + ': run it again with the same inputs under a new id, linked to this one.'; },
      many: function (n) { return 'Retry ' + n + ' runs: run each again with the same inputs under a new id, linked to the original.'; }
    },
    rollback: {
      verb: 'Retry rollback',
      one: function (id) { return 'Retry the rollback of run ' + id + ': undo again only the entries its last rollback could not undo, in a new rollback generation.'; },
      many: function (n) { return 'Retry the rollback of ' + n + ' runs: undo again only the entries each one\'s last rollback could not undo.'; }
    }
  };

  // runAction confirms and requests one action on one run; resolves when
  // the answer is shown.
  GR.runAction = function (id, action) {
    var a = GR.actions[action];
    return GR.confirmReason(a.verb + ' run?', a.one(id), null, a.verb + ' run').then(function (why) {
      if (why === null) return null;
      return GR.post('/api/runs/' + encodeURIComponent(id) + '/' + action, { reason: why }).then(function (res) {
        var d = res.data || {};
        if (d.warning) {
          // Queued where no worker serves: say so, and keep it shown.
          GR.message('warn', a.verb + ' queued for run ' + id + ' but nothing will carry it out yet', d.warning);
          return res;
        }
        GR.message('ok', a.verb + ' requested for run ' + id,
          (d.duplicate ? 'Already requested; the same control task is queued.' : 'A worker carries it out.') +
          (d.task_id ? ' Task ' + d.task_id + '.' : ''));
        return res;
      }, function (err) {
        GR.message('error', a.verb + ' of run ' + id + (err.status ? ' refused (' + err.status + ')' : ' not sent'), err.message);
        return null;
      });
    }).then(function (r) { GR.poller.nudge(); return r; });
  };

  // runBatch confirms and requests one action on many runs.
  GR.runBatch = function (ids, action) {
    var a = GR.actions[action];
    return GR.confirmReason(a.verb + ' ' + ids.length + ' runs?', a.many(ids.length), ids, a.verb + ' ' + ids.length + ' runs').then(function (why) {
      if (why === null) return null;
      return GR.post('/api/runs/actions', { action: action, ids: ids, reason: why }).then(function (res) {
        var results = (res.data && res.data.results) || [];
        var okN = 0, lines = [], warnings = {};
        results.forEach(function (r) {
          if (r.status_code >= 200 && r.status_code < 300) okN++;
          else lines.push(r.run_id + ': ' + (r.error || ('HTTP ' + r.status_code)));
          if (r.warning) warnings[r.warning] = true;
        });
        var refused = results.length - okN;
        GR.message(refused ? 'error' : 'ok', a.verb + ': ' + okN + ' requested' + (refused ? ', ' + refused + ' refused' : ''), '', lines);
        Object.keys(warnings).forEach(function (w) { GR.message('warn', a.verb + ': queued where no worker serves', w); });
        return results;
      }, function (err) {
        GR.message('error', a.verb + ' of ' + ids.length + ' runs ' + (err.status ? 'refused (' + err.status + ')' : 'not sent'), err.message);
        return null;
      });
    }).then(function (r) { GR.poller.nudge(); return r; });
  };

  // runMatching confirms and requests one action on every run a filter
  // matches (count, as GET /api/matching counted them): the server lists
  // them again and acts only if there are still exactly count. Resolves to
  // the results, {conflict: true} when the count changed, or null.
  GR.runMatching = function (filter, count, action, describe) {
    var a = GR.actions[action];
    var n = GR.fmtNum(count);
    var text = a.many(n) + ' These are the ' + n + ' runs matching the filter below; the server counts them again and requests nothing if the number changed.';
    return GR.confirmReason(a.verb + ' ' + n + ' runs?', text, describe, a.verb + ' ' + n + ' runs').then(function (why) {
      if (why === null) return null;
      return GR.post('/api/runs/actions', { action: action, filter: filter, reason: why, expect: count }).then(function (res) {
        var results = (res.data && res.data.results) || [];
        var okN = 0, lines = [], warnings = {};
        results.forEach(function (r) {
          if (r.status_code >= 200 && r.status_code < 300) okN++;
          else if (lines.length < 20) lines.push(r.run_id + ': ' + (r.error || ('HTTP ' + r.status_code)));
          if (r.warning) warnings[r.warning] = true;
        });
        var refused = results.length - okN;
        if (refused > lines.length) lines.push('… and ' + (refused - lines.length) + ' more refused');
        GR.message(refused ? 'error' : 'ok', a.verb + ': ' + GR.fmtNum(okN) + ' requested' + (refused ? ', ' + GR.fmtNum(refused) + ' refused' : '') + ' (all ' + n + ' matching)', '', lines);
        Object.keys(warnings).forEach(function (w) { GR.message('warn', a.verb + ': queued where no worker serves', w); });
        return results;
      }, function (err) {
        GR.message('error', a.verb + ' of ' + n + ' matching runs ' + (err.status ? 'refused (' + err.status + ')' : 'not sent'), err.message);
        // 409: the filter matches another number now; the caller counts again.
        return err.status === 409 ? { conflict: true } : null;
      });
    }).then(function (r) { GR.poller.nudge(); return r; });
  };

  // ---- live refresh --------------------------------------------------------
  // The poller calls the page's refresh every interval, unless the user is
  // selecting text, a dialog is open, the tab is hidden, or they paused it.
  GR.poller = (function () {
    var interval = 2000;
    var fn = null, timer = null, running = false, manual = false, pending = false, failing = '';
    function reason() {
      if (manual) return 'paused';
      if (document.querySelector('dialog[open]')) return 'paused: dialog open';
      var sel = window.getSelection && window.getSelection();
      if (sel && !sel.isCollapsed && String(sel).trim() !== '') return 'paused: text selected';
      if (document.hidden) return 'paused: tab hidden';
      return '';
    }
    function update() {
      var r = reason();
      var btn = GR.$('live');
      if (btn) {
        // A refresh that fails (Redis down, the dashboard gone) is not
        // live: the dot says so until a refresh succeeds again.
        btn.classList.toggle('paused', !!r);
        btn.classList.toggle('failing', !r && !!failing);
        btn.dataset.state = r ? 'paused' : (failing ? 'failing' : 'live');
        btn.title = failing ? 'the last refresh failed: ' + failing : '';
        GR.$('live-label').textContent = r || (failing ? 'not updating' : 'live');
      }
      return r;
    }
    function schedule(ms) {
      clearTimeout(timer);
      timer = setTimeout(tick, ms);
    }
    function tick() {
      if (!fn) return;
      if (update()) { schedule(500); return; }
      if (running) { pending = true; return; }
      running = true;
      Promise.resolve().then(fn).then(function () {
        failing = '';
        update();
        var u = GR.$('updated');
        if (u) { u.textContent = 'updated ' + GR.fmtClock(new Date().toISOString()).slice(0, 8) + ' ' + GR.zoneName(new Date()); u.classList.remove('stale'); }
      }, function (err) {
        failing = err.message || 'error';
        update();
        var u = GR.$('updated');
        if (u) { u.textContent = 'refresh failed: ' + err.message; u.classList.add('stale'); }
      }).then(function () {
        running = false;
        if (pending) { pending = false; schedule(0); } else schedule(interval);
      });
    }
    document.addEventListener('selectionchange', function () {
      var was = GR.$('live') && GR.$('live').dataset.state;
      var r = update();
      if (!r && was === 'paused') schedule(0);
    });
    document.addEventListener('visibilitychange', function () { if (!update()) schedule(0); });
    return {
      start: function (f) { fn = f; schedule(0); },
      // nudge refreshes now (after an action or when a pause ends).
      nudge: function () { if (!update()) schedule(0); },
      update: update,
      toggle: function () { manual = !manual; if (!update()) schedule(0); },
      setInterval: function (ms) { interval = ms; }
    };
  })();

  document.addEventListener('DOMContentLoaded', function () {
    setToken(GR.token());
    zoneButton();
    var zb = GR.$('zone-button');
    if (zb) zb.addEventListener('click', function () { GR.setZone(GR.zone() === 'utc' ? 'local' : 'utc'); });
    var live = GR.$('live');
    if (live) live.addEventListener('click', function () { GR.poller.toggle(); });
    var tb = GR.$('token-button');
    if (tb) tb.addEventListener('click', function () {
      GR.askToken(GR.token() ? 'A token is set for this tab. Enter a new one, or forget it.' : '');
    });
    // Only the overview, the run page and the workers refresh themselves.
    if (live && body.dataset.page !== 'overview' && body.dataset.page !== 'run' && body.dataset.page !== 'workers') live.hidden = true;
    GR.poller.update();
  });
})();
