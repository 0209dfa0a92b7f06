package wal

import (
	"errors"
	"fmt"
	"io"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
)

// maxKeptBuffer bounds the batch buffer capacity kept for reuse.
const maxKeptBuffer = 4 << 20

// errIgnore tells enqueue that there is nothing to write and nothing wrong.
var errIgnore = errors.New("wal: nothing to do")

// op is one in-memory effect of a batch, applied once the batch is durable.
type op struct {
	kind  byte // a record type
	group uint64
	start int // offset of the record within the batch buffer
	ents  []*pb.Entry
	hs    hardState
	snap  *snapRecord
}

// batch collects everything handed to Save (and friends) while the previous
// batch is being written and synced.
type batch struct {
	buf   []byte
	refs  []dataRef // entry data written from the entries (gaps in buf)
	ops   []op
	saves int
	sync  bool          // some record of the batch must be durable before its waiters return
	res   *result       // fresh for every batch: waiters keep it after buf is reused
	dones []func(error) // SaveAsync callbacks, in call order
	since time.Time     // when its first call was queued (Stalled)
}

// result is how a batch's waiters learn its outcome: err is written before
// done is closed.
type result struct {
	done chan struct{}
	err  error
}

func newResult() *result { return &result{done: make(chan struct{})} }

// enqueue adds records to the pending batch through encode (which appends
// to buf and ops). With done nil it waits until the batch is durable;
// otherwise it returns at once and the committer calls done, in call order.
// An error (closed or failed WAL, invalid input) is returned, not handed to
// done.
func (w *WAL) enqueue(encode func(b *batch) error, done func(error)) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	b := w.pending
	mark, nops, nrefs := len(b.buf), len(b.ops), len(b.refs)
	if err := encode(b); err != nil {
		b.buf, b.ops, b.refs = b.buf[:mark], b.ops[:nops], b.refs[:nrefs]
		if err != errIgnore || done == nil {
			w.mu.Unlock()
			if err == errIgnore {
				err = nil
			}
			return err
		}
	}
	if len(b.ops) == nops && done == nil {
		// Nothing to write (a Ready with no HardState, entries or
		// snapshot): nothing to wait for. (An async caller still queues its
		// callback: it must come after those of its earlier Saves.)
		w.mu.Unlock()
		return nil
	}
	if b.saves == 0 && len(b.dones) == 0 {
		b.since = time.Now()
	}
	b.saves++
	res := b.res
	if done != nil {
		b.dones = append(b.dones, done)
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	if done != nil {
		return nil
	}
	<-res.done
	return res.err
}

// encodeUpdates returns the encoder of Save and SaveAsync.
func (w *WAL) encodeUpdates(updates []Update) func(b *batch) error {
	return func(b *batch) error {
		defer clear(w.lastScratch)
		for i := range updates {
			if err := w.validateLocked(&updates[i]); err != nil {
				return err
			}
		}
		for id, last := range w.lastScratch {
			g := w.groupLocked(id)
			g.queuedLast, g.queued = last, true
		}
		for i := range updates {
			u := &updates[i]
			if !u.NoSync || len(u.Entries) > 0 || !raft.IsEmptySnap(u.Snapshot) {
				b.sync = true
			}
			if newerSnapshot(w.groupLocked(u.Group), u.Snapshot) {
				md := u.Snapshot.GetMetadata()
				sr := &snapRecord{
					group: u.Group, flags: snapFlagReset,
					index: md.GetIndex(), term: md.GetTerm(),
					compactIndex: md.GetIndex(), compactTerm: md.GetTerm(),
					conf: md.GetConfState(), data: u.Snapshot.GetData(),
				}
				b.ops = append(b.ops, op{kind: recSnapshot, group: u.Group, start: len(b.buf), snap: sr})
				b.buf = appendSnapshot(b.buf, sr)
			}
			// Entries go into records of at most entriesRecordMax bytes.
			for ents := u.Entries; len(ents) > 0; {
				n, size := 0, entriesHeadSize
				for n < len(ents) && (n == 0 || size+entryHeadSize+maxEntryPad+len(ents[n].Data) <= entriesRecordMax) {
					size += entryHeadSize + maxEntryPad + len(ents[n].Data)
					n++
				}
				b.ops = append(b.ops, op{kind: recEntries, group: u.Group, start: len(b.buf), ents: ents[:n]})
				b.buf = appendEntries(b.buf, u.Group, ents[:n], &b.refs)
				ents = ents[n:]
			}
			if !raft.IsEmptyHardState(u.HardState) {
				hs := hardState{u.HardState.GetTerm(), u.HardState.GetVote(), u.HardState.GetCommit()}
				b.ops = append(b.ops, op{kind: recHardState, group: u.Group, start: len(b.buf), hs: hs})
				b.buf = appendHardState(b.buf, u.Group, hs)
			}
		}
		return nil
	}
}

