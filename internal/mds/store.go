package mds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/pkg/api"
)

// etcd keys; the layout is specified in doc.go.
const (
	prefix            = "/basalt/"
	electionPrefix    = prefix + "election/"
	idsPrefix         = prefix + "ids/"
	chunkserverPrefix = prefix + "chunkservers/"
	poolPrefix        = prefix + "pools/"
	poolNamePrefix    = prefix + "pool-names/"
	copysetPrefix     = prefix + "copysets/"
	volumePrefix      = prefix + "volumes/"
	volumeNamePrefix  = prefix + "volume-names/"
	volumesRevKey     = prefix + "volumes-revision"
	topologyRevKey    = prefix + "topology-revision"
	sessionPrefix     = prefix + "sessions/"
	nodePrefix        = prefix + "nodes/"
	accessNodePrefix  = prefix + "access-nodes/"
	nvmfSubsysPrefix  = prefix + "nvmf-subsystems/"
	anaKey            = prefix + "ana-assignments"
	reservationPrefix = prefix + "reservations/"
	chapPrefix        = prefix + "chap/"
)

// Id counters (idsPrefix + kind).
const (
	idChunkserver = "chunkserver"
	idPool        = "pool"
	idVolume      = "volume"
	idSession     = "session"
	idAccessNode  = "access-node"
)

func idKey(p string, id uint64) string { return fmt.Sprintf("%s%020d", p, id) }

func chunkserverKey(id uint64) string { return idKey(chunkserverPrefix, id) }
func poolKey(id uint32) string        { return idKey(poolPrefix, uint64(id)) }
func copysetKey(pool uint32) string   { return idKey(copysetPrefix, uint64(pool)) }
func volumeKey(id uint64) string      { return idKey(volumePrefix, id) }
func sessionKey(id uint64) string     { return idKey(sessionPrefix, id) }
func poolNameKey(name string) string  { return poolNamePrefix + name }
func nodeKey(id string) string        { return nodePrefix + id }
func volumeNameKey(name string) string {
	return volumeNamePrefix + name
}

// chunkserverRecord is the value at /basalt/chunkservers/<id>.
type chunkserverRecord struct {
	ID           uint64 `json:"id"`
	Zone         string `json:"zone"`
	Server       string `json:"server"`
	Addr         string `json:"addr"`
	DataDir      string `json:"data_dir,omitempty"`
	Capacity     uint64 `json:"capacity_bytes,omitempty"`
	RegisteredMs int64  `json:"registered_unix_ms"`
}

// poolRecord is the value at /basalt/pools/<id>.
type poolRecord struct {
	ID           uint32 `json:"id"`
	Name         string `json:"name"`
	Replicas     uint32 `json:"replicas"`
	ChunkSize    uint64 `json:"chunk_size"`
	CopysetCount uint32 `json:"copyset_count"`
	CreatedMs    int64  `json:"created_unix_ms"`
}

// copysetRecord is one element of the array at /basalt/copysets/<pool>.
type copysetRecord struct {
	ID      uint32      `json:"id"`
	Members []uint64    `json:"members"`
	Epoch   uint64      `json:"epoch"`
	Move    *moveRecord `json:"move,omitempty"` // member change in flight (scheduler)
}

// volumeRecord is the value at /basalt/volumes/<id>.
type volumeRecord struct {
	ID        uint64 `json:"id"`
	Name      string `json:"name"`
	Size      uint64 `json:"size"`
	PoolID    uint32 `json:"pool_id"`
	PoolName  string `json:"pool_name"`
	CreatedMs int64  `json:"created_unix_ms"`
	// Epoch is the writer epoch: +1 on every read-write OpenVolume.
	Epoch uint64 `json:"epoch"`
	// Writer is the session id of the current writer; 0 after it closed.
	Writer uint64 `json:"writer,omitempty"`
	// Attachments: the nodes the volume is published to (AttachVolume).
	Attachments []attachmentRecord `json:"attachments,omitempty"`
	// Meta: settings kept with the volume (SetVolumeMeta).
	Meta map[string]string `json:"meta,omitempty"`
	// AllowedHosts: the NVMe host NQNs that may connect to its NVMe/TCP
	// subsystem (SetVolumeHost); none: every host.
	AllowedHosts []string `json:"allowed_hosts,omitempty"`
}

// attachmentRecord is one node a volume is published to.
type attachmentRecord struct {
	Node       string `json:"node"`
	ReadOnly   bool   `json:"read_only,omitempty"`
	AttachedMs int64  `json:"attached_unix_ms"`
	// HostNQN is the node's registered host NQN when it was attached;
	// records from before it existed have none (unknown: allow).
	HostNQN string `json:"host_nqn,omitempty"`
	// InitiatorIQN is the node's registered iSCSI initiator name when it
	// was attached; likewise none in older records.
	InitiatorIQN string `json:"initiator_iqn,omitempty"`
}

// nodeRecord is the value at /basalt/nodes/<id>: a host that attaches
// volumes (RegisterNode).
type nodeRecord struct {
	ID           string `json:"id"`
	Zone         string `json:"zone,omitempty"`
	Server       string `json:"server,omitempty"`
	RegisteredMs int64  `json:"registered_unix_ms"`
	// MaxVolumes is the node's attach limit; 0: none.
	MaxVolumes int64 `json:"max_volumes,omitempty"`
	// HostNQN is the NVMe host NQN the node's kernel connects as; "": unknown.
	HostNQN string `json:"host_nqn,omitempty"`
	// InitiatorIQN is the iSCSI initiator name the node's kernel logs in
	// as; "": unknown.
	InitiatorIQN string `json:"initiator_iqn,omitempty"`
	// Volumes are the ids of the volumes attached to the node, kept with
	// each volume's Attachments in the same transactions (AttachVolume,
	// DetachVolume), so that the limit is checked atomically.
	Volumes []uint64 `json:"volumes,omitempty"`
}

