package mds

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/pkg/api"
)

// leaseTTL is the etcd lease TTL in whole seconds behind a session lease.
func (s *Server) leaseTTL() int64 {
	return max(1, int64((s.cfg.SessionLease+time.Second-1)/time.Second))
}

// OpenVolume opens a session on a volume. A read-write open starts a new
// writer epoch (volume epoch + 1) and supersedes the previous writer; a
// read-only open gets epoch 0.
func (h *handler) OpenVolume(ctx context.Context, req *api.OpenVolumeRequest) (*api.OpenVolumeResponse, error) {
	s := h.s
	if err := checkName("volume", req.Name); err != nil {
		return nil, err
	}
	owner := sessionOwner(ctx)
	if owner != "" {
		if err := s.checkSessionCap(ctx, owner); err != nil {
			return nil, err
		}
	}
	lease, err := s.cli.Grant(ctx, s.leaseTTL())
	if err != nil {
		return nil, err
	}
	id, err := s.sessionIDs.alloc(ctx)
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.cli.Revoke(rctx, lease.ID)
		cancel()
		return nil, err
	}
	var vol volumeRecord
	var sess sessionRecord
	var prevWriter uint64
	err = s.txn(ctx, func(stm concurrency.STM) error {
		v, err := volumeByName(stm, req.Name)
		if err != nil {
			return err
		}
		sess = sessionRecord{ID: id, Volume: v.ID, ReadOnly: req.ReadOnly, Client: req.Client, Owner: owner,
			Lease: int64(lease.ID), OpenedMs: time.Now().UnixMilli()}
		prevWriter = 0
		if !req.ReadOnly {
			prevWriter = v.Writer
			v.Epoch++
			v.Writer = id
			sess.Epoch = v.Epoch
			stm.Put(volumeKey(v.ID), encode(v))
		}
		vol = v
		stm.Put(sessionKey(id), encode(sess), clientv3.WithLease(lease.ID))
		return nil
	})
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.cli.Revoke(rctx, lease.ID)
		cancel()
		return nil, err
	}
	pool, ok, err := getOne[poolRecord](ctx, s.cli, poolKey(vol.PoolID))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("mds: volume %q refers to missing pool %d", vol.Name, vol.PoolID)
	}
	copysets, servers, err := s.poolCopysets(ctx, vol.PoolID)
	if err != nil {
		return nil, err
	}
	if req.ReadOnly {
		s.log.Info("volume opened read-only", "volume", vol.ID, "name", vol.Name, "session", sess.ID, "client", req.Client)
	} else {
		s.log.Info("volume opened for writing", "volume", vol.ID, "name", vol.Name, "session", sess.ID,
			"epoch", vol.Epoch, "client", req.Client, "superseded_session", prevWriter)
	}
	token, err := s.capability(ctx, sess)
	if err != nil {
		return nil, err
	}
	return &api.OpenVolumeResponse{
		Volume: vol.proto(), Pool: pool.proto(), SessionId: sess.ID, Epoch: sess.Epoch,
		LeaseMs: s.cfg.SessionLease.Milliseconds(), Copysets: copysets, Chunkservers: servers,
		Capability: token,
	}, nil
}

// session reads a live session and, for a writer, checks that it is still
// the volume's writer.
func (s *Server) session(ctx context.Context, id uint64) (sessionRecord, error) {
	sess, ok, err := getOne[sessionRecord](ctx, s.cli, sessionKey(id))
	if err != nil {
		return sess, err
	}
	if !ok {
		return sess, fmt.Errorf("%w: session %d does not exist (its lease lapsed, or it was closed); open the volume again", ErrNotFound, id)
	}
	vol, ok, err := getOne[volumeRecord](ctx, s.cli, volumeKey(sess.Volume))
	if err != nil {
		return sess, err
	}
	if !ok {
		return sess, fmt.Errorf("%w: volume %d of session %d was deleted", ErrNotFound, sess.Volume, id)
	}
	if !sess.ReadOnly && vol.Writer != id {
		return sess, fmt.Errorf("%w: session %d (epoch %d) of volume %q was superseded by a newer writer (epoch %d)",
			ErrSuperseded, id, sess.Epoch, vol.Name, vol.Epoch)
	}
	return sess, nil
}

// RenewSession extends a session's lease.
func (h *handler) RenewSession(ctx context.Context, req *api.RenewSessionRequest) (*api.RenewSessionResponse, error) {
	s := h.s
	sess, err := s.session(ctx, req.SessionId)
	if err != nil {
		return nil, err
	}
	if err := checkSessionOwner(ctx, sess, "renew", false); err != nil {
		return nil, err
	}
	if _, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(sess.Lease)); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, fmt.Errorf("%w: session %d expired; open the volume again", ErrNotFound, req.SessionId)
		}
		return nil, err
	}
	token, err := s.capability(ctx, sess)
	if err != nil {
		return nil, err
	}
	return &api.RenewSessionResponse{LeaseMs: s.cfg.SessionLease.Milliseconds(), Capability: token}, nil
}

// CloseSession ends a session. Closing an unknown or expired session
// succeeds: the session is gone either way.
func (h *handler) CloseSession(ctx context.Context, req *api.CloseSessionRequest) (*api.CloseSessionResponse, error) {
	s := h.s
	var sess sessionRecord
	var found bool
	err := s.txn(ctx, func(stm concurrency.STM) error {
		found = false
		v := stm.Get(sessionKey(req.SessionId))
		if v == "" {
			return nil
		}
		var err error
		if sess, err = decode[sessionRecord](v); err != nil {
			return err
		}
		if err := checkSessionOwner(ctx, sess, "close", true); err != nil {
			return err
		}
		found = true
		stm.Del(sessionKey(sess.ID))
		if sess.ReadOnly {
			return nil
		}
		vv := stm.Get(volumeKey(sess.Volume))
		if vv == "" {
			return nil
		}
		vol, err := decode[volumeRecord](vv)
		if err != nil {
			return err
		}
		if vol.Writer == sess.ID {
			vol.Writer = 0
			stm.Put(volumeKey(vol.ID), encode(vol))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		s.cli.Revoke(rctx, clientv3.LeaseID(sess.Lease))
		cancel()
		s.log.Info("session closed", "session", sess.ID, "volume", sess.Volume, "read_only", sess.ReadOnly,
			"client", sess.Client)
	}
	return &api.CloseSessionResponse{}, nil
}

// checkSessionCap refuses a new session to owner when it holds
// MaxSessionsPerClient live ones. The count is read outside the opening
// transaction, so racing opens may pass the cap by a few: a bound on what
// one identity can make the MDS keep, not an exact quota.
func (s *Server) checkSessionCap(ctx context.Context, owner string) error {
	resp, err := s.cli.Get(ctx, sessionPrefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	n := 0
	for _, kv := range resp.Kvs {
		if sess, err := decode[sessionRecord](string(kv.Value)); err == nil && sess.Owner == owner {
			n++
		}
	}
	if n >= s.cfg.MaxSessionsPerClient {
		return fmt.Errorf("%w: %s has %d open (MaxSessionsPerClient %d); close some first",
			ErrTooManySessions, owner, n, s.cfg.MaxSessionsPerClient)
	}
	return nil
}
