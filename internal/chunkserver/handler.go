package chunkserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basalt-storage/basalt/internal/bufpool"
	"github.com/basalt-storage/basalt/internal/capability"
	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/raftnet"
	"github.com/basalt-storage/basalt/internal/raftstore"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// raftHost is what the data plane needs of the multi-Raft host
// (*raftstore.Host implements it).
type raftHost interface {
	Propose(id uint64, data []byte, done func(error))
	ReadBarrier(id uint64, done func(error))
	// ReadBarrierTerm and ProposeInTerm serve compare-and-write (caw.go).
	ReadBarrierTerm(id uint64, done func(term uint64, err error))
	ProposeInTerm(id uint64, data []byte, term uint64, done func(error))
}

// replicaStore is a copyset's chunk files as the data plane sees them.
type replicaStore interface {
	chunkStore
	// ReadAtCached reads from the page cache only, false when it would wait
	// for the disk (datastore.Copyset.ReadAtCached).
	ReadAtCached(id chunkID, p []byte, off int64) (bool, error)
	Chunks() ([]chunkID, error)
	Checksum(id chunkID) (uint32, error)
	// DataExtents reports which of a chunk's range holds data
	// (datastore.Copyset.DataExtents).
	DataExtents(id chunkID, off, n int64, fn func(off, n int64)) error
}

// replica is one copyset hosted by this chunkserver.
type replica struct {
	group     uint64
	chunkSize int64
	sm        *stateMachine
	store     replicaStore
	// gate orders the writes this replica proposes against its
	// compare-and-writes (gate.go, caw.go).
	gate writeGate
}

// peerHandler is the inbound peer transport (*raftnet.Receiver).
type peerHandler interface {
	transport.Handler
	transport.PayloadAllocator
}

// handler is the data-plane transport.Handler: it validates every request at
// the edge (STYLE 6) and turns it into a Raft proposal or a local read.
type handler struct {
	log     *slog.Logger
	ctx     context.Context // ends when the chunkserver stops
	vols    *volumeCache
	host    raftHost
	replica func(group uint64) *replica
	// peerIn serves the peer traffic: OpRaft and OpSnapshot frames.
	peerIn  peerHandler
	metrics *metrics
	stats   *ioStats // heartbeat counters; nil in tests

	missWG sync.WaitGroup // goroutines waiting on a volume-cache refresh

	lastDenied atomic.Int64 // unix ns of the last "request refused" log line
	// caps verifies session capabilities (the MDS's keys, from heartbeats);
	// nil: none known (tests without an MDS).
	caps *capability.Keys

	// checksums bounds the checksum requests in flight (each reads every
	// chunk of a copyset).
	checksums checksumLimiter
	// beforeChecksum, when set (tests), runs before a checksum is computed.
	// Atomic: a test sets it while the server runs, and the race detector
	// sees no order through the socket.
	beforeChecksum atomic.Pointer[func()]
}

// Checksum requests in flight, at most: per identity (per connection on an
// unauthenticated data plane) and in all. More are answered BUSY at once
// (the scrub tries again on its next pass; tools retry).
const (
	maxChecksumsPerPeer = 2
	maxChecksums        = 8
)

// checksumLimiter counts the checksum requests in flight; its zero value is
// ready.
type checksumLimiter struct {
	mu    sync.Mutex
	per   map[string]int
	total int
}

func (l *checksumLimiter) acquire(who string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= maxChecksums || l.per[who] >= maxChecksumsPerPeer {
		return false
	}
	if l.per == nil {
		l.per = map[string]int{}
	}
	l.per[who]++
	l.total++
	return true
}

func (l *checksumLimiter) release(who string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.per[who]--; l.per[who] <= 0 {
		delete(l.per, who)
	}
}

// attachments are the capabilities attached to one connection, by volume
// (transport.ConnState).
type attachments struct {
	mu   sync.Mutex
	caps map[uint64]capability.Capability
}

