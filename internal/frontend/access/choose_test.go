package access

import (
	"fmt"
	"testing"
)

// choosePortals spreads the volumes' first choices over the portals and,
// when a portal leaves, moves only the volumes that were on it.
func TestChoosePortalsSpreadsAndMovesLittle(t *testing.T) {
	portals := []string{"10.0.0.1:3260", "10.0.0.2:3260", "10.0.0.3:3260", "10.0.0.4:3260"}
	const vols = 4000
	first := map[string]string{}
	per := map[string]int{}
	for i := range vols {
		v := fmt.Sprintf("vol-%d", i)
		order := choosePortals(v, portals)
		if len(order) != len(portals) {
			t.Fatalf("%s: order %v of %v", v, order, portals)
		}
		first[v] = order[0]
		per[order[0]]++
	}
	for _, p := range portals {
		if n := per[p]; n < vols/4*8/10 || n > vols/4*12/10 {
			t.Errorf("portal %s is the first choice of %d of %d volumes, want about %d: %v", p, n, vols, vols/4, per)
		}
	}
	rest := portals[1:]
	for v, p := range first {
		now := choosePortals(v, rest)[0]
		if p != portals[0] && now != p {
			t.Fatalf("%s moved from %s to %s when %s left", v, p, now, portals[0])
		}
	}
}
