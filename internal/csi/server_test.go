package csi

import (
	"path/filepath"
	"testing"
)

// The endpoints Start listens on: a Unix socket (unix:///path or a path) or
// tcp://host:port; anything else is refused.
func TestListenEndpoints(t *testing.T) {
	dir := t.TempDir()
	for _, ep := range []string{"unix://" + filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock"), "tcp://127.0.0.1:0"} {
		lis, err := listen(ep)
		if err != nil {
			t.Fatalf("%s: %v", ep, err)
		}
		want := "unix"
		if ep[:3] == "tcp" {
			want = "tcp"
		}
		if lis.Addr().Network() != want {
			t.Errorf("%s: listens on %s, want %s", ep, lis.Addr().Network(), want)
		}
		lis.Close()
	}
	for _, ep := range []string{"", "unix://", "tcp://127.0.0.1", "http://127.0.0.1:80"} {
		if lis, err := listen(ep); err == nil {
			lis.Close()
			t.Errorf("%q: listened on %s, want an error", ep, lis.Addr())
		}
	}
}