// attach takes a session capability for h.Volume on this connection
// (OpAttach). An unauthenticated data plane (an --insecure cluster) needs
// none and takes any; otherwise the token must verify with one of the MDS's
// keys and name h.Volume. Without the keys yet (no heartbeat answered) the
// answer is BUSY: the client retries.
func (hd *handler) attach(rw transport.ReplyWriter, h api.Header, token []byte) {
	if _, ok := transport.PeerOf(rw); !ok {
		hd.reply(rw, h, api.StatusOK, 0)
		return
	}
	cs, ok := rw.(transport.ConnState)
	if !ok {
		hd.reply(rw, h, api.StatusDenied, 0)
		return
	}
	if hd.caps == nil || !hd.caps.Known() {
		hd.reply(rw, h, api.StatusBusy, 0)
		return
	}
	c, err := hd.caps.Verify(token, time.Now())
	if err == nil && c.Volume != h.Volume {
		err = fmt.Errorf("capability for volume %d attached as %d", c.Volume, h.Volume)
	}
	if err != nil {
		who, _ := transport.PeerOf(rw)
		hd.logDeniedCap(who.String(), h, err)
		hd.reply(rw, h, api.StatusDenied, 0)
		return
	}
	at, _ := cs.State().Load().(*attachments)
	if at == nil {
		cs.State().CompareAndSwap(nil, &attachments{caps: map[uint64]capability.Capability{}})
		at = cs.State().Load().(*attachments)
	}
	at.mu.Lock()
	at.caps[c.Volume] = c
	at.mu.Unlock()
	hd.reply(rw, h, api.StatusOK, 0)
}

// capStatus is OK when the connection may make IO request h: on an
// authenticated data plane, a capability for h.Volume attached to it, not
// expired, that allows the op at h.Epoch — no epoch above the signed one
// counts, so none can fence the volume's writer. DENIED otherwise.
func (hd *handler) capStatus(rw transport.ReplyWriter, h api.Header) api.Status {
	if _, ok := transport.PeerOf(rw); !ok {
		return api.StatusOK // an --insecure cluster: no capabilities
	}
	var c capability.Capability
	found := false
	if cs, ok := rw.(transport.ConnState); ok {
		if at, _ := cs.State().Load().(*attachments); at != nil {
			at.mu.Lock()
			c, found = at.caps[h.Volume]
			at.mu.Unlock()
		}
	}
	write := !reads(h.Op)
	if !found || time.Now().After(c.Expiry.Add(capability.Skew)) || !c.Allows(write, h.Epoch) {
		who, _ := transport.PeerOf(rw)
		hd.logDeniedCap(who.String(), h, errNoCapability)
		return api.StatusDenied
	}
	return api.StatusOK
}

// errNoCapability: an IO without a valid capability for it.
var errNoCapability = errors.New("no valid capability attached for this volume, mode and epoch")

// logDeniedCap logs a refused capability or IO, at most every 10 s.
func (hd *handler) logDeniedCap(who string, h api.Header, err error) {
	now := time.Now().UnixNano()
	last := hd.lastDenied.Load()
	if now-last < int64(10*time.Second) || !hd.lastDenied.CompareAndSwap(last, now) {
		return
	}
	hd.log.Warn("request refused: capability", "peer", who, "op", h.Op.String(), "volume", h.Volume,
		"epoch", h.Epoch, "err", err)
}

// ServeFrame implements transport.Handler. It never panics on input and never
// blocks on the network.
func (hd *handler) ServeFrame(rw transport.ReplyWriter, h api.Header, payload []byte) {
	if !hd.authorize(rw, h) {
		if h.Op != api.OpRaft { // one-way: no answer
			hd.reply(rw, h, api.StatusDenied, 0)
		}
		return
	}
	switch h.Op {
	case api.OpRaft, api.OpSnapshot:
		hd.peerIn.ServeFrame(rw, h, payload)
	case api.OpPing, api.OpFlush:
		// Flush: every acknowledged write is already durable (in the WAL).
		hd.reply(rw, h, api.StatusOK, 0)
	case api.OpChecksum:
		hd.checksum(rw, h)
	case api.OpAttach:
		hd.attach(rw, h, payload)
	case api.OpFence:
		if len(payload) != 0 {
			hd.reply(rw, h, api.StatusBadRequest, 0)
			return
		}
		if st := hd.capStatus(rw, h); st != api.StatusOK {
			hd.reply(rw, h, st, 0)
			return
		}
		hd.fence(rw, h, true)
	case api.OpRead, api.OpWrite, api.OpTrim, api.OpWriteZeroes, api.OpMapped, api.OpCompareAndWrite:
		if st := hd.capStatus(rw, h); st != api.StatusOK {
			hd.reply(rw, h, st, 0)
			return
		}
		var in *[]byte
		if b, ok := rw.(transport.PayloadBufferer); ok && h.Op == api.OpWrite {
			in, _ = b.PayloadBuffer()
		}
		hd.serveIO(rw, h, payload, in, true)
	default:
		hd.reply(rw, h, api.StatusBadRequest, 0)
	}
}

