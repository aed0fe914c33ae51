// Package sweeper recovers work that a crash lost. The run sweeper wakes
// runs whose worker died; the map passes join it with the map steps.
package sweeper
