package scrub

import (
	"context"
	"sync"
	"time"
)

// Limiter is a token bucket in bytes per second of chunk data checksummed.
//
// A checksum request's true cost is known only from its reply (the replica
// reads every chunk file of the copyset, and the reply lists only the chunks
// that are not all zeros), so the bucket may go into debt: Wait takes an
// estimate before the request, Charge adds what the estimate missed after it,
// and the next Wait pays the debt off before it lets anything through. Over
// any long stretch the bytes checksummed stay within rate × time + burst.
//
// A nil *Limiter, or one with a rate <= 0, never waits.
type Limiter struct {
	rate  float64 // bytes per second
	burst float64 // bucket size in bytes

	// now and sleep are the clock (tests replace them).
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error

	mu     sync.Mutex // guards tokens, last
	tokens float64    // may be negative (debt)
	last   time.Time
}

// NewLimiter returns a bucket of rate bytes per second holding at most burst
// bytes (burst <= 0: one second's worth). It starts full. rate <= 0 means
// unlimited.
func NewLimiter(rate, burst int64) *Limiter {
	if burst <= 0 {
		burst = rate
	}
	l := &Limiter{rate: float64(rate), burst: float64(burst), now: time.Now, sleep: sleepCtx}
	l.tokens = l.burst
	l.last = l.now()
	return l
}

// Wait takes n bytes from the bucket and returns once they are covered, or
// with ctx's error (the bytes stay taken: the caller is expected to stop).
func (l *Limiter) Wait(ctx context.Context, n int64) error {
	if l == nil || l.rate <= 0 {
		return ctx.Err()
	}
	l.mu.Lock()
	l.refillLocked()
	l.tokens -= float64(n)
	var d time.Duration
	if l.tokens < 0 {
		d = time.Duration(-l.tokens / l.rate * float64(time.Second))
	}
	l.mu.Unlock()
	if d <= 0 {
		return ctx.Err()
	}
	return l.sleep(ctx, d)
}

// Charge takes n more bytes (n < 0 gives some back) without waiting: the
// next Wait pays for them.
func (l *Limiter) Charge(n int64) {
	if l == nil || l.rate <= 0 || n == 0 {
		return
	}
	l.mu.Lock()
	l.refillLocked()
	l.tokens = min(l.tokens-float64(n), l.burst)
	l.mu.Unlock()
}

func (l *Limiter) refillLocked() {
	now := l.now()
	if el := now.Sub(l.last); el > 0 {
		l.tokens = min(l.burst, l.tokens+el.Seconds()*l.rate)
	}
	l.last = now
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
