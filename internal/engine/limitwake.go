package engine

import "sync"

// slotWaits are the attempts of this process waiting for a semaphore's
// slot: a release in this process wakes the first waiter of each tenant
// waiting for that semaphore (one for a plain limit, whose tenant is ""),
// which tries again at once instead of at its next poll. A release in
// another process wakes nobody here; the waiters' polls, backing off to
// 100 ms, find the room. A wake-up is a hint: the try decides.
type slotWaits struct {
	mu sync.Mutex
	q  map[string][]*slotWaiter
}

type slotWaiter struct {
	tenant string
	ch     chan struct{}
}

// wait registers a waiter for semaphore key on behalf of tenant; a
// wake-up is a send on ch (buffered, never blocking: a waiter already
// woken stays so). Call done with it when it stops waiting.
func (w *slotWaits) wait(key, tenant string, ch chan struct{}) *slotWaiter {
	sw := &slotWaiter{tenant: tenant, ch: ch}
	w.mu.Lock()
	if w.q == nil {
		w.q = map[string][]*slotWaiter{}
	}
	w.q[key] = append(w.q[key], sw)
	w.mu.Unlock()
	return sw
}

// done unregisters sw (woken or not).
func (w *slotWaits) done(key string, sw *slotWaiter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.q[key]
	for i, x := range q {
		if x == sw {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(w.q, key)
	} else {
		w.q[key] = q
	}
}

// wake wakes the first waiter of each tenant waiting for key, and takes
// them off the list.
func (w *slotWaits) wake(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.q[key]
	if len(q) == 0 {
		return
	}
	var seen map[string]bool
	rest := q[:0]
	for _, x := range q {
		if seen[x.tenant] {
			rest = append(rest, x)
			continue
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[x.tenant] = true
		select {
		case x.ch <- struct{}{}:
		default:
		}
	}
	clear(q[len(rest):])
	if len(rest) == 0 {
		delete(w.q, key)
	} else {
		w.q[key] = rest
	}
}
