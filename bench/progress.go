package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// bar draws a progress bar for a long phase on stderr. On a terminal it is
// redrawn in place; elsewhere (a log, CI) each phase prints one line when it
// ends. It is silent when off (-json).
type bar struct {
	w   io.Writer
	on  bool
	tty bool
}

func newBar(w io.Writer, on bool) *bar {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil {
			tty = st.Mode()&os.ModeCharDevice != 0
		}
	}
	return &bar{w: w, on: on, tty: tty}
}

const (
	barEvery = 200 * time.Millisecond
	barWidth = 30
)

// track shows label's progress as read reports it (a phase name, done,
// total) until the returned function is called.
func (b *bar) track(label string, read func(context.Context) (phase string, done, total int)) (stop func()) {
	if !b.on {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	var wg sync.WaitGroup
	draw := func(final bool) {
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		phase, done, total := read(rctx)
		rcancel()
		elapsed := time.Since(start).Seconds()
		if !b.tty {
			if final {
				fmt.Fprintf(b.w, "  %-34s %6.1fs\n", label, elapsed)
			}
			return
		}
		filled := 0
		if total > 0 {
			filled = min(barWidth, done*barWidth/total)
		}
		line := fmt.Sprintf("  %-34s %-8s [%s%s] %7d/%-7d %6.1fs", label, phase,
			strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled), done, total, elapsed)
		if final {
			fmt.Fprintf(b.w, "\r%s\n", line)
		} else {
			fmt.Fprintf(b.w, "\r%s", line)
		}
	}
	wg.Go(func() {
		t := time.NewTicker(barEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				draw(false)
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			draw(true)
		})
	}
}

// note prints a line between phases (not with -json).
func (b *bar) note(format string, args ...any) {
	if b.on {
		fmt.Fprintf(b.w, format+"\n", args...)
	}
}