// sessionRecord is the value at /basalt/sessions/<id>, attached to the etcd
// lease Lease so that it disappears when the session is not renewed.
type sessionRecord struct {
	ID       uint64 `json:"id"`
	Volume   uint64 `json:"volume"`
	ReadOnly bool   `json:"read_only"`
	Epoch    uint64 `json:"epoch"`
	Client   string `json:"client,omitempty"`
	// Owner is the identity that opened the session (basalt://…); only it
	// renews it, only it or an admin closes it. "" on an Insecure MDS.
	Owner    string `json:"owner,omitempty"`
	Lease    int64  `json:"lease"`
	OpenedMs int64  `json:"opened_unix_ms"`
}

func encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("mds: encode %T: %v", v, err)) // plain structs always encode
	}
	return string(b)
}

func decode[T any](s string) (T, error) {
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return v, fmt.Errorf("mds: corrupt record %q: %w", s, err)
	}
	return v, nil
}

// nextID increments the counter of kind inside stm and returns the new id
// (kinds created rarely: chunkservers, pools; volumes and sessions take
// theirs from an idAllocator).
func nextID(stm concurrency.STM, kind string) (uint64, error) {
	n, err := counter(stm, kind)
	if err != nil {
		return 0, err
	}
	n++
	stm.Put(idsPrefix+kind, strconv.FormatUint(n, 10))
	return n, nil
}

// txn runs fn in an etcd software transaction (serializable snapshot: it is
// retried when a key it read changed before it committed, so concurrent
// requests never lose updates). Every transaction also reads this MDS's
// election key: if another MDS took over meanwhile, the key is gone and
// the write fails with ErrNotActive instead of racing the new active MDS.
// fn may run several times and must have no effect outside stm.
func (s *Server) txn(ctx context.Context, fn func(stm concurrency.STM) error) error {
	key := s.leaderKey()
	if key == "" {
		return ErrNotActive
	}
	for attempt := 1; ; attempt++ {
		_, err := concurrency.NewSTM(s.cli, func(stm concurrency.STM) error {
			if stm.Get(key) == "" {
				return ErrNotActive
			}
			return fn(stm)
		}, concurrency.WithAbortContext(ctx))
		if !errors.Is(err, rpctypes.ErrFutureRev) || attempt == futureRevAttempts {
			return err
		}
		// The transaction's reads after its first are pinned to the first
		// one's revision, and the client spreads them over every etcd
		// member: one that has not applied that revision yet refuses the
		// read (etcd-io/etcd#11963). An OpenVolume just after an MDS
		// failover failed so (a CI rehearsal's TestKillActiveMDS). Run it
		// again once that member had a moment to catch up.
		select {
		case <-ctx.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// futureRevAttempts bounds txn's runs refused for a future revision (10 ms
// apart): a member stuck behind for longer is an etcd problem to report.
const futureRevAttempts = 100

// bumpTopologyRevision marks a change to chunkservers, pools or copysets,
// so that every MDS's cached topology is re-read.
func bumpTopologyRevision(stm concurrency.STM) {
	stm.Put(topologyRevKey, "")
}

// getPrefix reads all records under p, decoded, in key order.
func getPrefix[T any](ctx context.Context, cli *clientv3.Client, p string) ([]T, error) {
	resp, err := cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	return decodeKVs[T](resp)
}

func decodeKVs[T any](resp *clientv3.GetResponse) ([]T, error) {
	out := make([]T, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		v, err := decode[T](string(kv.Value))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// getOne reads one record; ok is false if the key does not exist.
func getOne[T any](ctx context.Context, cli *clientv3.Client, key string) (v T, ok bool, err error) {
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return v, false, err
	}
	v, err = decode[T](string(resp.Kvs[0].Value))
	return v, err == nil, err
}

// poolIDFromCopysetKey parses the pool id out of a /basalt/copysets/ key.
func poolIDFromCopysetKey(k string) (uint32, error) {
	n, err := strconv.ParseUint(strings.TrimPrefix(k, copysetPrefix), 10, 32)
	return uint32(n), err
}

func (r poolRecord) proto() *api.Pool {
	return &api.Pool{Id: r.ID, Name: r.Name, Replicas: r.Replicas, ChunkSize: r.ChunkSize, CopysetCount: r.CopysetCount}
}

func (r volumeRecord) proto() *api.Volume {
	v := &api.Volume{Id: r.ID, Name: r.Name, Size: r.Size, PoolId: r.PoolID, PoolName: r.PoolName,
		CreatedUnixMs: r.CreatedMs, Epoch: r.Epoch, Meta: maps.Clone(r.Meta), AllowedHosts: slices.Clone(r.AllowedHosts)}
	for _, a := range r.Attachments {
		v.Attachments = append(v.Attachments, &api.Attachment{Node: a.Node, ReadOnly: a.ReadOnly, AttachedUnixMs: a.AttachedMs, HostNqn: a.HostNQN, InitiatorIqn: a.InitiatorIQN})
	}
	return v
}
