package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/inspect"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/metrics"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// maxBody bounds every request body.
const maxBody = 64 << 10

// Handler serves the dashboard's JSON API and /metrics. Build it with New;
// it is safe for concurrent use.
type Handler struct {
	cfg       Config
	rdb       redis.UniversalClient
	keys      keys.Keys
	engine    *reactor.Engine // reads runs; it holds no definitions
	maps      *inspect.Reader
	inspector *asynq.Inspector
	served    *servedQueues
	metrics   http.Handler
	log       *slog.Logger
	// requester queues the actions for workers (a worker.Controller).
	requester requester
	ui        http.Handler
	// recovery is the sweeper whose RecoverRun a re-dispatch calls; it
	// enqueues through a worker client on ControlQueue (with
	// QueueShards), as the workers' own clients do.
	recovery   *sweeper.Sweeper
	stallCache *stallCache
	// continuer is the engine a continue records payloads with: it
	// enqueues the run's wake-up through the recovery's worker client, and
	// holds Config.Definitions, as engine does.
	continuer *reactor.Engine
}

// requester asks workers to carry out action ("undo", "cancel", "retry")
// on run runID, after validating it against the stored run: the error is
// one wrapping reactor.ErrNotFound (unknown run) or a *reactor.StatusError
// (wrong status, with the engine's reason).
type requester interface {
	Request(ctx context.Context, runID, action string) (queued, error)
	// RequestUndoSteps asks for an undo of the named steps of run runID:
	// Request's errors, and one wrapping worker.ErrInvalidSteps for steps
	// that cannot be valid.
	RequestUndoSteps(ctx context.Context, runID string, steps []string) (queued, error)
}

// queued is a request as the requester queued it.
type queued struct {
	// TaskID names the control task.
	TaskID string
	// Queue is the asynq queue it went to.
	Queue string
	// Duplicate is true when the same request was already queued.
	Duplicate bool
}

