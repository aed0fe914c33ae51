package store

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterTransient reports whether err is Redis saying "not now" once
// go-redis's own redirects and retries ran out: a Redis Cluster slot being
// moved (TRYAGAIN for a script whose keys are split between the two nodes,
// MOVED, ASK) or a failover in progress (CLUSTERDOWN, MASTERDOWN, READONLY
// from a demoted master, LOADING from a restarted one). Each of those
// replies means the command did not run, so sending it again is safe.
func ClusterTransient(err error) bool {
	if err == nil {
		return false
	}
	if redis.IsTryAgainError(err) || redis.IsClusterDownError(err) || redis.IsMasterDownError(err) ||
		redis.IsReadOnlyError(err) || redis.IsLoadingError(err) {
		return true
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	_, ok := redis.IsAskError(err)
	return ok
}

// RideOutWait bounds how long a write waits out a cluster transition (see
// rideOut): longer than a failover takes with Redis's default
// cluster-node-timeout (15 s) and the replica's election.
const RideOutWait = 30 * time.Second

// rideOutPause is the base pause between two sends of a refused write;
// each pause is drawn from [rideOutPause, 2*rideOutPause).
const rideOutPause = 50 * time.Millisecond

// rideOut runs do until it returns anything but a cluster transition
// (ClusterTransient), pausing a short jittered while between sends, for at
// most RideOutWait or until ctx ends; then it returns the last error. The
// writes it wraps are fenced and resend-safe (a resend finds its own
// nonce), and a refused one did not run at all, so a resend is always
// safe. An in-process run has no queue to snooze on: without this, a
// checkpoint refused while its slot moves for longer than go-redis's retries
// last (a few seconds) would fail the run.
func rideOut(ctx context.Context, do func() error) error {
	var deadline time.Time
	for {
		err := do()
		if !ClusterTransient(err) {
			return err
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(RideOutWait)
		} else if now.After(deadline) {
			return err
		}
		t := time.NewTimer(rideOutPause + rand.N(rideOutPause))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}