// authorize reports whether the connection's identity may make request h
// (docs/security.md): peer traffic only from chunkservers (raftnet then
// checks that each speaks for itself), IO from clients and front ends,
// checksums also from operators and peers (scrub). An unauthenticated server
// (no TLS) allows everything.
func (hd *handler) authorize(rw transport.ReplyWriter, h api.Header) bool {
	who, ok := transport.PeerOf(rw)
	if !ok {
		return true
	}
	var allowed bool
	switch h.Op {
	case api.OpRaft, api.OpSnapshot:
		allowed = who.Role == identity.RoleChunkserver
	case api.OpChecksum, api.OpPing:
		allowed = true // any role the server admitted
	default:
		allowed = who.Role == identity.RoleClient || who.Role == identity.RoleAccess || who.Role == identity.RoleAdmin
	}
	if !allowed {
		hd.logDenied(who.String(), h)
	}
	return allowed
}

// logDenied logs a refused request, at most every 10 s.
func (hd *handler) logDenied(who string, h api.Header) {
	now := time.Now().UnixNano()
	last := hd.lastDenied.Load()
	if now-last < int64(10*time.Second) || !hd.lastDenied.CompareAndSwap(last, now) {
		return
	}
	hd.log.Warn("request refused: the connection's identity may not make it", "peer", who, "op", h.Op.String(),
		"volume", h.Volume, "copyset", h.Copyset)
}

// inPlaceMin: a write at least this large is read into a pooled buffer with
// room for the proposal's header before it, and proposed from there (no copy
// of the data); smaller ones are copied into the proposal.
const inPlaceMin = 16 << 10

// AllocPayload implements transport.PayloadAllocator: the peer transport
// keeps the payloads of large raft frames, and a large write is read where
// its proposal will be.
func (hd *handler) AllocPayload(h api.Header, n int) (*[]byte, int) {
	switch {
	case h.Op == api.OpRaft || h.Op == api.OpSnapshot:
		return hd.peerIn.AllocPayload(h, n)
	case h.Op == api.OpWrite && n > transport.StagedPayload:
		// Asked for once half the payload arrived: a pool class can be
		// twice its size, which a client that stalls would hold.
		b := make([]byte, proposalRoom+n)
		return &b, proposalRoom
	case h.Op == api.OpWrite && n >= inPlaceMin:
		return bufpool.Get(proposalRoom + n), proposalRoom
	}
	return nil, 0
}

func (hd *handler) reply(rw transport.ReplyWriter, h api.Header, st api.Status, hint uint64) {
	h.Status = st
	h.Hint = hint
	rw.Reply(h, nil, nil)
	hd.metrics.done(h.Op, st, 0, time.Time{})
}

// replyErr answers with the status err maps to.
func (hd *handler) replyErr(rw transport.ReplyWriter, h api.Header, err error, start time.Time) {
	st, hint := statusOf(err)
	h.Status = st
	h.Hint = hint
	rw.Reply(h, nil, nil)
	n := 0
	if st == api.StatusOK && !reads(h.Op) {
		n = int(h.Length)
		hd.count(h, n)
	}
	hd.metrics.done(h.Op, st, n, start)
}

// count adds a successful IO to the heartbeat counters and the per-copyset metrics.
func (hd *handler) count(h api.Header, n int) {
	op := h.Op
	if vi, ok := hd.vols.lookup(h.Volume); ok && hd.metrics != nil {
		hd.metrics.copysetDone(api.GroupID(vi.Pool, h.Copyset), op, n)
	}
	if hd.stats == nil {
		return
	}
	if op == api.OpRead {
		hd.stats.readOps.Add(1)
		hd.stats.readBytes.Add(uint64(n))
		return
	}
	hd.stats.writeOps.Add(1)
	hd.stats.writeBytes.Add(uint64(n))
}

