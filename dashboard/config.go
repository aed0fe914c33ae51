package dashboard

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
)

// Config configures New.
type Config struct {
	// Client is the Redis client of the engines whose runs the dashboard
	// shows (and of their asynq queues). Required.
	Client redis.UniversalClient
	// Prefix is the engines' key prefix (reactor.Config.Prefix). Default
	// "goreactor".
	Prefix string
	// Token enables the actions (undo, cancel, retry): a request must carry
	// "Authorization: Bearer <Token>". Default "": actions are refused with
	// 403 and a message saying how to enable them.
	Token string
	// ControlQueue is the asynq queue the actions' control tasks go to for
	// runs enqueued without reactor.WithQueue (a run with a queue of its
	// own gets them there): one your workers serve. Default
	// worker.DefaultQueue.
	ControlQueue string
	// Queues are the asynq queues /api/stats reports. Default: every queue
	// asynq knows in Client's Redis (the queues goreactor's workers serve,
	// worker.Config.Queues, are among them once a task was enqueued).
	Queues []string
	// Gatherer is what /metrics serves. Default: metrics.NewRegistry of a
	// metrics.New reading Client (the goreactor_runs gauge and the Go
	// runtime; the event counters stay at zero in a dashboard process, so
	// scrape the workers for those).
	Gatherer prometheus.Gatherer
	// Logger receives a line per request that failed on the server's side.
	// Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = keys.DefaultPrefix
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	if c.Client == nil {
		return errors.New("dashboard: Config.Client is required (the Redis client of the engines whose runs it shows)")
	}
	return nil
}
