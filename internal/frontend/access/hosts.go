package access

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// DefaultHostsTTL is the default Config.HostsTTL: how long an NVMe/TCP
// access node uses the volumes' host allow-lists before reading them from
// the MDS again. A `basalt volume allow-host` or `deny-host` reaches every
// access node's Connects and discovery logs within it.
const DefaultHostsTTL = time.Second

// volumeHosts reads the volumes' NVMe host allow-lists from the MDS for
// nvmf.Config.VolumeHostAllowed: every volume's at once (ListVolumes: a
// discovery log asks about each volume), through a copy at most ttl old.
// A failed read is not cached: the Connect that asked is refused for now,
// the next one asks again.
type volumeHosts struct {
	mds *mdsclient.Client
	ttl time.Duration

	// mu is held while the MDS is asked, so Connects racing ask once.
	mu    sync.Mutex
	read  bool
	asked time.Time
	lists map[string][]string // volume name → allowed host NQNs; absent: every host
}

func newVolumeHosts(mds *mdsclient.Client, ttl time.Duration) *volumeHosts {
	return &volumeHosts{mds: mds, ttl: ttl}
}

// allowed reports whether volume's allow-list lets hostNQN connect: it
// names the host, or it is empty. A volume the MDS does not know has none.
func (v *volumeHosts) allowed(ctx context.Context, volume, hostNQN string) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.read || time.Since(v.asked) >= v.ttl {
		asked := time.Now()
		resp, err := v.mds.ListVolumes(ctx, &api.ListVolumesRequest{})
		if err != nil {
			return false, err
		}
		lists := map[string][]string{}
		for _, vol := range resp.Volumes {
			if len(vol.AllowedHosts) > 0 {
				lists[vol.Name] = vol.AllowedHosts
			}
		}
		v.read, v.asked, v.lists = true, asked, lists
	}
	l := v.lists[volume]
	return len(l) == 0 || slices.Contains(l, hostNQN), nil
}
