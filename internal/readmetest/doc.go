// Package readmetest compiles the Go snippets of the project's README, so the
// code a new user copies first is code that builds. The package itself is
// empty: its test lays the snippets over it (go build -overlay) with a
// prelude that declares what the snippets take as given (a stock service, a
// Redis client, a checkout definition).
package readmetest
