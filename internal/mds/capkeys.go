package mds

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/basalt-storage/basalt/internal/capability"
	"github.com/basalt-storage/basalt/pkg/api"
)

// capKeysKey holds the capability signing keys (JSON list, oldest first),
// shared by every MDS of the cluster. etcd is reached over mutually
// authenticated TLS only (docs/security.md), so the private keys travel
// and rest where the cluster's other secrets (the metadata) do.
const capKeysKey = prefix + "capability-keys"

// CapabilityKeyRotation is how long a capability signing key is current;
// the active MDS then makes a new one (the previous one still verifies).
const CapabilityKeyRotation = 24 * time.Hour

// capKeyReload: how often an MDS rereads the keys (another MDS rotated).
const capKeyReload = time.Minute

// capKeys is the Server's view of the signing keys, loaded from etcd on
// first use and reread every capKeyReload.
type capKeys struct {
	mu     sync.Mutex
	signer *capability.Signer
	loaded time.Time
}

type storedKey struct {
	ID      uint32 `json:"id"`
	Private []byte `json:"private"`
	Created int64  `json:"created_ms"`
}

// signer returns the signer, creating the first key or rotating the
// current one in etcd as needed.
func (s *Server) signer(ctx context.Context) (*capability.Signer, error) {
	c := &s.caps
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.signer != nil && now.Sub(c.loaded) < capKeyReload {
		return c.signer, nil
	}
	for attempt := 0; ; attempt++ {
		resp, err := s.cli.Get(ctx, capKeysKey)
		if err != nil {
			return nil, err
		}
		var stored []storedKey
		var rev int64
		if len(resp.Kvs) > 0 {
			if err := json.Unmarshal(resp.Kvs[0].Value, &stored); err != nil {
				return nil, fmt.Errorf("mds: %s: %w", capKeysKey, err)
			}
			rev = resp.Kvs[0].ModRevision
		}
		var keys []capability.PrivateKey
		for _, k := range stored {
			keys = append(keys, capability.PrivateKey{ID: k.ID, Private: k.Private, Created: time.UnixMilli(k.Created)})
		}
		if len(keys) > 0 && now.Sub(keys[len(keys)-1].Created) < CapabilityKeyRotation {
			if c.signer == nil {
				c.signer, _ = capability.NewSigner(keys)
			} else {
				c.signer.Set(keys)
			}
			c.loaded = now
			return c.signer, nil
		}
		// No key yet, or the current one is due: make the next one, if no
		// other MDS did meanwhile (compare the revision read).
		id := uint32(1)
		if len(keys) > 0 {
			id = keys[len(keys)-1].ID + 1
		}
		next, err := capability.NewKey(id, now)
		if err != nil {
			return nil, err
		}
		keys = append(keys, next)
		if len(keys) > 2 {
			keys = keys[len(keys)-2:]
		}
		stored = stored[:0]
		for _, k := range keys {
			stored = append(stored, storedKey{ID: k.ID, Private: k.Private, Created: k.Created.UnixMilli()})
		}
		b, err := json.Marshal(stored)
		if err != nil {
			return nil, err
		}
		tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(capKeysKey), "=", rev)).
			Then(clientv3.OpPut(capKeysKey, string(b))).Commit()
		if err != nil {
			return nil, err
		}
		if tr.Succeeded {
			s.log.Info("capability signing key made", "key", id, "previous_kept", len(keys) > 1)
		} else if attempt > 5 {
			return nil, fmt.Errorf("mds: %s keeps changing", capKeysKey)
		}
		// Read back what won.
	}
}

// capability signs sess's capability, good until the lease's end.
func (s *Server) capability(ctx context.Context, sess sessionRecord) ([]byte, error) {
	sg, err := s.signer(ctx)
	if err != nil {
		return nil, fmt.Errorf("mds: capability keys: %w", err)
	}
	mode := capability.ModeWrite
	if sess.ReadOnly {
		mode = capability.ModeRead
	}
	return sg.Sign(capability.Capability{Volume: sess.Volume, Session: sess.ID, Epoch: sess.Epoch, Mode: mode,
		Expiry: time.Now().Add(s.cfg.SessionLease)}), nil
}

// capabilityKeys is what a heartbeat answer tells chunkservers.
func (s *Server) capabilityKeys(ctx context.Context) ([]*api.CapabilityKey, error) {
	sg, err := s.signer(ctx)
	if err != nil {
		return nil, err
	}
	var out []*api.CapabilityKey
	for _, k := range sg.Public() {
		out = append(out, &api.CapabilityKey{Id: k.ID, PublicKey: k.Public})
	}
	return out, nil
}
