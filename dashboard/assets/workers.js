// goreactor dashboard: the workers (asynq's servers with each goreactor
// worker's version) and what each one runs, from GET /api/workers.
(function () {
  'use strict';
  if (document.body.dataset.page !== 'workers') return;
  var GR = window.GR, h = GR.h, $ = GR.$;

  var queue = new URLSearchParams(location.search).get('queue') || '';
  var last = '';

  var kindLabel = { run: 'run', element: 'element', rollback: 'element rollback', control: 'control', foreign: 'other app', malformed: 'malformed' };

  function refresh() {
    return GR.api('/api/workers' + GR.query({ queue: queue })).then(function (res) {
      var data = res.data || {};
      var text = JSON.stringify(data.workers || []);
      if (text === last) return;
      last = text;
      render(data.workers || []);
    }, function (err) {
      var empty = $('workers-empty');
      empty.textContent = 'Could not load the workers: ' + err.message;
      empty.hidden = false;
      throw err;
    });
  }

  function render(workers) {
    var box = GR.clear($('workers'));
    var busy = 0, slots = 0, ours = 0;
    workers.forEach(function (w) {
      if (w.goreactor) { ours++; busy += w.busy; slots += w.concurrency; }
      box.appendChild(card(w));
    });
    $('workers-text').textContent = workers.length ?
      ours + ' goreactor worker' + (ours === 1 ? '' : 's') + ', ' + busy + ' of ' + slots + ' slots busy' +
      (workers.length > ours ? ' · ' + (workers.length - ours) + ' other' : '') : '';
    var empty = $('workers-empty');
    empty.textContent = queue ?
      'No worker polls queue ' + queue + ': start cmd/worker -queue ' + queue + ' (or GOREACTOR_QUEUE=' + queue + ') against this Redis.' :
      'No worker is running: start cmd/worker (or your program\'s worker.Main) against this Redis, with the same prefix and queue as this dashboard.';
    empty.hidden = workers.length !== 0;
  }

  function card(w) {
    var name = w.host + ':' + w.pid;
    var version = !w.goreactor ? h('span', { class: 'muted worker-version', title: 'A server of another application on this Redis' }, 'other application') :
      h('span', { class: 'worker-version' + (w.prefix ? '' : ' warn'), title: w.prefix ? 'goreactor version (prefix ' + w.prefix + ')' : 'This worker published no version record' },
        w.prefix ? 'goreactor ' + w.version : w.version);
    var queues = h('span', { class: 'worker-queues' }, 'queues ',
      w.queues.map(function (q, i) {
        return [i ? ', ' : '', h('span', { class: 'mono' }, q.queue), h('span', { class: 'muted' }, ' (' + q.priority + ')')];
      }));
    var tasks = h('ul', { class: 'worker-tasks' }, w.tasks.map(taskItem));
    return h('article', { class: 'worker-card' + (w.goreactor ? '' : ' foreign'), dataset: { server: w.server_id, name: name } },
      h('div', { class: 'worker-head' },
        h('span', { class: 'mono strong worker-name', title: 'asynq server ' + w.server_id }, name),
        h('span', { class: 'mono muted worker-id', title: 'asynq server id ' + w.server_id }, String(w.server_id).slice(0, 8)),
        h('span', { class: 'badge worker-status ws-' + String(w.status).replace(/[^a-z]/g, ''), title: 'asynq server status' }, w.status),
        version,
        h('span', { class: 'muted worker-started' }, 'started ', GR.timeEl(w.started, 'short'))),
      h('div', { class: 'worker-meta' },
        queues,
        h('span', { class: 'worker-busy' + (w.busy >= w.concurrency ? ' strong' : '') }, w.busy + ' / ' + w.concurrency + ' busy')),
      w.tasks.length ? tasks : h('p', { class: 'muted worker-idle' }, 'idle'));
  }

  function taskItem(t) {
    var what;
    switch (t.kind) {
      case 'run':
        what = [GR.runLink(t.run_id), t.reactor ? h('span', { class: 'muted' }, ' ' + t.reactor) : null];
        break;
      case 'element':
      case 'rollback':
        what = [GR.runLink(t.run_id),
          t.owner ? h('span', { class: 'muted' }, ' of ', h('span', { class: 'mono' }, t.map_step), ' in ') : null,
          t.owner ? GR.runLink(t.owner) : null,
          t.kind === 'rollback' ? h('span', { class: 'muted' }, ' · generation ' + t.generation) : null];
        break;
      case 'control':
        what = [h('span', { class: 'strong' }, t.action), ' ', GR.runLink(t.run_id)];
        break;
      default:
        what = [h('span', { class: 'mono' }, t.type)];
    }
    return h('li', { class: 'worker-task', dataset: { kind: t.kind, run: t.run_id || '' } },
      h('span', { class: 'task-kind kind-' + t.kind }, kindLabel[t.kind] || t.kind),
      h('span', { class: 'task-what' }, what),
      t.step ? h('span', { class: 'task-step' }, 'step ', h('span', { class: 'mono' }, t.step)) : null,
      t.status ? GR.badge(t.status) : null,
      h('span', { class: 'muted task-since', title: t.deadline ? 'deadline ' + t.deadline : null }, 'since ', GR.timeEl(t.started, 'ago')));
  }

  document.addEventListener('DOMContentLoaded', function () {
    if (queue) {
      var f = $('workers-filter');
      GR.append(f, ['Workers polling queue ', h('span', { class: 'mono' }, queue), ' · ', h('a', { href: GR.base + '/workers' }, 'show all')]);
      f.hidden = false;
    }
    GR.poller.start(refresh);
  });
})();
