package faults

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/internal/testcluster"
)

// stepDown is raft's log line (a warning) when a leader's CheckQuorum finds
// that it did not hear from a quorum within an election timeout.
const stepDown = "since quorum is not active"

// TestPauseLeaderHealthyKeepQuorum: while the busiest leader is paused (and
// after it resumes with the backlog its peers queued for it), the two
// chunkservers that were never paused keep hearing each other: no leader on
// either of them steps down for lack of quorum. Before the fix, the resumed
// chunkserver answered each of the ~100 heartbeats per copyset queued for it,
// and the new leaders read and sent a MsgApp of up to 1 MiB per answer, on a
// raft worker holding every copyset of its chunkserver for over an election
// timeout (docs/reliability.md, "Leader paused"): leaders stepped down and
// followers started elections. The check is on what happened (raft's log
// line), not on a latency. BASALT_FAULTS_GOROUTINES=dir saves the healthy
// chunkservers' goroutine dumps (every 100 ms for 8 s after the SIGCONT)
// and every log (debug level) there.
func TestPauseLeaderHealthyKeepQuorum(t *testing.T) {
	flags := []string{}
	dumpDir := os.Getenv("BASALT_FAULTS_GOROUTINES")
	if dumpDir != "" {
		flags = append(flags, "--debug-listen=127.0.0.1:0", "--log-level=debug")
	}
	// No balancing: moving leaderships back to the resumed chunkserver is
	// legitimate and would blur which elections the pause caused.
	f := start(t, testcluster.Options{MDSFlags: []string{"--balance=false"}, ChunkserverFlags: flags})
	f.run(testcluster.WorkloadOptions{Seed: 13})
	victim := f.c.MostLeaders()
	var healthy []*testcluster.Proc
	for _, p := range f.c.CS {
		if p != victim {
			healthy = append(healthy, p)
		}
	}
	f.c.Pause(victim)
	f.fault("SIGSTOP %s for 10 s", victim)
	f.progress(60*time.Second, "while a leader is paused")
	time.Sleep(10 * time.Second)
	f.c.Resume(victim)
	resumed := time.Now()
	// The figures count from the SIGCONT: the stall of the pause itself (the
	// client's attempt timeout, TestPauseLeader) becomes the "before".
	f.w.Mark("fault")
	t.Logf("SIGCONT %s; the figures below count from here", victim)
	var stop chan struct{}
	var wg sync.WaitGroup
	if dumpDir != "" {
		stop = make(chan struct{})
		for _, p := range healthy {
			wg.Add(1)
			go func() { defer wg.Done(); pollGoroutines(t, p, dumpDir, stop) }()
		}
	}
	// The resumed replica catches up; give the aftermath time to happen.
	time.Sleep(8 * time.Second)
	if stop != nil {
		close(stop)
		wg.Wait()
	}
	f.c.WaitHealthy(60 * time.Second)
	if dumpDir != "" {
		for _, p := range f.c.CS {
			b, _ := os.ReadFile(p.LogPath)
			_ = os.WriteFile(filepath.Join(dumpDir, p.Name+resumed.Format("-150405")+".log"), b, 0o644)
		}
	}
	f.healed()
	f.finish("victim paused 10 s; figures from the SIGCONT on")
	for _, p := range healthy {
		if n := f.c.CountLog(p, stepDown); n > 0 {
			at, _ := f.c.LogTimeAfter(p, stepDown, time.Time{})
			t.Errorf("%s, never paused, had %d leader step-downs for lack of quorum (first at %s, %s after the SIGCONT)",
				p, n, at.Format("15:04:05.000"), at.Sub(resumed).Round(time.Millisecond))
		}
	}
}

var pprofAddr = regexp.MustCompile(`serving pprof"? addr=(\S+)`)

// pollGoroutines saves p's goroutine dump every 100 ms until stop (an
// investigation aid: BASALT_FAULTS_GOROUTINES=dir).
func pollGoroutines(t *testing.T, p *testcluster.Proc, dir string, stop chan struct{}) {
	b, _ := os.ReadFile(p.LogPath)
	m := pprofAddr.FindStringSubmatch(string(b))
	if m == nil {
		t.Logf("%s: no pprof address in its log", p)
		return
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	for {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		at := time.Now()
		resp, err := hc.Get("http://" + strings.Trim(m[1], "\"") + "/debug/pprof/goroutine?debug=2")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		name := filepath.Join(dir, fmt.Sprintf("%s-%s.txt", p.Name, at.Format("150405.000")))
		_ = os.WriteFile(name, body, 0o644)
	}
}
