package dashboard

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/reactor"
)

// Config configures New.
type Config struct {
	// Client is the Redis client of the engines whose runs the dashboard
	// shows (and of their asynq queues). Required.
	Client redis.UniversalClient
	// Prefix is the engines' key prefix (reactor.Config.Prefix). Default
	// GOREACTOR_PREFIX, else "goreactor".
	Prefix string
	// Token enables the actions (undo, cancel, retry): a request must carry
	// "Authorization: Bearer <Token>". Default "": actions are refused with
	// 403 and a message saying how to enable them.
	Token string
	// Operators maps tokens to the names of the people who hold them
	// (ParseOperators reads them from a file, cmd/dashboard's
	// -operators-file): each token lets its holder act like Token, and the
	// audit of each request records the holder's name. Default none.
	Operators map[string]string
	// OperatorHeader, when set, names the request header a trusted proxy in
	// front of the dashboard sets to the authenticated person's name
	// ("X-Forwarded-User", "X-Auth-Request-User"): the name recorded with
	// each request. With no Token and no Operators, the header alone lets a
	// request act, so set it only when nothing but that proxy can reach the
	// dashboard, and the proxy drops the header from what clients send.
	// Default "": no header is trusted.
	OperatorHeader string
	// ControlQueue is the asynq queue the actions' control tasks go to for
	// runs that recorded no queue (in-process runs, and runs stored before
	// runs recorded their queue); a run that recorded one gets them there.
	// It must be one your workers serve (cmd/dashboard's -queue). Default:
	// the first queue GOREACTOR_QUEUE names, else worker.DefaultQueue.
	ControlQueue string
	// Queues are the asynq queues /api/stats reports, each marked with
	// whether a worker serves it, and warned about on the overview when
	// none does. Default: ControlQueue alone. []string{"*"} reports every
	// asynq queue in Client's Redis (other applications' too), warning
	// only about ControlQueue.
	Queues []string
	// QueueShards is the workers' shard count of ControlQueue, the queue
	// they enqueue on (worker.ClientConfig.Shards, cmd/dashboard's
	// -queue-shards): /api/stats then reports ControlQueue's shard queues,
	// "<ControlQueue>.shard0" and on, right after it (where Queues lists
	// it), each marked served or not, and warns about those no worker
	// serves. Default 1 (no shards); at most 64.
	QueueShards int
	// Gatherer is what /metrics serves. Default: metrics.NewRegistry of a
	// metrics.New reading Client (the goreactor_runs gauge and the Go
	// runtime; the event counters stay at zero in a dashboard process, so
	// scrape the workers for those).
	Gatherer prometheus.Gatherer
	// AllowedHosts are the host names (a request's Host, its port aside)
	// the dashboard answers to besides IP addresses and localhost: the
	// names it is reached by, behind a proxy or a DNS name. A request for
	// any other host is refused (403), which defeats DNS rebinding: a web
	// page whose name was re-pointed at the dashboard's address cannot read
	// runs through an operator's browser, since its requests carry its own
	// name. "*.example.com" allows the subdomains of example.com; "*" alone
	// allows every name (the check off). /metrics is not checked. Default
	// none (cmd/dashboard's -allowed-hosts).
	AllowedHosts []string
	// StallAfter is how long a live run (pending, running, rolling back)
	// may go without progress (a state write, a settle of one of its maps)
	// while no worker holds it before the dashboard marks it stalled, with
	// why (GET /api/stalls, the overview's Stalled tile, the run page, the
	// goreactor_dashboard_stalled_runs gauge), and offers re-dispatch.
	// Default 2 minutes (cmd/dashboard's -stall-after,
	// GOREACTOR_DASHBOARD_STALL_AFTER).
	StallAfter time.Duration
	// StallScan bounds the live runs (entries of the active index, oldest
	// first) one stall examination reads; the answer says when there were
	// more (truncated). Default 500.
	StallScan int
	// Definitions, when given, are registered with the dashboard's engines
	// (they run nothing): a paused run's page and GET /api/paused then name
	// its interrupt's payload type with an example to fill in, and a
	// continue's payload is checked against the step before it is recorded
	// (a refusal is a 422 with why). Without them a payload is recorded
	// unchecked and the worker checks it: a refusal then shows on the run
	// page as the interrupt's last refusal, the run still paused. Default
	// none.
	Definitions []*reactor.Definition
	// Logger receives a line per request that failed on the server's side.
	// Default slog.Default().
	Logger *slog.Logger
}

// Stall defaults.
const (
	DefaultStallAfter = 2 * time.Minute
	defaultStallScan  = 500
)

// allQueues, alone in Config.Queues, reports every asynq queue.
const allQueues = "*"

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = envconfig.Prefix()
	}
	if c.ControlQueue == "" {
		c.ControlQueue = envconfig.Queue()
	}
	if len(c.Queues) == 0 {
		c.Queues = []string{c.ControlQueue}
	}
	if c.QueueShards == 0 {
		c.QueueShards = 1
	}
	if c.StallAfter <= 0 {
		c.StallAfter = DefaultStallAfter
	}
	if c.StallScan <= 0 {
		c.StallScan = defaultStallScan
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	for tok, who := range c.Operators {
		if len(tok) < 16 || strings.TrimSpace(who) == "" {
			return fmt.Errorf("dashboard: Config.Operators: every operator needs a name and a token of at least 16 bytes (%q has %d)", who, len(tok))
		}
	}
	if c.OperatorHeader != "" && http.CanonicalHeaderKey(c.OperatorHeader) == "Authorization" {
		return errors.New("dashboard: Config.OperatorHeader cannot be Authorization, which carries the tokens")
	}
	for _, h := range c.AllowedHosts {
		if h == "" || strings.ContainsAny(h, "/ :") || (strings.Contains(h, "*") && h != "*" && !strings.HasPrefix(h, "*.")) ||
			strings.Count(h, "*") > 1 {
			return fmt.Errorf("dashboard: Config.AllowedHosts %q: want a host name (no port), \"*.domain\" or \"*\"", h)
		}
	}
	if c.Client == nil {
		return errors.New("dashboard: Config.Client is required (the Redis client of the engines whose runs it shows)")
	}
	if c.QueueShards != 0 {
		if err := envconfig.CheckShards(c.QueueShards); err != nil {
			return fmt.Errorf("dashboard: Config.QueueShards: %w", err)
		}
	}
	for _, q := range c.Queues {
		switch {
		case q == "":
			return errors.New("dashboard: Config.Queues holds an empty name")
		case q == allQueues && len(c.Queues) > 1:
			return fmt.Errorf("dashboard: Config.Queues %q: %q (every asynq queue) stands alone", c.Queues, allQueues)
		}
	}
	return nil
}

// reportedQueues is what /api/stats reports: Queues, with ControlQueue's
// shard queues right after it. nil for every asynq queue ("*").
func (c Config) reportedQueues() []string {
	if slices.Equal(c.Queues, []string{allQueues}) {
		return nil
	}
	var out []string
	for _, q := range c.Queues {
		if !slices.Contains(out, q) {
			out = append(out, q)
		}
		if q != c.ControlQueue {
			continue
		}
		for _, s := range maptask.ShardQueues(q, c.QueueShards) {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}
