package dashboard

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
)

// servedTTL is how long the dashboard trusts one read of asynq's server
// registry. asynq's servers beat every 5 s, so a fresher answer would not
// be more true, and the overview's poll and a batch of actions then cost
// one registry read.
const servedTTL = 3 * time.Second

// servedQueues answers "does a live worker poll queue q?" from asynq's
// server registry (Inspector.Servers: every server with the queues it
// polls), read at most once per servedTTL.
type servedQueues struct {
	insp *asynq.Inspector
	ttl  time.Duration

	mu     sync.Mutex
	readAt time.Time
	served map[string]bool // queue -> polled by an active server
	err    error
}

func newServedQueues(insp *asynq.Inspector) *servedQueues {
	return &servedQueues{insp: insp, ttl: servedTTL}
}

// queues returns the queues some active asynq server polls. asynq's
// Inspector takes no context: when ctx ends first, queues returns ctx's
// error and the read finishes in the background (and fills the cache).
func (s *servedQueues) queues(ctx context.Context) (map[string]bool, error) {
	s.mu.Lock()
	if !s.readAt.IsZero() && time.Since(s.readAt) < s.ttl {
		defer s.mu.Unlock()
		return s.served, s.err
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() {
		defer close(done)
		servers, err := s.insp.Servers()
		served := map[string]bool{}
		for _, srv := range servers {
			if srv.Status != "active" {
				continue
			}
			for q, prio := range srv.Queues {
				if prio > 0 {
					served[q] = true
				}
			}
		}
		if err != nil {
			err = fmt.Errorf("list asynq's servers: %w", err)
			served = nil
		}
		s.mu.Lock()
		s.served, s.err, s.readAt = served, err, time.Now()
		s.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-done:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served, s.err
}

// notServedWarning is the warning about queue q that no worker polls:
// where says what goes to q, waits what waits there.
func notServedWarning(q, where, waits string) string {
	return fmt.Sprintf("no worker serves queue %q%s: %s there until a worker serving it starts "+
		"(worker -queue %s, or GOREACTOR_QUEUE=%s)", q, where, waits, q, q)
}
