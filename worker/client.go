package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/payload"
	"github.com/goreactor/goreactor/reactor"
)

// DefaultQueue is the asynq queue goreactor uses when neither a setting nor
// GOREACTOR_QUEUE names one.
const DefaultQueue = envconfig.DefaultQueue

// DefaultTaskTimeout bounds one delivery of a goreactor task. A run's
// liveness is its lock heartbeat, not the task timeout, so it is generous;
// asynq's default of 30 minutes would cut long steps short.
const DefaultTaskTimeout = 24 * time.Hour

// DefaultMaxRetry is asynq's retry budget for goreactor tasks. Snoozes do
// not spend it; only real failures (an unknown reactor, Redis trouble) do.
const DefaultMaxRetry = 25

// Client enqueues goreactor tasks. It implements reactor.Enqueuer and
// reactor.ServingReporter.
type Client struct {
	*mapSender  // the map-task side, for package mapstep (maptask.Adapt)
	*stepSender // the step-task side, for the engine (StepConfig.Task)
	c           *asynq.Client
	insp        *asynq.Inspector
	queue       string
	shards      int
}

// MaxQueueShards is the most shards ClientConfig.Shards takes.
const MaxQueueShards = maptask.MaxShards

// ClientConfig configures NewClientWithConfig.
type ClientConfig struct {
	// Queue is the queue the client enqueues on. Default: the first queue
	// GOREACTOR_QUEUE names, or DefaultQueue when it is unset: the queue
	// worker.Main serves in the same environment.
	Queue string
	// Shards spreads fan-out maps' element tasks and rollback jobs over
	// this many queues, "<Queue>.shard0" to "<Queue>.shard<Shards-1>",
	// chosen by the map id and the element's index; runs, resumes and
	// control tasks stay on Queue. asynq keeps each queue under one hash
	// tag, so on a Redis Cluster one queue is one master: with shards, a
	// big map's task traffic spreads over the masters the shard queues
	// hash to. A Worker whose engine enqueues through this client serves
	// the shards too, at Queue's priority. Every process that runs maps
	// (the workers, an API process running fan-out maps in-process, the
	// sweeper) must use the same count: worker.Main's -queue-shards
	// (GOREACTOR_QUEUE_SHARDS). Default 1 (no shards: everything on
	// Queue); at most MaxQueueShards.
	Shards int
}

// NewClient returns a Client enqueuing on queue, with no shards:
// NewClientWithConfig(rdb, ClientConfig{Queue: queue}). An empty queue is
// the first queue GOREACTOR_QUEUE names, or DefaultQueue when it is unset:
// the queue worker.Main serves in the same environment. It does not own
// rdb: close rdb yourself after Close.
func NewClient(rdb redis.UniversalClient, queue string) *Client {
	c, _ := NewClientWithConfig(rdb, ClientConfig{Queue: queue}) // no shards: nothing to refuse
	return c
}

// NewClientWithConfig returns a Client configured by cfg (see ClientConfig
// for the defaults). It refuses a Shards below 0 or above MaxQueueShards.
// It does not own rdb: close rdb yourself after Close.
func NewClientWithConfig(rdb redis.UniversalClient, cfg ClientConfig) (*Client, error) {
	if cfg.Queue == "" {
		cfg.Queue = envconfig.Queue()
	}
	if cfg.Shards == 0 {
		cfg.Shards = 1
	}
	if err := envconfig.CheckShards(cfg.Shards); err != nil {
		return nil, fmt.Errorf("worker: ClientConfig.Shards: %w", err)
	}
	c := &Client{c: asynq.NewClientFromRedisClient(rdb), insp: asynq.NewInspectorFromRedisClient(rdb),
		queue: cfg.Queue, shards: cfg.Shards}
	c.mapSender = maptask.NewSender(mapTasks{c})
	c.stepSender = newStepSender(stepTasks{c})
	return c, nil
}

// Queue returns the queue the client enqueues on.
func (c *Client) Queue() string { return c.queue }

// Shards returns the number of queues the client spreads map element
// tasks and rollback jobs over (ClientConfig.Shards); 1: none, they go on
// Queue.
func (c *Client) Shards() int { return c.shards }

// ShardQueues returns the queues the client puts map element tasks and
// rollback jobs on, "<Queue>.shard<i>" in shard order; none without
// shards.
func (c *Client) ShardQueues() []string { return maptask.ShardQueues(c.queue, c.shards) }

// mapQueue is the queue of element index of map mapID.
func (c *Client) mapQueue(mapID string, index int) string {
	return maptask.QueueOf(c.queue, c.shards, mapID, index)
}

