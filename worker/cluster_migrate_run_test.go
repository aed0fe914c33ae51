package worker_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
)

// migrateRunSteps is the length of the chain TestClusterSlotMigrationMidRun
// runs while its slot moves.
const migrateRunSteps = 30

// An in-process run whose slot is migrated to another master while it
// runs finishes, every step run once. The slot is padded with keys of the
// run's hash tag so that it takes seconds to move: longer than the cluster
// client's own retries of a refused command last, which the store's writes
// wait out instead of failing the run. The steps go on while the slot
// moves: a checkpoint names only the run's state and lock, both present
// while the run is held, so Redis refuses it only while those two are split
// between the nodes; only the terminal write, which also expires the
// run's audit stream (absent: these steps audit nothing), waits for the end
// of the move.
func TestClusterSlotMigrationMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	addrs := redistest.StartCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: reactor.MinClusterRedirects})
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := redistest.Prefix(t)
	counts := prefix + ":counts" // its own slot, which does not move

	var once sync.Once
	started := make(chan struct{})
	var lastMu sync.Mutex
	var lastStep time.Time
	steps := make([]reactor.Part, 0, migrateRunSteps)
	for i := range migrateRunSteps {
		cfg := reactor.StepConfig[reactor.Args, int]{
			Run: func(ctx context.Context, _ reactor.Args) (int, error) {
				if i == 3 {
					once.Do(func() { close(started) })
				}
				time.Sleep(40 * time.Millisecond) // the step's work
				lastMu.Lock()
				lastStep = time.Now()
				lastMu.Unlock()
				return i, cc.HIncrBy(context.WithoutCancel(ctx), counts, "ran:"+strconv.Itoa(i), 1).Err()
			},
		}
		if i > 0 {
			cfg.After = []string{"s" + strconv.Itoa(i-1)}
		}
		steps = append(steps, reactor.Step("s"+strconv.Itoa(i), cfg))
	}
	def := reactor.MustDefine("migrate_run", steps...)
	eng, err := reactor.NewEngine(ctx, reactor.Config{Client: cc, Prefix: prefix, LockExpiry: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, eng.Register(def))

	// At rest, for the comparison.
	began := time.Now()
	res, err := eng.Run(ctx, def, nil, reactor.WithRunID("mr-0"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	atRest := time.Since(began)
	require.NoError(t, cc.Del(ctx, counts).Err())

	const runID = "mr-1"
	tag := prefix + ":{run:" + runID + "}"
	slot := int(cc.ClusterKeySlot(ctx, tag+":ctx").Val())
	// 1,500 keys of the run's slot: at migrateSlot's pace (5 keys per
	// 20 ms), six seconds of a half-moved slot.
	pipe := cc.Pipeline()
	for i := range 1500 {
		pipe.Set(ctx, fmt.Sprintf("%s:pad:%d", tag, i), "x", time.Hour)
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)

	var moved int
	var migrated sync.WaitGroup
	var migrateBegan, migrateEnded time.Time
	migrated.Go(func() {
		select {
		case <-started:
		case <-ctx.Done():
			return
		}
		migrateBegan = time.Now()
		moved = migrateSlot(t, ctx, addrs, tag+":ctx", slot)
		migrateEnded = time.Now()
	})
	began = time.Now()
	res, err = eng.Run(ctx, def, nil, reactor.WithRunID(runID))
	took := time.Since(began)
	migrated.Wait()
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	all := cc.HGetAll(ctx, counts).Val()
	for i := range migrateRunSteps {
		require.Equal(t, "1", all["ran:"+strconv.Itoa(i)], "step %d ran once", i)
	}
	require.Greater(t, moved, 1500)
	lastMu.Lock()
	stepsDone := lastStep.Sub(migrateBegan)
	lastMu.Unlock()
	migrateTook := migrateEnded.Sub(migrateBegan)
	t.Logf("a %d-step run: %s at rest, %s with its slot moved (%d keys in %s); its last step ended %s into the move",
		migrateRunSteps, atRest.Round(time.Millisecond), took.Round(time.Millisecond), moved, migrateTook.Round(time.Millisecond),
		stepsDone.Round(time.Millisecond))
	require.Less(t, stepsDone, migrateTook, "the steps went on while the slot moved")
}
