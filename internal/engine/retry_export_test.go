package engine

// SetRetryAfterRecord sets the failpoint between a retry's record on the
// original and its creation (nil clears it).
func SetRetryAfterRecord(f func(id string) error) { retryAfterRecord = f }