// validate checks an IO request against the volume cache and the hosted
// copysets. It returns the replica to use, or the status to answer with.
func (hd *handler) validate(h api.Header, payload []byte) (*replica, volumeInfo, api.Status) {
	if h.Length == 0 {
		return nil, volumeInfo{}, api.StatusBadRequest
	}
	switch h.Op {
	case api.OpWrite:
		if len(payload) != int(h.Length) {
			return nil, volumeInfo{}, api.StatusBadRequest
		}
	case api.OpCompareAndWrite:
		if h.Length > api.MaxCompareAndWrite || len(payload) != 2*int(h.Length) {
			return nil, volumeInfo{}, api.StatusBadRequest
		}
	default:
		if len(payload) != 0 {
			return nil, volumeInfo{}, api.StatusBadRequest
		}
	}
	if h.Op == api.OpMapped && (h.Offset%api.MapAlign != 0 || h.Length%api.MapAlign != 0) {
		return nil, volumeInfo{}, api.StatusBadRequest
	}
	vi, ok := hd.vols.lookup(h.Volume)
	if !ok {
		return nil, vi, api.StatusNoSuchVolume
	}
	if h.Offset > vi.Size || uint64(h.Length) > vi.Size-h.Offset {
		return nil, vi, api.StatusOutOfRange
	}
	if h.Offset%vi.ChunkSize+uint64(h.Length) > vi.ChunkSize {
		return nil, vi, api.StatusOutOfRange
	}
	if h.Length > api.MaxPayload {
		// Possible with chunks over 64 MiB: the reply would not fit in one
		// frame; the client splits such IO.
		return nil, vi, api.StatusBadRequest
	}
	if h.Op == api.OpWrite && raftstore.ProposalHeader+cmdHeaderSize+int(h.Length) > raftnet.MaxEntryData {
		// Its raft entry would not fit in a peer frame.
		return nil, vi, api.StatusBadRequest
	}
	if h.Copyset != api.CopysetOf(h.Volume, h.Offset/vi.ChunkSize, vi.CopysetCount) {
		return nil, vi, api.StatusBadRequest
	}
	r := hd.replica(api.GroupID(vi.Pool, h.Copyset))
	if r == nil {
		return nil, vi, api.StatusNoSuchCopyset
	}
	if uint64(r.chunkSize) != vi.ChunkSize {
		return nil, vi, api.StatusBadRequest // cannot happen: pools never change chunk size
	}
	if !reads(h.Op) && h.Epoch == 0 {
		return nil, vi, api.StatusReadOnly
	}
	if h.Settled > h.Seq || h.Seq != 0 && h.Op == api.OpRead {
		// A request is unsettled while it is sent; reads are not numbered.
		return nil, vi, api.StatusBadRequest
	}
	if err := r.sm.Failed(); err != nil {
		// This replica stopped after a disk error and serves nothing more; the
		// other members elect a leader without it. NO_SPACE / IO_ERROR sends the
		// client on to them, and is final once a majority of them answers so.
		st, _ := statusOf(err)
		return nil, vi, st
	}
	switch e := r.sm.epochOf(h.Volume); {
	case e == tombstoneEpoch: // deleted; the volume cache has not caught up
		return nil, vi, api.StatusNoSuchVolume
	case h.Epoch != 0 && h.Epoch < e:
		return nil, vi, api.StatusFenced
	}
	return r, vi, api.StatusOK
}

