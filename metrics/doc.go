// Package metrics exposes goreactor's Prometheus metrics.
//
// New returns a *Metrics that is three things at once:
//
//   - a reactor.Hook: add it to reactor.Config.Hooks and every run, step and
//     rollback event is counted (no Redis round trip: a hook runs on the
//     executing goroutine and only bumps counters);
//
//   - a worker.Observer and a sweeper.Observer: set it as worker.Config.Metrics
//     and sweeper.Config.Metrics and the task handlers (element tasks,
//     rollback jobs, owner resumes, snoozes) and the sweeper's passes are
//     counted;
//
//   - a prometheus.Collector: register it into your own registry.
//
//     m := metrics.New(metrics.Options{Client: rdb, Prefix: "goreactor"})
//     reg := prometheus.NewRegistry()
//     reg.MustRegister(m)
//     engine, _ := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Hooks: []reactor.Hook{m}, ...})
//     w := worker.New(engine, rdb, worker.Config{Metrics: m})
//     http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// cmd/worker (worker.Main) and cmd/sweeper do this with -metrics-addr.
//
// Every name starts with goreactor_; labels are low-cardinality only
// (reactor, step, status, outcome, kind, task), never a run id. The
// goreactor_runs gauge is the one metric read from Redis, at scrape time:
// one pipelined ZCARD per non-terminal status index.
package metrics
