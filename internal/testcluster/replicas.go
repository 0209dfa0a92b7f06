package testcluster

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/scrub"
	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// ReplicaChecksums asks one chunkserver for the per-chunk checksums of its replica
// of a copyset, connecting with sec (Cluster.DataSecurity).
func ReplicaChecksums(ctx context.Context, sec transport.Security, addr string, pool, copyset uint32) ([]scrub.ChunkSum, error) {
	conn, err := transport.Dial(ctx, addr, transport.ConnConfig{Security: sec})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	call := &transport.Call{
		Header:  api.Header{Op: api.OpChecksum, Volume: uint64(pool), Copyset: copyset},
		ReadBuf: make([]byte, 4<<20),
	}
	if err := conn.Do(ctx, call); err != nil {
		return nil, err
	}
	if err := api.StatusError(call.Reply.Status, call.Reply.Hint); err != nil {
		return nil, err
	}
	return scrub.DecodeChecksums(call.ReadBuf[:call.Reply.PayloadLen])
}

// CompareReplicas waits until, for every copyset of the pool, all members report
// identical per-chunk checksums, and fails the test with the first difference if
// they do not agree within timeout.
func (c *Cluster) CompareReplicas(timeout time.Duration) {
	c.t.Helper()
	c.Eventually(timeout, "replicas of every copyset identical", func(ctx context.Context) error {
		r, err := c.API.GetCopysets(ctx, &api.GetCopysetsRequest{PoolId: c.Pool.Id})
		if err != nil {
			return err
		}
		addrs := map[uint64]string{}
		for _, cs := range r.Chunkservers {
			addrs[cs.Id] = cs.Addr
		}
		chunks := 0
		for _, cs := range r.Copysets {
			var first []scrub.ChunkSum
			for i, m := range cs.Members {
				sums, err := ReplicaChecksums(ctx, c.DataSecurity(), addrs[m], cs.PoolId, cs.Id)
				if err != nil {
					return fmt.Errorf("copyset %d on chunkserver %d: %w", cs.Id, m, err)
				}
				if i == 0 {
					first = sums
					chunks += len(sums)
					continue
				}
				if !reflect.DeepEqual(first, sums) {
					return fmt.Errorf("copyset %d: chunkserver %d has %d chunks, chunkserver %d has %d, or their checksums differ",
						cs.Id, cs.Members[0], len(first), m, len(sums))
				}
			}
		}
		c.t.Logf("replicas identical: %d copysets, %d written chunks", len(r.Copysets), chunks)
		return nil
	})
}

// DataSecurity is how a test connects to the cluster's chunkservers: as
// the admin, authenticated.
func (c *Cluster) DataSecurity() transport.Security {
	c.t.Helper()
	return transport.Security{Mode: transport.ModeAuthenticated,
		ClientTLS: c.Identity(identity.RoleAdmin, "admin").ClientTLS(identity.RoleChunkserver)}
}