// serveIO handles read, write, trim, write-zeroes, mapped and
// compare-and-write. mayRefresh: an unknown volume first refreshes the
// volume cache (a list read after the request arrived, shared with
// concurrent misses), so a volume created a moment ago is served; if the
// MDS cannot be asked, the answer is BUSY (retried), never a final
// NO_SUCH_VOLUME the cache cannot vouch for.
// in, if not nil, is the pooled buffer the payload lies in, after room for
// the proposal's header (AllocPayload): the proposal's, or the pool's again.
func (hd *handler) serveIO(rw transport.ReplyWriter, h api.Header, payload []byte, in *[]byte, mayRefresh bool) {
	start := time.Now()
	r, _, st := hd.validate(h, payload)
	if st == api.StatusNoSuchVolume && mayRefresh && !hd.vols.isDeleted(h.Volume) {
		// Perhaps created a moment ago: look again, off the reader goroutine.
		if in == nil {
			payload = slices.Clone(payload) // the server's buffer is reused
		}
		hd.missWG.Add(1)
		go func() {
			defer hd.missWG.Done()
			if _, err := hd.vols.refreshMiss(hd.ctx, h.Volume); err != nil {
				if in != nil {
					bufpool.Put(in)
				}
				hd.reply(rw, h, api.StatusBusy, 0)
				return
			}
			hd.serveIO(rw, h, payload, in, false)
		}()
		return
	}
	if st != api.StatusOK && in != nil {
		bufpool.Put(in)
	}
	if st != api.StatusOK {
		hd.reply(rw, h, st, 0)
		return
	}
	var c command
	switch h.Op {
	case api.OpRead, api.OpMapped:
		hd.read(rw, h, r, start)
		return
	case api.OpCompareAndWrite:
		hd.compareAndWrite(rw, h, r, payload, start)
		return
	case api.OpWrite:
		c = command{Op: cmdWrite, Data: payload}
	case api.OpTrim:
		c = command{Op: cmdTrim}
	case api.OpWriteZeroes:
		c = command{Op: cmdWriteZeroes}
	}
	c.Volume, c.Epoch, c.Offset, c.Length = h.Volume, h.Epoch, h.Offset, h.Length
	c.Seq, c.Settled = h.Seq, h.Settled
	// Held in the replica's write gate while in flight, so that a
	// compare-and-write of an overlapping range waits for it (caw.go).
	id, w := r.gate.enter(gateSpan{h.Volume, h.Offset, h.Offset + uint64(h.Length)}, false)
	if w != nil {
		// Behind a compare-and-write: proposed once it is done.
		if in == nil {
			c.Data = slices.Clone(c.Data) // the payload is not ours after return
		}
		r.gate.then(w, func() {
			propose(hd.host, r.group, c, in, func(err error) { r.gate.leave(id); hd.replyErr(rw, h, err, start) })
		})
		return
	}
	// Without in, the payload is copied: it is not ours after return.
	propose(hd.host, r.group, c, in, func(err error) { r.gate.leave(id); hd.replyErr(rw, h, err, start) })
}

// read serves a read on the leader: fence first if the epoch is new here, then
// wait for the read barrier, then read the chunk file.
func (hd *handler) read(rw transport.ReplyWriter, h api.Header, r *replica, start time.Time) {
	doRead := func(err error) {
		if err != nil {
			hd.replyErr(rw, h, err, start)
			return
		}
		if h.Op == api.OpMapped {
			go hd.mapped(rw, h, r, start) // seeks in the chunk file: off the worker
			return
		}
		hd.readNow(rw, h, r, start)
	}
	barrier := func() { hd.host.ReadBarrier(r.group, doRead) }
	if h.Epoch > r.sm.epochOf(h.Volume) {
		propose(hd.host, r.group, command{Op: cmdFence, Volume: h.Volume, Epoch: h.Epoch}, nil, func(err error) {
			if err != nil {
				hd.replyErr(rw, h, err, start)
				return
			}
			barrier()
		})
		return
	}
	barrier()
}

// readNow reads the chunk file and replies. It runs on the connection's reader
// or a raft worker (the barrier's callback), so it serves only what the page
// cache holds right here; a read that would wait for the disk goes to a
// goroutine of its own, so it holds up neither the connection's next frames
// nor the worker's other groups.
func (hd *handler) readNow(rw transport.ReplyWriter, h api.Header, r *replica, start time.Time) {
	// An in-process caller (the local fast path) has its own buffer: read
	// straight into it, no pooled buffer and no copy.
	var buf []byte
	if d, ok := rw.(interface{ readBuffer(n int) []byte }); ok {
		buf = d.readBuffer(int(h.Length))
	}
	var pooled *[]byte
	if buf == nil {
		pooled = bufpool.Get(int(h.Length))
		buf = *pooled
	}
	release := func() {
		if pooled != nil {
			bufpool.Put(pooled)
		}
	}
	id := chunkID{Volume: h.Volume, Index: h.Offset / uint64(r.chunkSize)}
	off := int64(h.Offset % uint64(r.chunkSize))
	done, err := r.store.ReadAtCached(id, buf, off)
	if done {
		hd.readDone(rw, h, r, buf, release, err, start)
		return
	}
	go func() {
		err := r.store.ReadAt(id, buf, off)
		hd.readDone(rw, h, r, buf, release, err, start)
	}()
}

