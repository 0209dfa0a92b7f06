package mds

import (
	"context"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/internal/reservation"
	"github.com/basalt-storage/basalt/pkg/api"
)

// reservationRecord is the value at /basalt/reservations/<volume id>.
type reservationRecord struct {
	State reservation.State `json:"state"`
	// LastRequest is the request id of the last action applied, so a
	// client's retry of it (its answer lost) is not applied twice.
	LastRequest string `json:"last_request,omitempty"`
}

func reservationKey(volume uint64) string { return idKey(reservationPrefix, volume) }

// reservationVolume returns the id of the volume named name, read in stm.
func reservationVolume(stm concurrency.STM, name string) (uint64, error) {
	if name == "" {
		return 0, fmt.Errorf("%w: give a volume name", ErrInvalidArgument)
	}
	idStr := stm.Get(volumeNameKey(name))
	if idStr == "" {
		return 0, fmt.Errorf("%w: volume %q does not exist", ErrNotFound, name)
	}
	id, err := strconv.ParseUint(idStr, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("mds: corrupt volume name index %q", name)
	}
	return id, nil
}

// readReservation returns the volume's record in stm (empty if none).
func readReservation(stm concurrency.STM, id uint64) (reservationRecord, error) {
	v := stm.Get(reservationKey(id))
	if v == "" {
		return reservationRecord{}, nil
	}
	return decode[reservationRecord](v)
}

// GetReservation returns a volume's persistent-reservation state.
func (h *handler) GetReservation(ctx context.Context, req *api.GetReservationRequest) (*api.GetReservationResponse, error) {
	var rec reservationRecord
	err := h.s.txn(ctx, func(stm concurrency.STM) error {
		id, err := reservationVolume(stm, req.Volume)
		if err != nil {
			return err
		}
		rec, err = readReservation(stm, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &api.GetReservationResponse{State: rec.State.Proto()}, nil
}

// ApplyReservation applies one PERSISTENT RESERVE OUT to a volume's state
// in one etcd transaction: the STM compares the revision of every key it
// read, so two access nodes applying at once are serialized (one retries
// on the other's result). A refusal (reservation conflict, an invalid
// field) is an answer, not an RPC error.
func (h *handler) ApplyReservation(ctx context.Context, req *api.ApplyReservationRequest) (*api.ApplyReservationResponse, error) {
	if req.From.GetInitiator() == "" {
		return nil, fmt.Errorf("%w: a reservation action needs the initiator port it came through", ErrInvalidArgument)
	}
	from := reservation.NexusFromProto(req.From)
	act := reservation.ActionFromProto(req.Action)
	resp := &api.ApplyReservationResponse{}
	var changed bool
	err := h.s.txn(ctx, func(stm concurrency.STM) error {
		resp.ErrorCode, resp.ErrorField, changed = 0, 0, false
		id, err := reservationVolume(stm, req.Volume)
		if err != nil {
			return err
		}
		rec, err := readReservation(stm, id)
		if err != nil {
			return err
		}
		if req.RequestId != "" && rec.LastRequest == req.RequestId {
			resp.State = rec.State.Proto() // applied already: a retry
			return nil
		}
		next, err := reservation.Apply(&rec.State, from, act)
		if e := reservation.AsError(err); e != nil {
			resp.ErrorCode, resp.ErrorField = uint32(e.Code), uint32(e.Field)
			return nil
		} else if err != nil {
			return err
		}
		resp.State = next.Proto()
		if next != &rec.State || req.RequestId != "" {
			stm.Put(reservationKey(id), encode(reservationRecord{State: *next, LastRequest: req.RequestId}))
			changed = next != &rec.State
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		h.s.log.Info("persistent reservation changed", "volume", req.Volume, "initiator", from.Initiator,
			"target_port", from.TargetPort, "service_action", act.ServiceAction, "type", act.Type,
			"generation", resp.State.Generation, "reserved", resp.State.Reserved)
	}
	return resp, nil
}
