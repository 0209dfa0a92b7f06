package mds

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/pkg/api"
)

// chapRecord is the value at /basalt/chap/<volume id>: the CHAP
// credentials of the volume's iSCSI target. The secrets are kept in clear
// (a target must know them to check a CHAP response): etcd is reached only
// with TLS client certificates, and its backups deserve the same care.
// Nothing of a record but its user names is ever logged or put in an
// error.
type chapRecord struct {
	User         string `json:"user"`
	Secret       []byte `json:"secret"`
	MutualUser   string `json:"mutual_user,omitempty"`
	MutualSecret []byte `json:"mutual_secret,omitempty"`
}

// CHAP secrets: RFC 7143 12.1.3 lets a secret of fewer than 96 random bits
// be used only under IPsec, so a shorter one is refused; open-iscsi takes
// at most 256 bytes, with its terminator.
const (
	minCHAPSecret = 12
	maxCHAPSecret = 255
	maxCHAPUser   = 255
)

func chapKey(volume uint64) string { return idKey(chapPrefix, volume) }

// checkTargetCHAP refuses credentials an initiator could not use or RFC
// 7143 forbids. Its errors never contain a secret.
func checkTargetCHAP(c *api.TargetCHAP) error {
	user := func(what, u string) error {
		if u == "" || len(u) > maxCHAPUser || !utf8.ValidString(u) {
			return fmt.Errorf("%w: the CHAP %s must be 1 to %d bytes of UTF-8", ErrInvalidArgument, what, maxCHAPUser)
		}
		for _, r := range u {
			if unicode.IsControl(r) {
				return fmt.Errorf("%w: the CHAP %s has a control character", ErrInvalidArgument, what)
			}
		}
		return nil
	}
	secret := func(what string, s []byte) error {
		if len(s) < minCHAPSecret || len(s) > maxCHAPSecret {
			return fmt.Errorf("%w: the CHAP %s has %d bytes: give %d to %d (RFC 7143 12.1.3: at least 96 random bits)",
				ErrInvalidArgument, what, len(s), minCHAPSecret, maxCHAPSecret)
		}
		return nil
	}
	if err := user("user", c.User); err != nil {
		return err
	}
	if err := secret("secret", c.Secret); err != nil {
		return err
	}
	if c.MutualUser == "" && len(c.MutualSecret) == 0 {
		return nil
	}
	if err := user("mutual user", c.MutualUser); err != nil {
		return err
	}
	if err := secret("mutual secret", c.MutualSecret); err != nil {
		return err
	}
	if string(c.MutualSecret) == string(c.Secret) {
		return fmt.Errorf("%w: the mutual CHAP secret must differ from the initiator's (RFC 7143 12.1.3)", ErrInvalidArgument)
	}
	return nil
}

// SetTargetCHAP sets (or, with no credentials, clears) the CHAP a volume's
// iSCSI target requires. Access nodes read it at login (GetTargetCHAP).
func (h *handler) SetTargetCHAP(ctx context.Context, req *api.SetTargetCHAPRequest) (*api.SetTargetCHAPResponse, error) {
	if req.Chap != nil {
		if err := checkTargetCHAP(req.Chap); err != nil {
			return nil, err
		}
	}
	err := h.s.txn(ctx, func(stm concurrency.STM) error {
		id, err := reservationVolume(stm, req.Volume)
		if err != nil {
			return err
		}
		if req.Chap == nil {
			stm.Del(chapKey(id))
			return nil
		}
		stm.Put(chapKey(id), encode(chapRecord{User: req.Chap.User, Secret: req.Chap.Secret,
			MutualUser: req.Chap.MutualUser, MutualSecret: req.Chap.MutualSecret}))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if req.Chap == nil {
		h.s.log.Info("iSCSI target CHAP cleared", "volume", req.Volume, "by", callerName(ctx))
	} else {
		h.s.log.Info("iSCSI target CHAP set", "volume", req.Volume, "user", req.Chap.User,
			"mutual_user", req.Chap.MutualUser, "by", callerName(ctx))
	}
	return &api.SetTargetCHAPResponse{}, nil
}

// GetTargetCHAP returns a volume's target CHAP, secrets included (the
// access node checking a login needs them); none if it has none.
func (h *handler) GetTargetCHAP(ctx context.Context, req *api.GetTargetCHAPRequest) (*api.GetTargetCHAPResponse, error) {
	var rec *chapRecord
	err := h.s.txn(ctx, func(stm concurrency.STM) error {
		rec = nil
		id, err := reservationVolume(stm, req.Volume)
		if err != nil {
			return err
		}
		v := stm.Get(chapKey(id))
		if v == "" {
			return nil
		}
		rec = new(chapRecord)
		if err := json.Unmarshal([]byte(v), rec); err != nil {
			// Not decode: its error quotes the record, secrets and all.
			return fmt.Errorf("mds: corrupt CHAP record of volume %q", req.Volume)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	resp := &api.GetTargetCHAPResponse{}
	if rec != nil {
		resp.Chap = &api.TargetCHAP{User: rec.User, Secret: rec.Secret, MutualUser: rec.MutualUser, MutualSecret: rec.MutualSecret}
	}
	return resp, nil
}

// callerName names the RPC's caller in a log line ("" on an Insecure MDS).
func callerName(ctx context.Context) string {
	if id, ok := caller(ctx); ok {
		return id.String()
	}
	return ""
}