// reads reports whether op only reads a volume (a read-only session may
// make it, and it changes nothing).
func reads(op api.Op) bool { return op == api.OpRead || op == api.OpMapped }

// mapped answers OpMapped after the read barrier: a bit per MapGranule of
// the range, set where the chunk file holds data.
func (hd *handler) mapped(rw transport.ReplyWriter, h api.Header, r *replica, start time.Time) {
	n := int(api.MappedBytes(int64(h.Length)))
	var bits []byte
	if d, ok := rw.(interface{ readBuffer(n int) []byte }); ok {
		bits = d.readBuffer(n)
	}
	if bits == nil {
		bits = make([]byte, n)
	}
	clear(bits)
	id := chunkID{Volume: h.Volume, Index: h.Offset / uint64(r.chunkSize)}
	base := int64(h.Offset % uint64(r.chunkSize))
	err := r.store.DataExtents(id, base, int64(h.Length), func(off, n int64) {
		for g := (off - base) / api.MapGranule; g < (off-base+n+api.MapGranule-1)/api.MapGranule; g++ {
			bits[g/8] |= 1 << (g % 8)
		}
	})
	if err != nil {
		hd.log.Warn("mapped: seeking the chunk file failed", "copyset", r.group, "volume", h.Volume, "offset", h.Offset, "err", err)
		hd.replyErr(rw, h, err, start)
		return
	}
	h.Status = api.StatusOK
	h.Hint = 0
	rw.Reply(h, bits, nil)
	hd.metrics.done(h.Op, api.StatusOK, 0, start)
}

// readDone replies to a read with buf (or err) and hands release to the reply.
func (hd *handler) readDone(rw transport.ReplyWriter, h api.Header, r *replica, buf []byte, release func(), err error, start time.Time) {
	if err != nil {
		release()
		hd.log.Warn("read failed", "copyset", r.group, "volume", h.Volume, "offset", h.Offset, "err", err)
		hd.replyErr(rw, h, err, start)
		return
	}
	h.Status = api.StatusOK
	h.Hint = 0
	rw.Reply(h, buf, release)
	hd.count(h, int(h.Length))
	hd.metrics.done(h.Op, api.StatusOK, int(h.Length), start)
}

// fence answers OpFence: a new writer (Epoch) raises Volume's epoch in copyset
// Copyset of the volume's pool before its open returns (docs/reliability.md,
// "Writer takeover"). The fence is a command through the copyset's raft log, so
// every replica — and every later leader — refuses the old writer's IO with
// FENCED from the moment it is applied; the reply is sent once it is applied
// here (on the leader). A fence older than the copyset's epoch is FENCED
// itself: a still newer writer took over meanwhile. mayRefresh as in serveIO.
func (hd *handler) fence(rw transport.ReplyWriter, h api.Header, mayRefresh bool) {
	r, st := hd.validateFence(h)
	if st == api.StatusNoSuchVolume && mayRefresh && !hd.vols.isDeleted(h.Volume) {
		hd.missWG.Add(1)
		go func() {
			defer hd.missWG.Done()
			if _, err := hd.vols.refreshMiss(hd.ctx, h.Volume); err != nil {
				hd.reply(rw, h, api.StatusBusy, 0)
				return
			}
			hd.fence(rw, h, false)
		}()
		return
	}
	if st != api.StatusOK {
		hd.reply(rw, h, st, 0)
		return
	}
	c := command{Op: cmdFence, Volume: h.Volume, Epoch: h.Epoch}
	propose(hd.host, r.group, c, nil, func(err error) {
		st, hint := statusOf(err)
		hd.reply(rw, h, st, hint)
	})
}

