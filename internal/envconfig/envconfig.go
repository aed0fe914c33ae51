// Package envconfig is goreactor's one configuration of where its data
// lives: the key prefix (GOREACTOR_PREFIX) and the asynq queue
// (GOREACTOR_QUEUE). Every binary reads them through its flags (package
// envflag), and every library default reads them here, so a process whose
// code sets neither agrees with the binaries started in the same
// environment.
//
// Precedence, everywhere: an explicit setting (a Config field, a flag)
// wins; then the environment variable; then the built-in default
// ("goreactor" for both).
package envconfig

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/goreactor/goreactor/internal/keys"
)

// The environment variables of the one configuration.
const (
	// PrefixVar names the key prefix (reactor.Config.Prefix).
	PrefixVar = "GOREACTOR_PREFIX"
	// QueueVar names the asynq queues, "name[:priority],...": the first
	// is where goreactor's tasks are enqueued, all of them are served.
	QueueVar = "GOREACTOR_QUEUE"
	// ShardsVar names the number of shard queues of the first queue, over
	// which fan-out maps' element and rollback tasks are spread
	// (worker.ClientConfig.Shards); read by the binaries' -queue-shards.
	ShardsVar = "GOREACTOR_QUEUE_SHARDS"
)

// MaxShards is the most shard queues a queue may have: each shard is a
// queue every worker polls, and asynq's fetch tries the queues one by one.
const MaxShards = 64

// CheckShards refuses a shard count outside 1..MaxShards, saying what to
// set instead.
func CheckShards(n int) error {
	switch {
	case n < 1:
		return fmt.Errorf("%d shards: must be at least 1 (1: no shards, every task on the queue itself)", n)
	case n > MaxShards:
		return fmt.Errorf("%d shards: at most %d (every worker polls each shard queue)", n, MaxShards)
	}
	return nil
}

// DefaultQueue is the asynq queue used when neither a setting nor
// GOREACTOR_QUEUE names one.
const DefaultQueue = "goreactor"

// Prefix returns GOREACTOR_PREFIX, or keys.DefaultPrefix when it is unset or
// blank.
func Prefix() string { return PrefixFrom(os.Getenv) }

// PrefixFrom is Prefix reading through getenv.
func PrefixFrom(getenv func(string) string) string {
	if p := strings.TrimSpace(getenv(PrefixVar)); p != "" {
		return p
	}
	return keys.DefaultPrefix
}

// Queue returns the first queue named in GOREACTOR_QUEUE (its priority, if
// any, dropped), or DefaultQueue when it names none. It does not judge the
// rest of the list: the binaries that serve it (worker.Main) refuse a
// malformed one at startup.
func Queue() string { return QueueFrom(os.Getenv) }

// QueueFrom is Queue reading through getenv.
func QueueFrom(getenv func(string) string) string {
	for item := range strings.SplitSeq(getenv(QueueVar), ",") {
		if name, _, _ := strings.Cut(item, ":"); strings.TrimSpace(name) != "" {
			return strings.TrimSpace(name)
		}
	}
	return DefaultQueue
}

// ParseQueues parses a queue list, "name[:priority],..." (the value of
// -queue and GOREACTOR_QUEUE), into asynq's queue priorities (1 when a
// name has none) and returns the first name: where tasks are enqueued.
func ParseQueues(s string) (queues map[string]int, first string, err error) {
	queues = map[string]int{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, prio, hasPrio := strings.Cut(item, ":")
		name = strings.TrimSpace(name)
		p := 1
		if hasPrio {
			n, err := strconv.Atoi(strings.TrimSpace(prio))
			if err != nil || n < 1 {
				return nil, "", fmt.Errorf("queue %q: priority must be a positive integer", item)
			}
			p = n
		}
		if name == "" {
			return nil, "", fmt.Errorf("queue %q: empty name", item)
		}
		if _, dup := queues[name]; dup {
			return nil, "", fmt.Errorf("queue %q listed twice", name)
		}
		queues[name] = p
		if first == "" {
			first = name
		}
	}
	if first == "" {
		return nil, "", errors.New("no queue given")
	}
	return queues, first, nil
}

// QueueNames returns the names of a queue list parsed by ParseQueues, the
// first one first and the rest in the order given.
func QueueNames(s string) ([]string, error) {
	if _, _, err := ParseQueues(s); err != nil {
		return nil, err
	}
	var names []string
	for item := range strings.SplitSeq(s, ",") {
		if name, _, _ := strings.Cut(item, ":"); strings.TrimSpace(name) != "" {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names, nil
}
