package store

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Acks makes writes wait for replicas: a write marked with it (WithAcks)
// is followed, in the same pipeline and so on the same connection, by
// WAIT Replicas Timeout, and its caller gets the reply only once that many
// replicas of the node have the write or Timeout passed. WAIT counts the
// replicas that acknowledged everything the connection wrote up to then,
// which is why it must share the write's connection: on another it would
// measure nothing.
//
// A WAIT that returns fewer replicas does not undo the write (Redis cannot)
// and does not fail it: the write stands on the master, as without Acks,
// and Short is told. Failing it would stop every run while a replica is
// down, and a retry would find the write done and go on all the same.
type Acks struct {
	Replicas int
	Timeout  time.Duration
	// Short is called, from the goroutine that sent the pipeline, when a
	// WAIT returned fewer than Replicas (got), or failed (got -1, err).
	Short func(got int, err error)
}

type acksKey struct{}

// WithAcks marks ctx so that the writes made with it wait for replicas
// (see Acks); a nil a, or one asking for none, returns ctx.
func WithAcks(ctx context.Context, a *Acks) context.Context {
	if a == nil || a.Replicas <= 0 {
		return ctx
	}
	return context.WithValue(ctx, acksKey{}, a)
}

func acksOf(ctx context.Context) *Acks {
	a, _ := ctx.Value(acksKey{}).(*Acks)
	return a
}

// ErrAcksClient reports a client InstallAcks cannot hook: WAIT needs to
// follow a write on its connection, which only a *redis.Client (one node,
// or a Sentinel failover client) and a *redis.ClusterClient (each node's
// client) let a hook do.
var ErrAcksClient = errors.New("store: replica acknowledgements need a *redis.Client or a *redis.ClusterClient")

// hooked holds the clients InstallAcks added its hook to, so that a client
// shared by several engines carries it once.
var hooked sync.Map // *redis.Client -> struct{}

// InstallAcks adds to rdb (to every node's client of a cluster, present
// and future) the pipeline hook that appends WAIT to a pipeline sent with
// a context marked by WithAcks. Unmarked pipelines pass untouched. It is
// idempotent per client.
func InstallAcks(ctx context.Context, rdb redis.UniversalClient) error {
	hook := func(c *redis.Client) {
		if _, loaded := hooked.LoadOrStore(c, struct{}{}); !loaded {
			c.AddHook(acksHook{})
		}
	}
	switch c := rdb.(type) {
	case *redis.Client:
		hook(c)
		return nil
	case *redis.ClusterClient:
		c.OnNewNode(hook)
		return c.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error { hook(n); return nil })
	default:
		return ErrAcksClient
	}
}

type acksHook struct{}

func (acksHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (acksHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (acksHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		a := acksOf(ctx)
		if a == nil || len(cmds) == 0 {
			return next(ctx, cmds)
		}
		for _, c := range cmds {
			if _, ok := c.(*waitCmd); ok {
				// A cluster client's resend of a node's part that failed
				// (a dropped connection) carries the WAIT appended before.
				return next(ctx, cmds)
			}
		}
		w := &waitCmd{redis.NewIntCmd(ctx, "wait", a.Replicas, a.Timeout.Milliseconds())}
		withWait := make([]redis.Cmder, 0, len(cmds)+1)
		withWait = append(append(withWait, cmds...), w)
		err := next(ctx, withWait)
		if a.Short == nil {
			return err
		}
		switch got, werr := w.Result(); {
		case werr != nil:
			// Not when the writes before it failed on their own: a refused
			// write (a moved slot) is sent again, with a WAIT of its own.
			if firstCmdErr(cmds) == nil && !isNetErr(werr) {
				a.Short(-1, werr)
			}
		case int(got) < a.Replicas:
			a.Short(int(got), nil)
		}
		return err
	}
}

// waitCmd is the WAIT acksHook appends, told apart from a caller's.
type waitCmd struct{ *redis.IntCmd }

func firstCmdErr(cmds []redis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// Eval runs sc like sc.Run, and when ctx is marked by WithAcks as a
// one-command pipeline, so that the WAIT acksHook appends shares its
// connection.
func Eval(ctx context.Context, rdb redis.UniversalClient, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	if acksOf(ctx) == nil {
		return sc.Run(ctx, rdb, keys, args...)
	}
	p := rdb.Pipeline()
	c := sc.EvalSha(ctx, p, keys, args...)
	_, _ = p.Exec(ctx)
	if c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
		p = rdb.Pipeline()
		c = sc.Eval(ctx, p, keys, args...)
		_, _ = p.Exec(ctx)
	}
	return c
}