// Served reports whether a live asynq server (a Worker, or a server of your
// own with this package's handler) is polling the client's queue: asynq's
// server registry holds a server while its heartbeat (every 5 s) keeps it
// alive, with the queues it polls. With shards, the client's queue is
// served only when every shard queue is too (a map's elements would
// otherwise wait on an unserved shard). engine.Wait asks it about a run
// that stays pending. It lists every server (and its active workers), so call
// it now and then, not per task. asynq's Inspector takes no context: when
// ctx ends first, Served returns ctx's error and the lookup finishes in the
// background.
func (c *Client) Served(ctx context.Context) (bool, error) { return c.ServesQueue(ctx, c.queue) }

// ServesQueue is Served for any queue: a run started WithQueue waits on its
// own queue (reactor.ServingReporter). The client's own queue counts as
// served when its shard queues are too; a run on another queue still runs
// its maps' elements on the client's shards, when the engine enqueues
// through this client, so those are required too.
func (c *Client) ServesQueue(ctx context.Context, queue string) (bool, error) {
	type answer struct {
		servers []*asynq.ServerInfo
		err     error
	}
	done := make(chan answer, 1)
	go func() {
		s, err := c.insp.Servers()
		done <- answer{s, err}
	}()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case a := <-done:
		if a.err != nil {
			return false, fmt.Errorf("worker: list asynq servers: %w", a.err)
		}
		served := map[string]bool{}
		for _, s := range a.servers {
			if s.Status != "active" {
				continue
			}
			for q, prio := range s.Queues {
				if prio > 0 {
					served[q] = true
				}
			}
		}
		if !served[queue] {
			return false, nil
		}
		for _, q := range c.ShardQueues() {
			if !served[q] {
				return false, nil
			}
		}
		return true, nil
	}
}

// Enqueue puts a wake-up on the client's queue, or on w.Queue when set (a
// run started WithQueue). A task with the same id already queued (or
// running, retried, archived) is the same cause: nil.
func (c *Client) Enqueue(ctx context.Context, w reactor.Wake) error {
	if w.Element {
		return c.enqueueElementWake(ctx, w)
	}
	body, err := payload.EncodeRun(payload.RunPayload{RunID: w.RunID, Reactor: w.Reactor, TP: traceparent(ctx)})
	if err != nil {
		return err
	}
	queue := c.queue
	if w.Queue != "" {
		queue = w.Queue
	}
	opts := []asynq.Option{asynq.TaskID(w.ID), asynq.Queue(queue), asynq.MaxRetry(DefaultMaxRetry), asynq.Timeout(DefaultTaskTimeout)}
	if w.Delay > 0 {
		opts = append(opts, asynq.ProcessAt(notBefore(time.Now().Add(w.Delay))))
	}
	if w.Retain > 0 {
		opts = append(opts, asynq.Retention(w.Retain))
	}
	_, err = c.c.EnqueueContext(ctx, asynq.NewTask(TypeRun, body), opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) && w.Retain > 0 {
		// A retained wake-up is the record that its cause ran. Within one
		// run, its cause is claimed once (SET NX), so a conflict with a
		// completed record is an earlier run under the same id, expired and
		// started afresh: the record is replaced, or the new run would
		// never be woken.
		return c.replaceCompleted(ctx, queue, w.ID, func() error {
			_, err := c.c.EnqueueContext(ctx, asynq.NewTask(TypeRun, body), opts...)
			return err
		})
	}
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil
	}
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		// asynq flattens go-redis's context error into text ("redis eval
		// error: context deadline exceeded"): keep ctx's in the chain, so
		// that callers can tell a deadline from Redis trouble.
		return fmt.Errorf("worker: enqueue %s: %w (%w)", w.ID, err, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("worker: enqueue %s: %w", w.ID, err)
	}
	return nil
}

// notBefore rounds t up to a whole second: asynq schedules at whole seconds,
// truncating, which would deliver a delayed wake-up up to a second early.
func notBefore(t time.Time) time.Time {
	if s := t.Truncate(time.Second); !s.Equal(t) {
		return s.Add(time.Second)
	}
	return t
}

// replaceCompleted deletes task id of queue if it is completed (retained)
// and enqueues it again; any other state of id means it is queued or
// running: nil.
func (c *Client) replaceCompleted(ctx context.Context, queue, id string, enqueue func() error) error {
	info, err := c.insp.GetTaskInfo(queue, id)
	if errors.Is(err, asynq.ErrTaskNotFound) {
		err, info = nil, nil // gone meanwhile: enqueue
	}
	if err != nil {
		return fmt.Errorf("worker: inspect %s: %w", id, err)
	}
	if info != nil {
		if info.State != asynq.TaskStateCompleted {
			return nil
		}
		if err := c.insp.DeleteTask(queue, id); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			return fmt.Errorf("worker: replace the completed record of %s: %w", id, err)
		}
	}
	if err := enqueue(); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("worker: enqueue %s: %w", id, err)
	}
	return nil
}

