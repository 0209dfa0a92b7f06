package access

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/basalt-storage/basalt/internal/reservation"
	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// DefaultReservationTTL is the default Config.ReservationTTL: how long an
// access node uses a volume's reservation state before reading it from the
// MDS again, and so how long a PERSISTENT RESERVE OUT waits before it
// completes (reservation.Cached): a change made through one access node is
// enforced on every other before it returns.
const DefaultReservationTTL = time.Second

// MDSReservations is the reservation.Store of the MDS: every access node
// of the cluster shares it, and it survives MDS failover (etcd).
type MDSReservations struct{ MDS *mdsclient.Client }

func (m MDSReservations) Read(ctx context.Context, volume string) (*reservation.State, error) {
	resp, err := m.MDS.GetReservation(ctx, &api.GetReservationRequest{Volume: volume})
	if err != nil {
		return nil, err
	}
	return reservation.StateFromProto(resp.State), nil
}

func (m MDSReservations) Apply(ctx context.Context, volume string, from reservation.Nexus, a reservation.Action) (*reservation.State, error) {
	var id [16]byte
	rand.Read(id[:])
	resp, err := m.MDS.ApplyReservation(ctx, &api.ApplyReservationRequest{
		Volume: volume, From: reservation.NexusProto(from), Action: a.Proto(), RequestId: hex.EncodeToString(id[:]),
	})
	if err != nil {
		return nil, err
	}
	if resp.ErrorCode != 0 {
		return nil, &reservation.Error{Code: reservation.Code(resp.ErrorCode), Field: int(resp.ErrorField)}
	}
	return reservation.StateFromProto(resp.State), nil
}
