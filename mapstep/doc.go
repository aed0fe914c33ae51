// Package mapstep adds map steps to reactors: a step that runs one element
// reactor per item of a collection, inline (one after another where the map
// runs) or fanned out (one worker task per element).
//
//	mapstep.Map("pack_all", mapstep.Config{
//		Element: PackParcel,                   // a reactor, run once per item
//		Items:   reactor.FromInput("parcels"), // or Pages, for a Source too big to hold
//		Input:   "parcel",                     // the element reactor's input for the item
//		FanOut:  true,                         // default inline
//	})
//
// An inline map needs nothing more than its owner's process. A fanned-out
// map needs workers: its element tasks, rollback jobs and the owner's resume
// go to the queue of the engine's Enqueuer (a worker.Client), so a worker
// (worker.Main) given the owner's definition must serve that queue
// (registering a definition registers its element reactors too). engine.Run of a reactor with a fan-out map waits
// for those workers to finish the run.
//
// A later step takes the map's result as a Results[T] field, T being what the
// element reactor returns (Define refuses a mismatch), and reads it lazily in
// index order: Values, All, or the Elements iterator. ProgressOf and
// RollbackProgressOf report where a map and its rollback stand.
//
// Guarantees:
//
//   - Back pressure: no single action enqueues more than BatchSize element
//     tasks (default 50); the next batch is claimed by compare-and-set when
//     the element half a batch before the current batch's end settles, so a
//     duplicate claims nothing and workers do not idle between batches.
//   - Exactly one owner resume: the settle that completes the map claims the
//     owner's signal and resumes it once; the owner adopts the outcome.
//   - Atomic by default: the first element failure fails the map, no further
//     batch is claimed, and every element that completed is undone. Partial
//     completes the map with each element's outcome instead.
//   - A map rolls back the way it ran: inline in the owner's process, or one
//     rollback job per element, newest first, in batches, each saving after
//     every undone entry; inline and fan-out maps end with the same Failure.
//   - A re-triggered rollback (reactor.Engine.RetryRollback) starts a new
//     rollback generation over the elements the previous one could not undo
//     (outcome failed, element_in_flight or context_unavailable), with fresh
//     keys and task ids; each of those elements retries only its own failed
//     entries, and the earlier generations' outcomes stay readable.
//   - Every element run has the id "<mapID>.<i>" (MapID, ElementID) and its
//     own state and lock in its own Redis Cluster slot; a redelivered element
//     resumes its one run. The owner stores only the map's id, whatever its
//     size, and the map's keys and element runs expire with the owner.
//
// The repository's docs/maps.md is the reference: back pressure, the
// rollback protocol, and what each outcome means.
//go:generate go run ../internal/facadegen -src ../internal/mapcore -import github.com/goreactor/goreactor/internal/mapcore -pkg mapstep -rename github.com/goreactor/goreactor/internal/engine=github.com/goreactor/goreactor/reactor -out api.go

package mapstep
