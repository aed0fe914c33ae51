// Package mapstep implements map steps: one element reactor run per item of
// a collection, either inline (one after another in the process executing
// the map) or fanned out (one asynq task per element, dispatched in
// back-pressured batches).
//
// A fan-out map decides, saves, then acts: the owner saves its map id with
// its run state, a start script creates the map's metadata and claims batch
// 0 only if it created it, and only then are the first B element tasks
// enqueued. When the element at position k*B-1-B/2 settles (half a batch
// before the batch's end, so workers do not idle at batch boundaries), its
// settle script claims the next batch by compare-and-set on the absolute
// offset, so a duplicate trigger claims nothing, and no single action
// enqueues more than B tasks. The settle that stores the last outcome of a settled map claims
// the owner signal (SET NX) and enqueues the owner's resume exactly once; the
// owner re-enters the map step and adopts the outcome.
//
// Element runs have the id "<mapID>.<i>" and keep their own state, ledger
// and lock in their own cluster slot; a re-dispatched element resumes its one
// run. The owner's ledger entry for a map carries only the map id.
package mapstep
