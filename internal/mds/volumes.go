package mds

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/pkg/api"
)

// Volume limits.
const (
	// VolumeAlign: volume sizes are multiples of 4 KiB.
	VolumeAlign = 4096
	// MaxVolumeSize is 4 PiB.
	MaxVolumeSize = 1 << 52
)

func checkSize(size uint64) error {
	if size == 0 || size%VolumeAlign != 0 || size > MaxVolumeSize {
		return fmt.Errorf("%w: size %d: must be a positive multiple of 4096 bytes, at most 4 PiB", ErrInvalidArgument, size)
	}
	return nil
}

// resolvePool finds the pool a new volume goes to: the named one, or the
// only pool, or the pool named "default" when there are several.
func (s *Server) resolvePool(ctx context.Context, name string) (poolRecord, error) {
	pools, err := getPrefix[poolRecord](ctx, s.cli, poolPrefix)
	if err != nil {
		return poolRecord{}, err
	}
	var names []string
	for _, p := range pools {
		if p.Name == name || (name == "" && (len(pools) == 1 || p.Name == "default")) {
			return p, nil
		}
		names = append(names, p.Name)
	}
	switch {
	case name != "":
		return poolRecord{}, fmt.Errorf("%w: pool %q does not exist", ErrNotFound, name)
	case len(pools) == 0:
		return poolRecord{}, fmt.Errorf("%w: no pool exists; create one first (basalt pool create)", ErrFailedPrecondition)
	}
	return poolRecord{}, fmt.Errorf("%w: several pools exist (%s); name one", ErrInvalidArgument, strings.Join(names, ", "))
}

// bumpVolumesRevision marks a change to the set or sizes of volumes; the
// key's ModRevision is the volumes revision heartbeats and ListVolumes
// report.
func bumpVolumesRevision(stm concurrency.STM, why string) {
	stm.Put(volumesRevKey, why)
}

// volumeByName reads a volume inside a transaction.
func volumeByName(stm concurrency.STM, name string) (volumeRecord, error) {
	idStr := stm.Get(volumeNameKey(name))
	if idStr == "" {
		return volumeRecord{}, fmt.Errorf("%w: volume %q does not exist", ErrNotFound, name)
	}
	id, err := strconv.ParseUint(idStr, 10, 64)
	if err != nil {
		return volumeRecord{}, fmt.Errorf("mds: corrupt volume name index %q=%q", name, idStr)
	}
	v := stm.Get(volumeKey(id))
	if v == "" {
		return volumeRecord{}, fmt.Errorf("mds: volume name index %q points at missing volume %d", name, id)
	}
	return decode[volumeRecord](v)
}

// CreateVolume creates a volume: one small record, whatever its size.
func (h *handler) CreateVolume(ctx context.Context, req *api.CreateVolumeRequest) (*api.CreateVolumeResponse, error) {
	s := h.s
	if err := checkName("volume", req.Name); err != nil {
		return nil, err
	}
	if err := checkSize(req.Size); err != nil {
		return nil, err
	}
	pool, err := s.resolvePool(ctx, req.Pool)
	if err != nil {
		return nil, err
	}
	// The id is taken before the transaction: it reads no shared counter, so
	// concurrent creates of different names do not conflict. A create that
	// fails leaves its id unused.
	id, err := s.volumeIDs.alloc(ctx)
	if err != nil {
		return nil, err
	}
	rec := volumeRecord{ID: id, Name: req.Name, Size: req.Size, PoolID: pool.ID, PoolName: pool.Name,
		CreatedMs: time.Now().UnixMilli()}
	// One plain transaction, not an STM: an STM (snapshot isolation) would
	// also fail on the volumes-revision key every create writes, so
	// concurrent creates would retry each other. The conditions are what the
	// create depends on: this MDS is active, the name is free, the pool is
	// there.
	nameKey, pk, lk := volumeNameKey(rec.Name), poolKey(pool.ID), s.leaderKey()
	if lk == "" {
		return nil, ErrNotActive
	}
	resp, err := s.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(lk), ">", 0),
		clientv3.Compare(clientv3.CreateRevision(nameKey), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(pk), ">", 0),
	).Then(
		clientv3.OpPut(volumeKey(id), encode(rec)),
		clientv3.OpPut(nameKey, strconv.FormatUint(id, 10)),
		clientv3.OpPut(volumesRevKey, "create "+rec.Name),
	).Else(
		clientv3.OpGet(lk, clientv3.WithCountOnly()),
		clientv3.OpGet(nameKey, clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		switch {
		case resp.Responses[0].GetResponseRange().Count == 0:
			return nil, ErrNotActive
		case resp.Responses[1].GetResponseRange().Count > 0:
			return nil, fmt.Errorf("%w: volume %q exists", ErrAlreadyExists, rec.Name)
		}
		return nil, fmt.Errorf("%w: pool %q does not exist", ErrNotFound, pool.Name)
	}
	s.log.Info("volume created", "volume", rec.ID, "name", rec.Name, "size", rec.Size, "pool", rec.PoolName)
	return &api.CreateVolumeResponse{Volume: rec.proto()}, nil
}