// mapSender is maptask.Sender under a name that keeps the embedded field
// unexported.
type mapSender = maptask.Sender

// mapTasks is the Client's map-task side (internal/maptask.Enqueuers): the
// element and rollback jobs of fan-out maps. mapstep reaches it through
// the embedded Sender; it is not part of the Client's API.
type mapTasks struct{ c *Client }

// EnqueueElement puts a map element task on its queue (its shard, with
// shards).
func (m mapTasks) EnqueueElement(ctx context.Context, t maptask.ElementTask) error {
	return m.c.enqueueElement(ctx, t)
}

// EnqueueRollback puts a map element rollback job on the queue.
func (m mapTasks) EnqueueRollback(ctx context.Context, t maptask.RollbackTask) error {
	return m.c.enqueueRollback(ctx, t)
}

// EnqueueElements puts a batch of element tasks on the queue, several at
// once (maptask.All).
func (m mapTasks) EnqueueElements(ctx context.Context, ts []maptask.ElementTask) error {
	return maptask.All(ctx, ts, m.c.enqueueElement)
}

// EnqueueRollbacks puts a batch of rollback jobs on the queue, several at
// once.
func (m mapTasks) EnqueueRollbacks(ctx context.Context, ts []maptask.RollbackTask) error {
	return maptask.All(ctx, ts, m.c.enqueueRollback)
}

func (c *Client) enqueueElement(ctx context.Context, t maptask.ElementTask) error {
	body, err := codec.Marshal(payload.ElementPayload{MapID: t.MapID, Index: t.Index, Input: t.Input, Meta: t.Meta, TP: traceparent(ctx)})
	if err != nil {
		return err
	}
	_, err = c.c.EnqueueContext(ctx, asynq.NewTask(TypeElement, body),
		asynq.TaskID(t.TaskID()), asynq.Queue(c.mapQueue(t.MapID, t.Index)), asynq.MaxRetry(DefaultMaxRetry), asynq.Timeout(DefaultTaskTimeout))
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("worker: enqueue %s: %w", t.TaskID(), err)
	}
	return nil
}

// enqueueElementWake delivers the task of map element w.RunID again (a
// continue, or the timer of the interrupt it is paused at): a task of the
// element's map that carries no metadata, so the job reads the map and
// resumes the element where it paused. Its id names the cause.
func (c *Client) enqueueElementWake(ctx context.Context, w reactor.Wake) error {
	mapID, index, ok := keys.SplitElementID(w.RunID)
	if !ok {
		return fmt.Errorf("worker: wake-up %s names no map element", w.ID)
	}
	i, err := strconv.Atoi(index)
	if err != nil {
		return fmt.Errorf("worker: wake-up %s: %w", w.ID, err)
	}
	t := maptask.ElementTask{MapID: mapID, Index: i, Redelivery: strings.TrimPrefix(w.ID, "resume:"+w.RunID+":")}
	body, err := codec.Marshal(payload.ElementPayload{MapID: t.MapID, Index: t.Index, TP: traceparent(ctx)})
	if err != nil {
		return err
	}
	opts := []asynq.Option{asynq.TaskID(t.TaskID()), asynq.Queue(c.mapQueue(t.MapID, t.Index)), asynq.MaxRetry(DefaultMaxRetry), asynq.Timeout(DefaultTaskTimeout)}
	if w.Delay > 0 {
		opts = append(opts, asynq.ProcessAt(notBefore(time.Now().Add(w.Delay))))
	}
	_, err = c.c.EnqueueContext(ctx, asynq.NewTask(TypeElement, body), opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("worker: enqueue %s: %w", t.TaskID(), err)
	}
	return nil
}

func (c *Client) enqueueRollback(ctx context.Context, t maptask.RollbackTask) error {
	body, err := codec.Marshal(payload.RollbackPayload{MapID: t.MapID, Gen: t.Gen, Pos: t.Pos, Index: t.Index,
		Meta: t.Meta, Fwd: t.Fwd, Total: t.Total, WA: t.WindowAt, TP: traceparent(ctx)})
	if err != nil {
		return err
	}
	// A rollback job goes to its element's shard (by index, not position):
	// every generation's job for an element, and the sweeper's lookup of
	// it, names the same queue.
	_, err = c.c.EnqueueContext(ctx, asynq.NewTask(TypeRollback, body),
		asynq.TaskID(t.TaskID()), asynq.Queue(c.mapQueue(t.MapID, t.Index)), asynq.MaxRetry(DefaultMaxRetry), asynq.Timeout(DefaultTaskTimeout))
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("worker: enqueue %s: %w", t.TaskID(), err)
	}
	return nil
}

// Close is a no-op kept for symmetry: the asynq client shares the Redis
// client it was given (close that yourself) and holds nothing else.
func (c *Client) Close() error { return nil }
