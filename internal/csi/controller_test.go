package csi

import (
	"regexp"
	"strings"
	"testing"
)

// VolumeName: a name the MDS takes is kept; any other becomes a valid one,
// the same each time, different for different names.
func TestVolumeName(t *testing.T) {
	valid := regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	for _, n := range []string{"pvc-0f6c2a4e-2b1d-4f0e-9c1a-3d5e7f9a1b2c", "a", strings.Repeat("x", 128)} {
		if got := VolumeName(n); got != n {
			t.Errorf("VolumeName(%q) = %q; want it unchanged", n, got)
		}
	}
	seen := map[string]string{}
	for _, n := range []string{"vol+1", "vol 1", "vol/1", "vol_1+", "vol+1 ", "tøy", strings.Repeat("y", 129), strings.Repeat("y", 129) + "z", ""} {
		got := VolumeName(n)
		if n != "" && !valid.MatchString(got) {
			t.Errorf("VolumeName(%q) = %q: not a valid volume name", n, got)
		}
		if again := VolumeName(n); again != got {
			t.Errorf("VolumeName(%q): %q, then %q", n, got, again)
		}
		if o, ok := seen[got]; ok {
			t.Errorf("VolumeName(%q) = VolumeName(%q) = %q", n, o, got)
		}
		seen[got] = n
	}
}
