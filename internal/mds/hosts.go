package mds

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/basalt-storage/basalt/pkg/api"
)

// maxAllowedHosts bounds a volume's NVMe allow-list: the list travels in
// every ListVolumes answer, which each NVMe/TCP access node reads.
const maxAllowedHosts = 256

// The two NQN formats of the NVMe base specification (4.7 "NVMe Qualified
// Names"): a date, the reverse domain name its owner held then, a colon and
// a string the owner chose; or the NVMe Express UUID form.
var (
	nqnRE     = regexp.MustCompile(`^nqn\.[0-9]{4}-(0[1-9]|1[0-2])\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*:.+$`)
	nqnUUIDRE = regexp.MustCompile(`^nqn\.2014-08\.org\.nvmexpress:uuid:[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$`)
)

// checkAllowedHostNQN refuses what cannot be a host NQN: one that is not of
// either format, longer than 223 bytes, not UTF-8, or with a space or a
// control character (no host sends one; it is a paste gone wrong).
func checkAllowedHostNQN(nqn string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: host NQN %q: %s", ErrInvalidArgument, nqn, why)
	}
	switch {
	case len(nqn) > 223:
		return bad(fmt.Sprintf("%d bytes, at most 223", len(nqn)))
	case !utf8.ValidString(nqn):
		return bad("not UTF-8")
	case strings.IndexFunc(nqn, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return bad("has a space or a control character")
	case strings.HasPrefix(nqn, "nqn.2014-08.org.nvmexpress:uuid:") && !nqnUUIDRE.MatchString(nqn):
		return bad("the uuid form needs a UUID (8-4-4-4-12 hex digits) after \"uuid:\"")
	case !nqnRE.MatchString(nqn):
		return bad(`want "nqn.yyyy-mm.reverse.domain:string" (e.g. nqn.2014-08.com.example:host1) or "nqn.2014-08.org.nvmexpress:uuid:UUID"`)
	}
	return nil
}

// SetVolumeHost adds a host NQN to a volume's NVMe allow-list or removes
// it, in one transaction (two admins changing one list lose nothing).
// Access nodes read the list with the volumes (ListVolumes).
func (h *handler) SetVolumeHost(ctx context.Context, req *api.SetVolumeHostRequest) (*api.SetVolumeHostResponse, error) {
	s := h.s
	if err := checkName("volume", req.Volume); err != nil {
		return nil, err
	}
	if err := checkAllowedHostNQN(req.HostNqn); err != nil {
		return nil, err
	}
	var rec volumeRecord
	changed := false
	err := s.txn(ctx, func(stm concurrency.STM) error {
		v, err := volumeByName(stm, req.Volume)
		if err != nil {
			return err
		}
		rec, changed = v, false
		i := slices.Index(v.AllowedHosts, req.HostNqn)
		switch {
		case req.Allow && i >= 0, !req.Allow && i < 0:
			return nil
		case req.Allow:
			if len(v.AllowedHosts) >= maxAllowedHosts {
				return fmt.Errorf("%w: volume %q allows %d hosts, at most %d", ErrInvalidArgument, req.Volume, len(v.AllowedHosts), maxAllowedHosts)
			}
			rec.AllowedHosts = append(slices.Clone(v.AllowedHosts), req.HostNqn)
		default:
			rec.AllowedHosts = slices.Delete(slices.Clone(v.AllowedHosts), i, i+1)
			if len(rec.AllowedHosts) == 0 {
				rec.AllowedHosts = nil
			}
		}
		changed = true
		stm.Put(volumeKey(rec.ID), encode(rec))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if changed {
		s.log.Info("volume NVMe allow-list changed", "volume", rec.ID, "name", rec.Name, "host_nqn", req.HostNqn,
			"allow", req.Allow, "allowed_hosts", len(rec.AllowedHosts), "by", callerName(ctx))
	}
	return &api.SetVolumeHostResponse{Volume: rec.proto(), Changed: changed}, nil
}