// newerSnapshot reports whether snap is a snapshot newer than g's. An older
// one (raft never sends one, but a host may race with CreateSnapshot) is
// ignored, as raft.MemoryStorage.ApplySnapshot refuses it.
func newerSnapshot(g *group, snap *pb.Snapshot) bool {
	return !raft.IsEmptySnap(snap) && snap.GetMetadata().GetIndex() > g.snapIndex()
}

// validateLocked checks one update against the group's log as the earlier
// updates of the same Save leave it (w.lastScratch).
func (w *WAL) validateLocked(u *Update) error {
	g := w.groupLocked(u.Group)
	last, ok := w.lastScratch[u.Group]
	if !ok {
		last = g.nextAfter()
	}
	if newerSnapshot(g, u.Snapshot) {
		last = u.Snapshot.GetMetadata().GetIndex()
	}
	if len(u.Entries) > 0 {
		w.lastScratch[u.Group] = u.Entries[len(u.Entries)-1].GetIndex()
	} else {
		w.lastScratch[u.Group] = last
	}
	if len(u.Entries) == 0 {
		return nil
	}
	first := u.Entries[0].GetIndex()
	for i, e := range u.Entries {
		if e.GetIndex() != first+uint64(i) {
			return fmt.Errorf("%w: group %d: index %d after %d", ErrNonContiguous, u.Group, e.GetIndex(), first+uint64(i)-1)
		}
	}
	if first == 0 || first > last+1 {
		return fmt.Errorf("%w: group %d: first %d, last %d", ErrGap, u.Group, first, last)
	}
	for _, e := range u.Entries {
		if len(e.Data) > entriesRecordMax-entriesHeadSize-entryHeadSize-maxEntryPad {
			return fmt.Errorf("%w: group %d: entry %d has %d bytes", ErrTooLarge, u.Group, e.GetIndex(), len(e.Data))
		}
	}
	return nil
}

// committer is the one goroutine that writes and syncs. It owns the active
// segment's write offset between taking a batch and applying it.
func (w *WAL) committer() {
	defer close(w.stopped)
	for {
		select {
		case <-w.kick:
			w.commitPending()
		case <-w.quit:
			// Close set w.closed first, so nothing is enqueued any more;
			// finish what is queued, then fail nothing: no batch is left.
			w.commitPending()
			return
		}
	}
}

