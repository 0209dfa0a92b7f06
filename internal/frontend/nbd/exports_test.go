package nbd

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend"
	"github.com/basalt-storage/basalt/internal/frontend/frontendtest"
)

// gatedExports counts opens per name and holds the opens of gated names until
// their gate closes (an export whose cluster answers slowly).
type gatedExports struct {
	frontendtest.Disks
	gates map[string]chan struct{}

	mu    sync.Mutex
	opens map[string]int
}

func (g *gatedExports) Open(ctx context.Context, name string) (frontend.Backend, error) {
	g.mu.Lock()
	g.opens[name]++
	g.mu.Unlock()
	if gate := g.gates[name]; gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Disks.Open(ctx, name)
}

func (g *gatedExports) openCount(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.opens[name]
}

// A client waiting for a slow export's open holds up nobody else: handshakes
// for other exports, and NBD_OPT_INFO even for the slow one, go through.
func TestSlowOpenDoesNotStallOtherHandshakes(t *testing.T) {
	gate := make(chan struct{})
	g := &gatedExports{
		Disks: frontendtest.Disks{"disk": frontendtest.NewDisk(1 << 20), "slow": frontendtest.NewDisk(1 << 20)},
		gates: map[string]chan struct{}{"slow": gate},
		opens: map[string]int{},
	}
	ts := startServer(t, Config{Exports: frontend.NewExports(frontend.ExportsConfig{Opener: g, Logger: quietLogger()})})

	slowDone := make(chan uint32, 1)
	slow := dial(t, ts.sock)
	go func() {
		slow.greet(flagCFixedNewstyle | flagCNoZeroes)
		slow.sendOpt(optGo, goData("slow"))
		slowDone <- slow.readOptReply().typ // the first reply comes after the open
	}()
	deadline := time.Now().Add(60 * time.Second)
	for g.openCount("slow") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the slow export's open never started")
		}
		time.Sleep(time.Millisecond)
	}

	// The slow open is held until the gate closes below: a handshake it
	// stalled would not finish at all (dial's deadline fails the test).
	c := open(t, ts.sock, "disk")
	if errno, _ := c.do(cmdRead, 0, 0, 4096, nil); errno != 0 {
		t.Fatalf("read on the other export: errno %d", errno)
	}
	i := dial(t, ts.sock)
	i.greet(flagCFixedNewstyle | flagCNoZeroes)
	if typ := i.infoGo(optInfo, "slow"); typ != repAck || i.size != 1<<20 {
		t.Fatalf("INFO on the slow export: reply %#x size %d", typ, i.size)
	}
	select {
	case typ := <-slowDone:
		t.Fatalf("GO on the slow export answered %#x before its open finished", typ)
	default:
	}
	close(gate)
	select {
	case typ := <-slowDone:
		if typ != repInfo {
			t.Fatalf("GO on the slow export after its open: reply %#x, want NBD_REP_INFO", typ)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("GO on the slow export did not finish after its open did")
	}
	if n := g.openCount("slow"); n != 1 {
		t.Fatalf("the slow export was opened %d times; NBD_OPT_INFO must not open it", n)
	}
}

// NBD_OPT_INFO describes an export without opening it; NBD_OPT_GO opens it,
// connections share it, and the last one to leave closes it.
func TestInfoDoesNotOpenAndLastConnectionCloses(t *testing.T) {
	disk := frontendtest.NewDisk(1 << 20)
	g := &gatedExports{Disks: frontendtest.Disks{"disk": disk}, opens: map[string]int{}}
	ts := startServer(t, Config{Exports: frontend.NewExports(frontend.ExportsConfig{Opener: g, Logger: quietLogger()})})

	for range 3 {
		c := dial(t, ts.sock)
		c.greet(flagCFixedNewstyle | flagCNoZeroes)
		if typ := c.infoGo(optInfo, "disk"); typ != repAck {
			t.Fatalf("INFO reply %#x", typ)
		}
		c.sendOpt(optAbort, nil)
		c.readOptReply()
	}
	if n := g.openCount("disk"); n != 0 {
		t.Fatalf("NBD_OPT_INFO opened the export %d times", n)
	}
	c1, c2 := open(t, ts.sock, "disk"), open(t, ts.sock, "disk")
	if n := g.openCount("disk"); n != 1 {
		t.Fatalf("two connections opened the export %d times, want 1 shared", n)
	}
	for _, c := range []*client{c1, c2} {
		c.send(cmdDisc, 0, 1, 0, 0, nil)
		c.expectEOF()
	}
	deadline := time.Now().Add(60 * time.Second)
	for disk.Closes.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("backend closed %d times after both connections left, want 1", disk.Closes.Load())
		}
		time.Sleep(time.Millisecond)
	}
}