// New returns the dashboard's handler. It reads the engines' runs through
// cfg.Client and loads the scripts it needs, so an unreachable Redis fails
// here.
func New(cfg Config) (*Handler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eng, err := reactor.NewEngine(ctx, reactor.Config{Client: cfg.Client, Prefix: cfg.Prefix, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	if err := eng.Register(cfg.Definitions...); err != nil {
		return nil, fmt.Errorf("dashboard: Config.Definitions: %w", err)
	}
	if err := pageScript.Load(ctx, cfg.Client).Err(); err != nil {
		return nil, fmt.Errorf("dashboard: load script: %w", err)
	}
	g := cfg.Gatherer
	if g == nil {
		g = metrics.NewRegistry(metrics.New(metrics.Options{Client: cfg.Client, Prefix: cfg.Prefix, Logger: cfg.Logger}))
	}
	ctl, err := worker.NewController(ctx, worker.ControllerConfig{Client: cfg.Client, Prefix: cfg.Prefix,
		Queue: cfg.ControlQueue, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	rec, cont, err := newRecovery(ctx, cfg)
	if err != nil {
		return nil, err
	}
	insp := asynq.NewInspectorFromRedisClient(cfg.Client)
	h := &Handler{cfg: cfg, rdb: cfg.Client, keys: keys.New(cfg.Prefix), engine: eng,
		maps: inspect.New(cfg.Client, cfg.Prefix), inspector: insp, served: newServedQueues(insp),
		log:       cfg.Logger,
		requester: controller{ctl},
		ui:        newUI(), recovery: rec, stallCache: &stallCache{ttl: stallTTL}, continuer: cont}
	stalls := prometheus.NewRegistry()
	stalls.MustRegister(newStallCollector(h))
	h.metrics = promhttp.HandlerFor(prometheus.Gatherers{g, stalls}, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	return h, nil
}

// newRecovery returns the sweeper a re-dispatch asks to recover one run:
// its engine holds no definitions and enqueues through a worker client on
// the workers' queue and shards (ControlQueue, QueueShards), so what it
// re-enqueues lands where the workers' own clients would put it. Its
// engine, with Config.Definitions, is also the one a continue records its
// payload with, so that the run's wake-up is enqueued the same way.
func newRecovery(ctx context.Context, cfg Config) (*sweeper.Sweeper, *reactor.Engine, error) {
	client, err := worker.NewClientWithConfig(cfg.Client, worker.ClientConfig{Queue: cfg.ControlQueue, Shards: cfg.QueueShards})
	if err != nil {
		return nil, nil, fmt.Errorf("dashboard: %w", err)
	}
	eng, err := reactor.NewEngine(ctx, reactor.Config{Client: cfg.Client, Prefix: cfg.Prefix, Logger: cfg.Logger, Enqueuer: client})
	if err != nil {
		return nil, nil, fmt.Errorf("dashboard: %w", err)
	}
	if err := eng.Register(cfg.Definitions...); err != nil {
		return nil, nil, fmt.Errorf("dashboard: Config.Definitions: %w", err)
	}
	rec, err := sweeper.New(sweeper.Config{Engine: eng, Logger: cfg.Logger})
	if err != nil {
		return nil, nil, fmt.Errorf("dashboard: %w", err)
	}
	return rec, eng, nil
}

// controller is a worker.Controller with the action by name, as the
// routes carry it.
type controller struct{ c *worker.Controller }

func (c controller) Request(ctx context.Context, runID, action string) (queued, error) {
	a, err := worker.ParseAction(action)
	if err != nil {
		return queued{}, err
	}
	req, err := c.c.Request(ctx, runID, a)
	return queued{TaskID: req.TaskID, Queue: req.Queue, Duplicate: req.Duplicate}, err
}

func (c controller) RequestUndoSteps(ctx context.Context, runID string, steps []string) (queued, error) {
	req, err := c.c.RequestUndoSteps(ctx, runID, steps)
	return queued{TaskID: req.TaskID, Queue: req.Queue, Duplicate: req.Duplicate}, err
}

// ServeHTTP routes a request: /api/... to the JSON API, /metrics to the
// collector, anything else to the HTML status view.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		if !allow(w, r, http.MethodGet, http.MethodHead) {
			return
		}
		h.metrics.ServeHTTP(w, r)
		return
	}
	if !h.hostAllowed(r.Host) {
		writeError(w, http.StatusForbidden, fmt.Sprintf("host %q is not one this dashboard answers to: add it to -allowed-hosts "+
			"(GOREACTOR_DASHBOARD_ALLOWED_HOSTS, dashboard.Config.AllowedHosts), or reach the dashboard by its IP address or localhost", r.Host))
		return
	}
	if r.URL.Path != "/api" && !strings.HasPrefix(r.URL.Path, "/api/") {
		h.ui.ServeHTTP(w, r)
		return
	}
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Referrer-Policy", "no-referrer")
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	}
	h.route(w, r)
}

// route dispatches an /api/ request by its path segments.
func (h *Handler) route(w http.ResponseWriter, r *http.Request) {
	seg := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/api/"), "/")
	for i, s := range seg {
		u, err := url.PathUnescape(s)
		if err != nil {
			writeError(w, http.StatusBadRequest, "the path is not valid URL encoding")
			return
		}
		seg[i] = u
	}
	get := func(f func(http.ResponseWriter, *http.Request)) {
		if allow(w, r, http.MethodGet, http.MethodHead) {
			f(w, r)
		}
	}
	post := func(f func(http.ResponseWriter, *http.Request)) {
		if allow(w, r, http.MethodPost) {
			f(w, r)
		}
	}
	switch {
	case len(seg) == 1 && seg[0] == "runs":
		get(h.listRuns)
	case len(seg) == 1 && seg[0] == "stats":
		get(h.stats)
	case len(seg) == 1 && seg[0] == "workers":
		get(h.workers)
	case len(seg) == 1 && seg[0] == "needs-human":
		get(h.needsHuman)
	case len(seg) == 1 && seg[0] == "stalls":
		get(h.stalls)
	case len(seg) == 1 && seg[0] == "paused":
		get(h.pausedRuns)
	case len(seg) == 1 && seg[0] == "limits":
		get(h.limits)
	case len(seg) == 3 && seg[0] == "runs" && seg[2] == continueAction:
		post(func(w http.ResponseWriter, r *http.Request) { h.continueRun(w, r, seg[1]) })
	case len(seg) == 3 && seg[0] == "runs" && seg[2] == redispatchAction:
		post(func(w http.ResponseWriter, r *http.Request) { h.redispatch(w, r, seg[1]) })
	case len(seg) == 1 && seg[0] == "matching":
		get(h.matching)
	case len(seg) == 2 && seg[0] == "runs" && seg[1] == "actions" && r.Method == http.MethodPost:
		h.batchAction(w, r)
	case len(seg) == 2 && seg[0] == "runs" && seg[1] != "":
		get(func(w http.ResponseWriter, r *http.Request) { h.runDetail(w, r, seg[1]) })
	case len(seg) == 3 && seg[0] == "runs" && seg[2] == "rollback-status":
		get(func(w http.ResponseWriter, r *http.Request) { h.rollbackStatus(w, r, seg[1]) })
	case len(seg) == 3 && seg[0] == "runs" && seg[2] == "audit":
		get(func(w http.ResponseWriter, r *http.Request) { h.audit(w, r, seg[1]) })
	case len(seg) == 3 && seg[0] == "runs" && seg[2] == "undo-steps":
		post(func(w http.ResponseWriter, r *http.Request) { h.undoSteps(w, r, seg[1]) })
	case len(seg) == 3 && seg[0] == "runs" && isAction(seg[2]):
		post(func(w http.ResponseWriter, r *http.Request) { h.action(w, r, seg[1], seg[2]) })
	case len(seg) >= 5 && seg[0] == "runs" && seg[2] == "entries" && seg[len(seg)-1] == "resolve":
		// The entry id ("book/pay#2") is one path-escaped segment
		// (book%2Fpay%232); an unescaped slash is accepted too. A '#'
		// must be escaped, or the client cuts the path there.
		entry := strings.Join(seg[3:len(seg)-1], "/")
		post(func(w http.ResponseWriter, r *http.Request) { h.resolve(w, r, seg[1], entry) })
	case len(seg) >= 5 && seg[0] == "runs" && seg[2] == "maps" && seg[len(seg)-1] == "elements":
		// The step is a path: "items", or "book/items" for a map in a
		// composed child (its slash escaped or not).
		step := strings.Join(seg[3:len(seg)-1], "/")
		get(func(w http.ResponseWriter, r *http.Request) { h.mapElements(w, r, seg[1], step) })
	default:
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path+" (see docs/dashboard-api.md)")
	}
}

