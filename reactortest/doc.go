// Package reactortest runs goreactor reactors in tests, against a real Redis.
//
// New gives a test a Harness: an Engine under a Redis key prefix of its own,
// a worker Client on an asynq queue of its own, and an in-process Worker
// pulling from that queue. The worker is stopped and the test's keys and
// queue are deleted in t.Cleanup, so parallel tests never see each other's
// runs or tasks.
//
//	func TestCheckoutRollsBack(t *testing.T) {
//		t.Parallel()
//		h := reactortest.New(t, checkout)
//		res, err := h.Run(context.Background(), checkout, map[string]any{"order": "o-1"})
//		if err != nil {
//			t.Fatal(err)
//		}
//		h.RequireStatus(t, res.RunID, reactor.StatusFailed)
//		h.RequireUndone(t, res.RunID, "charge", "reserve") // newest first
//	}
//
// Run hands the run to the worker, as Engine.Enqueue does in production, and
// waits for it to finish; RunInline executes it in the test's goroutine, as
// Engine.Run does. The Require methods read the stored run and fail the test
// with t.Fatalf, so call them from the test's goroutine.
//
// The Redis is the one REDIS_URL names (redis://host:port/db), else one
// listening on 127.0.0.1:6379, else a redis-server from PATH that is started
// once for the test binary. Stop that server when the tests are done by
// running them through Main:
//
//	func TestMain(m *testing.M) { reactortest.Main(m) }
package reactortest
