package frontend

import (
	"context"
	"time"
)

// Size watches. A volume may grow while it is attached (a resize). The
// protocols that tell a host so — iSCSI's CAPACITY DATA HAS CHANGED unit
// attention, NVMe's Namespace Attribute Changed notice — subscribe to the
// volume's size with WatchSize; Exports runs one watcher per watched name,
// however many sessions and controllers subscribe, and re-reads the size
// every ExportsConfig.SizeCheck:
//
//   - from the export's open backend (Backend.Check re-reads it, then
//     Backend.Info), so every attachment of it sees the new size;
//   - when no backend of the name is open (an NVMe multipath controller
//     attaches at its first I/O command), from the metadata (Opener.Stat).
//
// A re-read that fails (a fenced backend, an MDS that is away) is skipped:
// the next tick tries again.

// sizeWatch is the one watcher of a name; its subscribers are guarded by
// Exports.mu.
type sizeWatch struct {
	name string
	subs map[*sizeSub]bool
	stop chan struct{} // closed when the last subscriber left or Exports closed
}

// sizeSub is one subscription. fn may be nil: the subscriber only wants the
// open backend's size kept fresh (it reads Backend.Info itself).
type sizeSub struct{ fn func(size int64) }

// WatchSize subscribes fn to the named export's size: fn is called, on the
// watcher's goroutine, with the size after every successful re-read (every
// ExportsConfig.SizeCheck), whether it changed or not; it must not block.
// Volumes only grow: a subscriber compares with what it announced. fn may be
// nil (see sizeSub). The returned stop ends the subscription (it may be
// called more than once); the last one ends the watcher. With SizeCheck
// negative, or after Close, nothing is watched.
func (e *Exports) WatchSize(name string, fn func(size int64)) (stop func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sizeCheck <= 0 || e.closing {
		return func() {}
	}
	w := e.watches[name]
	if w == nil {
		w = &sizeWatch{name: name, subs: map[*sizeSub]bool{}, stop: make(chan struct{})}
		e.watches[name] = w
		go e.watchSize(w)
	}
	sub := &sizeSub{fn: fn}
	w.subs[sub] = true
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if !w.subs[sub] {
			return
		}
		delete(w.subs, sub)
		if len(w.subs) == 0 && e.watches[name] == w {
			delete(e.watches, name)
			close(w.stop)
		}
	}
}

// watchSize is w's goroutine: it re-reads the size every SizeCheck until w
// stops.
func (e *Exports) watchSize(w *sizeWatch) {
	t := time.NewTicker(e.sizeCheck)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		size, ok := e.readSize(w.name)
		if !ok {
			continue
		}
		e.mu.Lock()
		fns := make([]func(int64), 0, len(w.subs))
		for sub := range w.subs {
			if sub.fn != nil {
				fns = append(fns, sub.fn)
			}
		}
		e.mu.Unlock()
		for _, fn := range fns {
			fn(size)
		}
	}
}

// readSize re-reads the named export's size: from its open backend, or from
// the metadata when none is open. ok is false when it cannot be known now.
func (e *Exports) readSize(name string) (size int64, ok bool) {
	e.mu.Lock()
	var b Backend
	if x := e.current[name]; x != nil && x.done && x.err == nil && !x.closed {
		b = x.b
	}
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(e.ctx, min(e.sizeCheck, 10*time.Second))
	defer cancel()
	if b != nil {
		// The backend may be closed meanwhile (its last attachment
		// detached): Check then fails or reads a size nobody uses.
		if err := b.Check(ctx); err != nil {
			e.log.Debug("re-reading an export's size failed", "export", name, "err", err)
			return 0, false
		}
		return b.Info().Size, true
	}
	info, err := e.opener.Stat(ctx, name)
	if err != nil {
		e.log.Debug("re-reading an export's size from its metadata failed", "export", name, "err", err)
		return 0, false
	}
	return info.Size, true
}
