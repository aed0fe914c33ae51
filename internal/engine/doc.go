// Package engine is goreactor's engine core: definitions, the executor, the
// rollback and its ledger, guarded undo, versioned definitions, the run's
// stored state and its fenced writes.
//
// Users reach it through package reactor, a facade generated from this
// package (internal/facadegen): every exported identifier here is
// re-exported there under the same name, except those declared in
// plumbing*.go, which are for goreactor's own packages (mapstep, worker,
// sweeper, dashboard) and are package-level functions so that no alias
// carries them as methods. This package imports no public goreactor package
// except the leaf package fingerprint.
package engine