// validateFence checks an OpFence request; it returns the replica to fence, or
// the status to answer with.
func (hd *handler) validateFence(h api.Header) (*replica, api.Status) {
	if h.Epoch == 0 {
		return nil, api.StatusReadOnly
	}
	if h.Offset != 0 || h.Length != 0 {
		return nil, api.StatusBadRequest
	}
	vi, ok := hd.vols.lookup(h.Volume)
	if !ok {
		return nil, api.StatusNoSuchVolume
	}
	if h.Copyset >= vi.CopysetCount {
		return nil, api.StatusBadRequest
	}
	r := hd.replica(api.GroupID(vi.Pool, h.Copyset))
	if r == nil {
		return nil, api.StatusNoSuchCopyset
	}
	if err := r.sm.Failed(); err != nil {
		st, _ := statusOf(err)
		return nil, st
	}
	switch e := r.sm.epochOf(h.Volume); {
	case e == tombstoneEpoch:
		return nil, api.StatusNoSuchVolume
	case h.Epoch < e:
		return nil, api.StatusFenced
	}
	return r, api.StatusOK
}

// checksum answers OpChecksum: Volume carries the pool id, Copyset the copyset
// id; the reply payload is the checksum list described in doc.go.
func (hd *handler) checksum(rw transport.ReplyWriter, h api.Header) {
	if h.Volume > 0xffffffff {
		hd.reply(rw, h, api.StatusBadRequest, 0)
		return
	}
	r := hd.replica(api.GroupID(uint32(h.Volume), h.Copyset))
	if r == nil {
		hd.reply(rw, h, api.StatusNoSuchCopyset, 0)
		return
	}
	who := rw.RemoteAddr().String()
	if id, ok := transport.PeerOf(rw); ok {
		who = id.String()
	}
	if !hd.checksums.acquire(who) {
		hd.reply(rw, h, api.StatusBusy, 0)
		return
	}
	go func() {
		if f := hd.beforeChecksum.Load(); f != nil {
			(*f)()
		}
		b, err := checksumList(r)
		// Free the slot before answering: a peer that sends its next
		// checksum request on this answer must find it free (it got BUSY
		// now and then while the release ran after the reply).
		hd.checksums.release(who)
		if err != nil {
			hd.replyErr(rw, h, err, time.Time{})
			return
		}
		h.Status = api.StatusOK
		rw.Reply(h, b, nil)
		hd.metrics.done(h.Op, api.StatusOK, 0, time.Time{})
	}()
}

// checksumList encodes the crc32c of every chunk of r that is not all zeros.
func checksumList(r *replica) ([]byte, error) {
	ids, err := r.store.Chunks()
	if err != nil {
		return nil, err
	}
	slices.SortFunc(ids, func(a, b chunkID) int {
		if a.Volume != b.Volume {
			return cmpU64(a.Volume, b.Volume)
		}
		return cmpU64(a.Index, b.Index)
	})
	zero := zeroChunkCRC(r.chunkSize)
	out := make([]byte, 4, 4+20*len(ids))
	n := uint32(0)
	for _, id := range ids {
		crc, err := r.store.Checksum(id)
		if err != nil {
			return nil, err
		}
		if crc == zero {
			continue
		}
		out = binary.BigEndian.AppendUint64(out, id.Volume)
		out = binary.BigEndian.AppendUint64(out, id.Index)
		out = binary.BigEndian.AppendUint32(out, crc)
		n++
	}
	binary.BigEndian.PutUint32(out, n)
	return out, nil
}

var (
	zeroCRCMu  sync.Mutex
	zeroCRCs   = map[int64]uint32{}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// zeroChunkCRC is the crc32c of a chunk of zeros (a never-written chunk).
func zeroChunkCRC(size int64) uint32 {
	zeroCRCMu.Lock()
	defer zeroCRCMu.Unlock()
	if c, ok := zeroCRCs[size]; ok {
		return c
	}
	var crc uint32
	z := make([]byte, 64<<10)
	for left := size; left > 0; {
		n := min(left, int64(len(z)))
		crc = crc32.Update(crc, castagnoli, z[:n])
		left -= n
	}
	zeroCRCs[size] = crc
	return crc
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