// commitPending takes the pending batch, if any, writes and syncs it, applies
// it to the in-memory state and releases its waiters.
func (w *WAL) commitPending() {
	w.mu.Lock()
	b := w.pending
	if len(b.ops) == 0 && len(b.dones) == 0 {
		w.mu.Unlock()
		return
	}
	next := w.spare
	next.buf, next.ops, next.saves, next.sync = next.buf[:0], next.ops[:0], 0, false
	next.refs = next.refs[:0]
	next.dones = next.dones[:0]
	next.res = newResult()
	next.since = time.Time{}
	w.pending = next
	w.committing = b
	failed := w.err
	w.mu.Unlock()

	err := failed
	if err == nil && len(b.ops) > 0 { // else only SaveAsync callbacks, to call in order
		err = w.commit(b)
	}

	var doomed []*segment
	w.mu.Lock()
	switch {
	case failed != nil:
		b.res.err = failed
	case err != nil:
		w.err = fmt.Errorf("%w: %w", ErrFailed, err)
		w.log.Error("wal: write failed; refusing further writes", "err", err)
		b.res.err = w.err
	default:
		w.applyLocked(b)
		doomed = w.detachSegmentsLocked()
	}
	w.committing = nil
	w.mu.Unlock()
	close(b.res.done)
	for _, done := range b.dones {
		done(b.res.err)
	}
	clear(b.dones)
	if doomed != nil {
		w.deleteSegments(doomed)
	}
	if err == nil {
		w.maybePrepareSpare()
	}
	for i := range b.ops {
		b.ops[i] = op{} // drop references to the callers' entries
	}
	clear(b.refs)
	if cap(b.buf) > maxKeptBuffer {
		b.buf = nil // a huge batch: do not keep its buffer for ever
	}
	w.mu.Lock()
	w.spare = b
	w.mu.Unlock()
	if failed == nil && err != nil {
		// Waiters that queued meanwhile must not wait for a kick.
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// commit writes b into the active segment (rolling over first if it does not
// fit) and syncs it.
func (w *WAL) commit(b *batch) error {
	w.mu.Lock()
	active := w.segs[len(w.segs)-1]
	off := w.writeOff
	w.mu.Unlock()
	size := int64(batchSize(b.buf, b.refs))
	need := size + batchRecordSize
	if len(b.refs) > 0 {
		need += dioAlign + minPadRecord // a pad record may go first
	}
	if off+need > w.cfg.SegmentSize && off > segHeaderSize {
		if w.unsynced {
			// A segment is complete and durable before the next one exists:
			// recovery reads a torn tail only in the last segment.
			if err := unix.Fdatasync(int(active.f.Fd())); err != nil {
				return err
			}
			w.unsynced = false
		}
		var err error
		if active, off, err = w.rollover(active, need); err != nil {
			return err
		}
		w.synced = off // createSegment synced the header and checkpoint
	}
	// The batch record goes first: how far the segment is durable (see
	// doc.go, Open and repair). A batch with entry data to write from the
	// entries starts on a dioAlign boundary, as appendEntries' padding
	// assumed: a pad record follows if need be.
	pre := appendBatch(w.preBuf[:0], w.synced)
	if len(b.refs) > 0 {
		if n := padBefore(off + int64(len(pre))); n > 0 {
			pre = appendPad(pre, n)
		}
	}
	sealRecords(pre, nil, active.seq)
	w.preBuf = pre
	sealRecords(b.buf, b.refs, active.seq)
	size += int64(len(pre))
	wstart := time.Now()
	if err := w.writePages(active, off, pre, b.buf, b.refs); err != nil {
		return err
	}
	wdone := time.Now()
	if w.knobs.AfterWrite != nil {
		w.knobs.AfterWrite()
	}
	if !b.sync {
		// Only NoSync updates (commit-index HardStates): written, not synced.
		if w.cfg.OnCommit != nil {
			w.cfg.OnCommit(wdone.Sub(wstart), 0, int(size))
		}
		w.unsynced = true
		w.mu.Lock()
		w.writeOff = off + size
		w.stats.UnsyncedWrites++
		w.stats.Saves += uint64(b.saves)
		w.stats.Bytes += uint64(size)
		w.mu.Unlock()
		return nil
	}
	if w.knobs.BeforeSync != nil {
		if err := w.knobs.BeforeSync(); err != nil {
			return err
		}
	}
	start := time.Now()
	if w.knobs.SyncDelay > 0 {
		time.Sleep(w.knobs.SyncDelay)
	}
	if err := unix.Fdatasync(int(active.f.Fd())); err != nil {
		return err
	}
	lat := time.Since(start)
	w.unsynced = false
	w.synced = off + size
	if w.knobs.AfterSync != nil {
		w.knobs.AfterSync()
	}
	if w.cfg.OnCommit != nil {
		w.cfg.OnCommit(wdone.Sub(wstart), lat, int(size))
	}
	w.mu.Lock()
	w.writeOff = off + size
	w.stats.Syncs++
	w.stats.Saves += uint64(b.saves)
	w.stats.Bytes += uint64(size)
	w.stats.SyncTime += lat
	w.stats.MaxSyncTime = max(w.stats.MaxSyncTime, lat)
	w.stats.MaxBatchSaves = max(w.stats.MaxBatchSaves, b.saves)
	w.mu.Unlock()
	return nil
}

// writePages writes pre and the batch (buf with the data of refs) at off in
// s as whole pages: it writes the start of off's page again (the same bytes,
// so a torn write cannot damage them) and pads the end with zeros. A write of
// whole pages never makes the kernel read a page in first, which every append
// into an uncached page would cost (the pages of a preallocated or recycled
// segment are not in the page cache).
func (w *WAL) writePages(s *segment, off int64, pre, buf []byte, refs []dataRef) error {
	head := w.tailPage
	if int64(len(head)) != off-roundDown(off) {
		panic(fmt.Sprintf("wal: tail page holds %d bytes at offset %d", len(head), off))
	}
	size := batchSize(buf, refs)
	end := off + int64(len(pre)+size)
	zeros := zeroPage[:roundUp(end)-end]
	iov := batchIOV(append(w.iov[:0], head, pre), buf, refs)
	w.iov = iov
	defer clear(iov) // keep no references to the entries
	// The next write starts with the last page's bytes so far.
	tail := appendTail(w.tailSpare[:0], iov, int(end-roundDown(end)))
	written := false
	var err error
	if size >= directMinBytes {
		written, err = w.direct.write(s, off-int64(len(head)), pageWrite{head: head, pre: pre, buf: buf, refs: refs, zeros: len(zeros)})
	}
	if !written && err == nil {
		err = pwritevFull(int(s.f.Fd()), append(iov, zeros), off-int64(len(head)))
	}
	if err != nil {
		return err
	}
	w.tailPage, w.tailSpare = tail, w.tailPage
	return nil
}

// maxIOV is the most pieces one pwritev takes (IOV_MAX).
const maxIOV = 1024

// pwritevFull writes all of iov at off (maxIOV pieces at a time). iov's
// pieces are consumed.
func pwritevFull(fd int, iov [][]byte, off int64) error {
	for len(iov) > 0 {
		n, err := unix.Pwritev(fd, iov[:min(len(iov), maxIOV)], off)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		off += int64(n)
		for len(iov) > 0 && n >= len(iov[0]) {
			n -= len(iov[0])
			iov = iov[1:]
		}
		if len(iov) > 0 {
			iov[0] = iov[0][n:]
		}
	}
	return nil
}

// applyLocked applies a durable batch to the in-memory state.
func (w *WAL) applyLocked(b *batch) {
	s := w.segs[len(w.segs)-1]
	base := w.writeOff - int64(batchSize(b.buf, b.refs))
	cache := w.cfg.CacheBytes
	shift := int64(0) // the batch's bytes before b.buf[at] that are not in b.buf
	for i := range b.ops {
		o := &b.ops[i]
		switch o.kind {
		case recEntries:
			g := w.groupLocked(o.group)
			first := o.ents[0].GetIndex()
			skip := g.prepareAppend(first)
			at := o.start + recHeaderSize + entriesHeadSize // in b.buf
			for j, e := range o.ents {
				at += entryHeadSize
				byRef := b.buf[at-5]&entryPadded != 0 // the type byte, before the data length
				if byRef {
					at += padCountSize + int(le.Uint16(b.buf[at:]))
				}
				if uint64(j) >= skip {
					loc := entryLoc{term: e.GetTerm(), seg: s.seq, off: base + shift + int64(at), size: uint32(len(e.Data)),
						typ: e.GetType(), hasData: e.Data != nil}
					g.appendLoc(loc, e, cache)
				}
				if byRef {
					shift += int64(len(e.Data)) // a dataRef: not in b.buf
				} else {
					at += len(e.Data)
				}
			}
			if last := first + uint64(len(o.ents)) - 1; last > s.maxIdx[o.group] {
				s.maxIdx[o.group] = last
			}
			w.stats.Entries += uint64(len(o.ents))
		case recHardState:
			g := w.groupLocked(o.group)
			g.hs, g.hsSet = o.hs, true
		case recSnapshot:
			w.groupLocked(o.snap.group).applySnapshot(o.snap)
		case recGroupRemoved:
			w.dropGroupLocked(o.group)
		}
	}
}
