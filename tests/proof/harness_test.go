package proof

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/internal/testcluster"
	"github.com/basalt-storage/basalt/pkg/client"
)

const (
	volSize   = 64 << 20
	chunkSize = 4 << 20
)

// seed returns BASALT_PROOF_SEED or a new seed, and logs it.
func seed(t *testing.T) int64 {
	t.Helper()
	s := time.Now().UnixNano() % 1_000_000_000
	if e := os.Getenv("BASALT_PROOF_SEED"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			t.Fatalf("BASALT_PROOF_SEED: %v", err)
		}
		s = n
	}
	t.Logf("seed %d (BASALT_PROOF_SEED=%d repeats this run)", s, s)
	return s
}

// session opens and reopens the volume as one writer would: when the current
// session stops (lease lapsed, fenced), the next IO reopens it.
type session struct {
	t                 *testing.T
	c                 *testcluster.Cluster
	name              string
	mdsTLS, dataTLS   *tls.Config
	mu                sync.Mutex // guards v and the counts; held while reopening
	v                 *client.Volume
	taking            bool // a takeover is opening the next session
	allMu             sync.Mutex
	all               []*client.Volume
	reopens, takeover int
}

func newSession(t *testing.T, c *testcluster.Cluster, name string) *session {
	id := c.Identity(identity.RoleClient, "proof")
	s := &session{t: t, c: c, name: name, mdsTLS: id.ClientTLS(identity.RoleMDS), dataTLS: id.ClientTLS(identity.RoleChunkserver)}
	v, err := s.open()
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	s.v = v
	t.Cleanup(s.closeAll)
	return s
}

// open opens a new writable session, retrying for 60 s (the MDS may be
// restarting).
func (s *session) open() (*client.Volume, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, err := client.Open(ctx, client.Config{MDS: strings.Split(s.c.MDSAddr, ","), MDSTLS: s.mdsTLS,
			DataTLS: s.dataTLS, Volume: s.name, ClientName: "proof", OpTimeout: 10 * time.Second})
		cancel()
		if err == nil {
			s.allMu.Lock()
			s.all = append(s.all, v)
			s.allMu.Unlock()
			return v, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *session) current() *client.Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.v
}

// failed reopens the volume if old is still the current session and stopped.
func (s *session) failed(old *client.Volume) {
	if old.Err() == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.v != old || s.taking {
		return
	}
	v, err := s.open()
	if err != nil {
		s.t.Errorf("reopen %s: %v", s.name, err)
		return
	}
	s.v = v
	s.reopens++
}

// takeOver opens a second writer session and makes it current: the first is
// fenced (its IO in flight fails).
func (s *session) takeOver() {
	s.mu.Lock()
	s.taking = true
	s.mu.Unlock()
	// Opened without the lock: the clients keep issuing IO on the old
	// session, which the open fences while it is in flight.
	v, err := s.open()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.taking = false
	if err != nil {
		s.t.Fatalf("takeover of %s: %v", s.name, err)
	}
	s.v = v
	s.takeover++
}

func (s *session) closeAll() {
	s.allMu.Lock()
	defer s.allMu.Unlock()
	for _, v := range s.all {
		v.Close()
	}
}

// errCounts tallies error messages (bounded in the log).
type errCounts struct {
	mu sync.Mutex
	m  map[string]int
}

func (e *errCounts) add(err error) {
	msg := err.Error()
	if len(msg) > 120 {
		msg = msg[:120]
	}
	e.mu.Lock()
	if e.m == nil {
		e.m = map[string]int{}
	}
	e.m[msg]++
	e.mu.Unlock()
}

func (e *errCounts) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	type kv struct {
		k string
		n int
	}
	var l []kv
	for k, n := range e.m {
		l = append(l, kv{k, n})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].n > l[j].n })
	var b strings.Builder
	for i, x := range l {
		if i == 8 {
			fmt.Fprintf(&b, "  ... %d more kinds\n", len(l)-i)
			break
		}
		fmt.Fprintf(&b, "  %d× %s\n", x.n, x.k)
	}
	return b.String()
}

// keepArtifacts stops every process of c and copies its directory (data
// directories, logs, certificates) to the artifacts directory, returning it.
func keepArtifacts(t *testing.T, c *testcluster.Cluster, extra func(dir string)) string {
	dir := os.Getenv("BASALT_PROOF_ARTIFACTS")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "basalt-proof-"); err != nil {
			t.Logf("artifacts: %v", err)
			return ""
		}
	}
	dir = filepath.Join(dir, fmt.Sprintf("%s-%s", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().Format("150405")))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("artifacts: %v", err)
		return ""
	}
	for _, p := range append(append([]*testcluster.Proc{}, c.CS...), c.MDSs...) {
		c.Resume(p)
		c.Kill(p)
	}
	if extra != nil {
		extra(dir)
	}
	if out, err := exec.Command("cp", "-a", "--sparse=always", c.Dir, filepath.Join(dir, "cluster")).CombinedOutput(); err != nil {
		t.Logf("artifacts: cp: %v %s", err, out)
	}
	t.Logf("ARTIFACTS kept in %s", dir)
	return dir
}

// isFinal reports errors after which a session issues no more IO.
func isFinal(v *client.Volume, err error) bool {
	return v.Err() != nil || errors.Is(err, client.ErrLeaseExpired) || errors.Is(err, client.ErrClosed)
}

var _ = rand.New
