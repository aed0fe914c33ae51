// Package mapcore is the fan-out map's core: map steps, their element runs
// and element rollback jobs, the batch protocol (claims, settles, the
// owner's two-flag handshake), the results reader and the map sweeper's
// recovery.
//
// Users reach it through package mapstep, a facade generated from this
// package (internal/facadegen); plumbing.go holds the entry points worker
// and sweeper call, which mapstep does not re-export.
package mapcore
