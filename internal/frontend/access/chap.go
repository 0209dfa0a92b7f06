package access

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// DefaultCHAPTTL is the default Config.CHAPTTL: how long an access node
// uses a target's CHAP record (or its absence) before reading it from the
// MDS again. A `basalt volume chap set` or `clear` reaches every access
// node's logins within it.
const DefaultCHAPTTL = time.Second

// errBadCHAPRecord: the MDS returned CHAP credentials a target cannot use
// (it refuses to store them: a record from elsewhere).
var errBadCHAPRecord = errors.New("access: the target's CHAP record has no user or secret")

// targetCHAPs reads the volumes' target CHAP from the MDS for
// iscsi.Config.TargetCHAP, through a copy at most ttl old per volume. A
// failed read is not cached: the login that asked is refused, the next
// one asks again.
type targetCHAPs struct {
	mds *mdsclient.Client
	ttl time.Duration

	mu   sync.Mutex // guards vols; before a cachedCHAP's mu
	vols map[string]*cachedCHAP
}

// cachedCHAP is one volume's copy; mu is held while the MDS is asked, so
// logins racing for one volume ask once.
type cachedCHAP struct {
	mu    sync.Mutex
	read  bool
	asked time.Time
	chap  *iscsi.CHAP // nil: the target has none
}

func newTargetCHAPs(mds *mdsclient.Client, ttl time.Duration) *targetCHAPs {
	return &targetCHAPs{mds: mds, ttl: ttl, vols: map[string]*cachedCHAP{}}
}

// get returns volume's target CHAP, or nil if it has none.
func (t *targetCHAPs) get(ctx context.Context, volume string) (*iscsi.CHAP, error) {
	t.mu.Lock()
	v := t.vols[volume]
	if v == nil {
		v = &cachedCHAP{}
		t.vols[volume] = v
	}
	t.mu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.read && time.Since(v.asked) < t.ttl {
		return v.chap, nil
	}
	asked := time.Now()
	resp, err := t.mds.GetTargetCHAP(ctx, &api.GetTargetCHAPRequest{Volume: volume})
	if err != nil {
		return nil, err
	}
	var c *iscsi.CHAP
	if r := resp.Chap; r != nil {
		if r.User == "" || len(r.Secret) == 0 {
			return nil, errBadCHAPRecord
		}
		c = &iscsi.CHAP{User: r.User, Secret: string(r.Secret), MutualUser: r.MutualUser, MutualSecret: string(r.MutualSecret)}
	}
	v.read, v.asked, v.chap = true, asked, c
	return c, nil
}
