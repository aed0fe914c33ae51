// Package dashboard is goreactor's operator dashboard as an http.Handler any
// binary can mount (cmd/dashboard serves it): a JSON API over the run
// indexes and the maps' own keys, the Prometheus collector at /metrics, and
// the actions (undo, cancel, retry) validated here and carried out by
// workers.
//
// It holds no reactor definitions. Every listing is an index read, newest
// first with a cursor, never a keyspace scan (DESIGN 8.1); a map's element
// picture comes from the map's result hashes, never from its element runs.
// docs/dashboard-api.md is the API reference.
//
// The prefix and the queue default to GOREACTOR_PREFIX and GOREACTOR_QUEUE,
// as everywhere in goreactor (docs/configuration.md). An action goes to the
// queue its run recorded (Config.ControlQueue for a run that recorded
// none). The overview and /api/stats mark each configured queue served or
// not (asynq's server registry, read at most every 3 s) and warn about one
// no worker serves; an accepted action whose queue no worker serves says
// so in its 202 answer. The workers view (/workers, /api/workers) lists
// asynq's servers with each worker's goreactor version (the record a worker
// publishes, package worker) and its active tasks read as runs, elements,
// rollbacks and control requests.
//
// Mount it with:
//
//	h, err := dashboard.New(dashboard.Config{Client: rdb, Token: os.Getenv("GOREACTOR_DASHBOARD_TOKEN")})
//	if err != nil { ... }
//	http.ListenAndServe("127.0.0.1:8080", h)
package dashboard
