package access

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// portalsTTL is how long a redirector uses the MDS's list of access nodes
// before reading it again.
const portalsTTL = time.Second

// probeTimeout bounds the redirector's check that a chosen portal accepts
// connections: the MDS keeps a node that died online for its heartbeat
// timeout, and a login sent there would wait out the initiator's.
const probeTimeout = time.Second

// redirector is an iSCSI redirector portal's view of the access nodes
// (iscsi.Redirector): the online ones with an iSCSI portal, from the MDS.
type redirector struct {
	mds *mdsclient.Client

	mu      sync.Mutex
	read    time.Time
	portals []string
}

// Portals returns the online access nodes' iSCSI portals, sorted.
func (r *redirector) Portals(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.read) < portalsTTL {
		return r.portals, nil
	}
	resp, err := r.mds.ListANA(ctx, &api.ListANARequest{})
	if err != nil {
		return nil, fmt.Errorf("listing the access nodes: %w", err)
	}
	var ps []string
	for _, n := range resp.Nodes {
		if n.Online && n.IscsiPortal != "" {
			ps = append(ps, n.IscsiPortal)
		}
	}
	slices.Sort(ps)
	r.portals, r.read = slices.Compact(ps), time.Now()
	return r.portals, nil
}

// Portal chooses the portal a login to volume's target goes to: the first,
// in the volume's order of the online portals (choosePortals), that accepts
// a connection. Every login to one target goes to one node while it lives,
// so the volume is open on one access node, not on each of an initiator's
// or a cluster's paths.
func (r *redirector) Portal(ctx context.Context, volume string) (string, error) {
	ps, err := r.Portals(ctx)
	if err != nil {
		return "", err
	}
	if len(ps) == 0 {
		return "", errors.New("no access node with an iSCSI portal is online (start `basalt iscsi --register`)")
	}
	var errs []error
	for _, p := range choosePortals(volume, ps) {
		d := net.Dialer{Timeout: probeTimeout}
		c, err := d.DialContext(ctx, "tcp", p)
		if err == nil {
			c.Close()
			return p, nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("no online access node's portal answers: %w", errors.Join(errs...))
}

// choosePortals orders portals for volume by rendezvous hashing: each volume
// has its own order, the volumes' first choices spread evenly over the
// portals, and a portal that leaves moves only the volumes it was first for.
func choosePortals(volume string, portals []string) []string {
	score := func(p string) uint64 {
		h := fnv.New64a()
		h.Write([]byte(volume))
		h.Write([]byte{0})
		h.Write([]byte(p))
		return mix(h.Sum64())
	}
	out := slices.Clone(portals)
	slices.SortStableFunc(out, func(a, b string) int {
		sa, sb := score(a), score(b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return 0
	})
	return out
}

// mix is a 64-bit finalizer (splitmix64's): FNV's high bits barely depend on
// the last bytes hashed, and the order compares whole values.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
