package engine

import "time"

// Retention is how long a finished run stays in Redis (Config.Retention):
// the sweeper trims the listing indexes of runs older than that.
func (e *Engine) retention() time.Duration { return e.cfg.Retention }
