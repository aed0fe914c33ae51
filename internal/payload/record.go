package payload

import (
	"strconv"
	"time"
)

// WorkerRecord is what a running worker publishes about itself beside
// asynq's server record, at keys.Worker(<asynq server id>): asynq's record
// names the process and its queues, this one which goreactor it runs. It
// is a Redis hash with one field per struct field (RecordFields).
type WorkerRecord struct {
	// Version is goreactor's version in the worker (internal/version).
	Version string
	// Prefix is the worker's engine's key prefix.
	Prefix string
	// Host and PID are the process's, as asynq records them.
	Host string
	PID  int
	// Started is when the worker started.
	Started time.Time
}

// The hash fields of a WorkerRecord.
const (
	recVersion = "version"
	recPrefix  = "prefix"
	recHost    = "host"
	recPID     = "pid"
	recStarted = "started"
)

// Fields returns r as the hash's fields (HSET's argument).
func (r WorkerRecord) Fields() map[string]any {
	return map[string]any{recVersion: r.Version, recPrefix: r.Prefix, recHost: r.Host,
		recPID: strconv.Itoa(r.PID), recStarted: r.Started.UTC().Format(time.RFC3339Nano)}
}

// ParseWorkerRecord reads a record from its hash (HGETALL's answer); ok is
// false for an empty hash (no record) or one without a version.
func ParseWorkerRecord(h map[string]string) (r WorkerRecord, ok bool) {
	if h[recVersion] == "" {
		return WorkerRecord{}, false
	}
	r = WorkerRecord{Version: h[recVersion], Prefix: h[recPrefix], Host: h[recHost]}
	r.PID, _ = strconv.Atoi(h[recPID])
	r.Started, _ = time.Parse(time.RFC3339Nano, h[recStarted])
	return r, true
}
