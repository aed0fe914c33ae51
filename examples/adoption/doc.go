// Package adoption is what a team adopting goreactor writes, kept as a test:
// an order saga, a typed fan-out map, their own worker from the public entry
// point, the run-context accessors and the per-call options, through the
// public API only. Its test fails if any of it imports an internal package.
package adoption
