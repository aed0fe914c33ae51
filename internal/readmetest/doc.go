// Package readmetest keeps the code of the project's README and docs/*.md
// true. The package itself is empty: its tests lay every Go snippet of those
// pages over it (go vet -overlay) with a prelude that declares what the
// snippets take as given (a stock service, a Redis client, a checkout
// definition), and check every excerpt of a repository file (a block whose
// first line names the file, as the README's first service does) against
// the file, line for line. A block fenced as "```go sketch" (an outline with
// parts left out, such as docs/deploys.md's) is shown, not checked.
package readmetest
