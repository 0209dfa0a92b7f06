package mds

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"go.etcd.io/etcd/client/v3/concurrency"
)

// idBatch is how many ids of one kind an allocator reserves per etcd
// transaction.
const idBatch = 128

// idAllocator hands out the ids of one kind (volumes, sessions) from
// batches it reserves in etcd: one transaction raises the counter at
// idsPrefix+kind by idBatch, and the ids below the new value are this MDS's
// to give. So creating many volumes costs one counter transaction per batch,
// and concurrent creates no longer conflict on the counter key (each used to
// read and write it, and all but one were retried).
//
// Ids are unique and never reused: a reservation is durable before any id
// of it is handed out, and ids reserved but not handed out (the MDS stopped,
// or lost the election) are skipped for good. Ids are not dense, and after a
// failover not in creation order.
//
// Goroutines: any; mu serializes handing out and reserving.
type idAllocator struct {
	s    *Server
	kind string

	mu    sync.Mutex
	next  uint64 // next id to hand out, if next < end
	end   uint64 // first id past the reservation
	owner string // the election key the reservation was made under
}

func newIDAllocator(s *Server, kind string) *idAllocator {
	return &idAllocator{s: s, kind: kind}
}

// alloc returns a new id. A reservation made while this MDS was active
// under an earlier election key is dropped, so a returning MDS starts from
// the counter again.
func (a *idAllocator) alloc(ctx context.Context) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := a.s.leaderKey()
	if key == "" {
		return 0, ErrNotActive
	}
	if a.next < a.end && a.owner == key {
		id := a.next
		a.next++
		return id, nil
	}
	var first uint64
	err := a.s.txn(ctx, func(stm concurrency.STM) error {
		cur, err := counter(stm, a.kind)
		if err != nil {
			return err
		}
		first = cur + 1
		stm.Put(idsPrefix+a.kind, strconv.FormatUint(cur+idBatch, 10))
		return nil
	})
	if err != nil {
		return 0, err
	}
	a.next, a.end, a.owner = first+1, first+idBatch, key
	return first, nil
}

// counter reads the id counter of kind inside stm (0 when unset).
func counter(stm concurrency.STM, kind string) (uint64, error) {
	cur := stm.Get(idsPrefix + kind)
	if cur == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(cur, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("mds: corrupt id counter %s=%q", kind, cur)
	}
	return n, nil
}