// GetVolume reads a volume by name, or by id when the name is empty.
func (h *handler) GetVolume(ctx context.Context, req *api.GetVolumeRequest) (*api.GetVolumeResponse, error) {
	s := h.s
	id := req.Id
	if req.Name != "" {
		resp, err := s.cli.Get(ctx, volumeNameKey(req.Name))
		if err != nil {
			return nil, err
		}
		if len(resp.Kvs) == 0 {
			return nil, fmt.Errorf("%w: volume %q does not exist", ErrNotFound, req.Name)
		}
		if id, err = strconv.ParseUint(string(resp.Kvs[0].Value), 10, 64); err != nil {
			return nil, fmt.Errorf("mds: corrupt volume name index %q", req.Name)
		}
	} else if id == 0 {
		return nil, fmt.Errorf("%w: give a volume name or id", ErrInvalidArgument)
	}
	v, ok, err := getOne[volumeRecord](ctx, s.cli, volumeKey(id))
	if err != nil {
		return nil, err
	}
	if !ok {
		if req.Name != "" {
			return nil, fmt.Errorf("%w: volume %q does not exist", ErrNotFound, req.Name)
		}
		return nil, fmt.Errorf("%w: volume %d does not exist", ErrNotFound, id)
	}
	return &api.GetVolumeResponse{Volume: v.proto()}, nil
}

// ListVolumes lists every volume by name, with the volumes revision of the
// same snapshot.
func (h *handler) ListVolumes(ctx context.Context, _ *api.ListVolumesRequest) (*api.ListVolumesResponse, error) {
	resp, err := h.s.cli.Txn(ctx).Then(
		clientv3.OpGet(volumePrefix, clientv3.WithPrefix()),
		clientv3.OpGet(volumesRevKey),
	).Commit()
	if err != nil {
		return nil, err
	}
	vols, err := decodeKVs[volumeRecord]((*clientv3.GetResponse)(resp.Responses[0].GetResponseRange()))
	if err != nil {
		return nil, err
	}
	sort.Slice(vols, func(i, j int) bool { return vols[i].Name < vols[j].Name })
	out := &api.ListVolumesResponse{}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		out.Revision = uint64(kvs[0].ModRevision)
	}
	for _, v := range vols {
		out.Volumes = append(out.Volumes, v.proto())
	}
	return out, nil
}