// hostAllowed reports whether host, a request's Host header, names this
// dashboard (Config.AllowedHosts). An IP address cannot be re-pointed by
// DNS, and localhost resolves to the machine itself.
func (h *Handler) hostAllowed(host string) bool {
	if name, _, err := net.SplitHostPort(host); err == nil {
		host = name
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	for _, a := range h.cfg.AllowedHosts {
		a = strings.ToLower(a)
		switch {
		case a == "*", a == host:
			return true
		case strings.HasPrefix(a, "*.") && strings.HasSuffix(host, a[1:]):
			return true
		}
	}
	return false
}

// allow answers 405 with an Allow header unless r's method is one of
// methods. A mutation is never carried out by GET.
func allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed here; use %s", r.Method, strings.Join(methods, " or ")))
	return false
}

// writeJSON writes v as the response with status code. Go's encoder
// escapes <, > and & in strings, so a value can never be read as markup.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

type errorBody struct {
	Error  string `json:"error"`
	Status string `json:"status,omitempty"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorBody{Error: msg})
}

// serverError logs err and answers 500.
func (h *Handler) serverError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	h.log.Error("dashboard request failed", "event", "reactor.dashboard.error", "path", r.URL.Path, "error", err)
	// The cause (addresses, server replies) goes to the operator's log,
	// not to whoever can reach the page.
	writeError(w, http.StatusInternalServerError, "the dashboard could not read Redis; its log has the cause (event reactor.dashboard.error)")
}