// ResizeVolume grows a volume. Shrinking is refused: it would cut data
// that hosts may still use.
func (h *handler) ResizeVolume(ctx context.Context, req *api.ResizeVolumeRequest) (*api.ResizeVolumeResponse, error) {
	s := h.s
	if err := checkName("volume", req.Name); err != nil {
		return nil, err
	}
	if err := checkSize(req.Size); err != nil {
		return nil, err
	}
	var rec volumeRecord
	var old uint64
	err := s.txn(ctx, func(stm concurrency.STM) error {
		v, err := volumeByName(stm, req.Name)
		if err != nil {
			return err
		}
		rec, old = v, v.Size
		if req.Size < v.Size {
			return fmt.Errorf("%w: volume %q is %d bytes; shrinking to %d is not supported (grow only)",
				ErrInvalidArgument, req.Name, v.Size, req.Size)
		}
		if req.Size == v.Size {
			return nil
		}
		rec.Size = req.Size
		stm.Put(volumeKey(rec.ID), encode(rec))
		bumpVolumesRevision(stm, "resize "+rec.Name)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if old != rec.Size {
		s.log.Info("volume resized", "volume", rec.ID, "name", rec.Name, "old_size", old, "size", rec.Size)
	}
	return &api.ResizeVolumeResponse{Volume: rec.proto()}, nil
}

// Limits of a volume's metadata (SetVolumeMeta): settings, not data.
const (
	maxMetaKeys  = 64
	maxMetaValue = 1024
)

var metaKeyRE = regexp.MustCompile(`^[A-Za-z0-9._/-]{1,63}$`)

// SetVolumeMeta sets or (with an empty value) removes keys of a volume's
// metadata. Setting what is there already changes nothing and writes nothing.
func (h *handler) SetVolumeMeta(ctx context.Context, req *api.SetVolumeMetaRequest) (*api.SetVolumeMetaResponse, error) {
	s := h.s
	if err := checkName("volume", req.Name); err != nil {
		return nil, err
	}
	for k, v := range req.Meta {
		if !metaKeyRE.MatchString(k) {
			return nil, fmt.Errorf("%w: metadata key %q: 1-63 characters of A-Z a-z 0-9 . _ / -", ErrInvalidArgument, k)
		}
		if len(v) > maxMetaValue {
			return nil, fmt.Errorf("%w: metadata %q: value of %d bytes, at most %d", ErrInvalidArgument, k, len(v), maxMetaValue)
		}
	}
	var rec volumeRecord
	changed := false
	err := s.txn(ctx, func(stm concurrency.STM) error {
		v, err := volumeByName(stm, req.Name)
		if err != nil {
			return err
		}
		rec, changed = v, false
		meta := maps.Clone(v.Meta)
		if meta == nil {
			meta = map[string]string{}
		}
		for k, val := range req.Meta {
			old, ok := meta[k]
			switch {
			case val == "" && ok:
				delete(meta, k)
			case val != "" && old != val:
				meta[k] = val
			default:
				continue
			}
			changed = true
		}
		if !changed {
			return nil
		}
		if len(meta) > maxMetaKeys {
			return fmt.Errorf("%w: volume %q would have %d metadata keys, at most %d", ErrInvalidArgument, req.Name, len(meta), maxMetaKeys)
		}
		if len(meta) == 0 {
			meta = nil
		}
		rec.Meta = meta
		stm.Put(volumeKey(rec.ID), encode(rec))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		s.log.Info("volume metadata set", "volume", rec.ID, "name", rec.Name, "meta", rec.Meta)
	}
	return &api.SetVolumeMetaResponse{Volume: rec.proto()}, nil
}

// DeleteVolume deletes a volume that no live session holds open, as `rbd rm`
// refuses an image with watchers: a volume attached read-only (every front-end
// attachment starts so) is in use too.
func (h *handler) DeleteVolume(ctx context.Context, req *api.DeleteVolumeRequest) (*api.DeleteVolumeResponse, error) {
	s := h.s
	if err := checkName("volume", req.Name); err != nil {
		return nil, err
	}
	var rec volumeRecord
	err := s.txn(ctx, func(stm concurrency.STM) error {
		v, err := volumeByName(stm, req.Name)
		if err != nil {
			return err
		}
		rec = v
		if len(v.Attachments) > 0 {
			return fmt.Errorf("%w: volume %q is published to node %q; unpublish it first",
				ErrFailedPrecondition, req.Name, v.Attachments[0].Node)
		}
		if v.Writer != 0 {
			if sv := stm.Get(sessionKey(v.Writer)); sv != "" {
				sess, _ := decode[sessionRecord](sv)
				return fmt.Errorf("%w: volume %q is open for writing by %q (session %d); close it or wait for its lease to lapse",
					ErrFailedPrecondition, req.Name, sess.Client, v.Writer)
			}
		}
		// Readers are found by a range read beside the transaction: a reader
		// that opens in between finds its volume gone at its next renewal, and
		// can never write (a writer's open goes through the volume record).
		sessions, err := getPrefix[sessionRecord](ctx, s.cli, sessionPrefix)
		if err != nil {
			return err
		}
		for _, sess := range sessions {
			if sess.Volume == v.ID {
				return fmt.Errorf("%w: volume %q is attached by %q (read-only session %d); detach it (disconnect its clients) or wait for its lease to lapse",
					ErrFailedPrecondition, req.Name, sess.Client, sess.ID)
			}
		}
		stm.Del(volumeKey(v.ID))
		stm.Del(volumeNameKey(v.Name))
		stm.Del(reservationKey(v.ID))
		stm.Del(chapKey(v.ID))
		bumpVolumesRevision(stm, "delete "+v.Name)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("volume deleted", "volume", rec.ID, "name", rec.Name)
	return &api.DeleteVolumeResponse{}, nil
}
