package testcluster

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/basalt-storage/basalt/pkg/api"
)

// appliedConfig is one "raftstore: membership changed" line of a chunkserver
// log: a configuration that replica applied.
type appliedConfig struct {
	proc                       string
	group                      uint64
	voters, outgoing, learners []uint64
	line                       string
}

var (
	confGroupRe = regexp.MustCompile(`\bgroup=(\d+)`)
	confListRe  = map[string]*regexp.Regexp{}
)

func confList(line, key string) []uint64 {
	re := confListRe[key]
	if re == nil {
		re = regexp.MustCompile(`\b` + key + `="?\[([0-9 ]*)\]"?`)
		confListRe[key] = re
	}
	m := re.FindStringSubmatch(line)
	if m == nil {
		return nil
	}
	var out []uint64
	for _, f := range strings.Fields(m[1]) {
		n, _ := strconv.ParseUint(f, 10, 64)
		out = append(out, n)
	}
	return out
}

// appliedConfigs returns every configuration change any chunkserver applied,
// as its log tells.
func appliedConfigs(c *Cluster) []appliedConfig {
	var out []appliedConfig
	for _, p := range c.CS {
		for _, line := range strings.Split(p.Log(), "\n") {
			if !strings.Contains(line, "raftstore: membership changed") {
				continue
			}
			ac := appliedConfig{proc: p.Name, line: line, voters: confList(line, "voters"),
				outgoing: confList(line, "voters_outgoing"), learners: confList(line, "learners")}
			if m := confGroupRe.FindStringSubmatch(line); m != nil {
				ac.group, _ = strconv.ParseUint(m[1], 10, 64)
			}
			out = append(out, ac)
		}
	}
	return out
}

// checkConfigs fails the test at once if a replica ever applied a
// configuration with fewer than replicas voters in either half.
func checkConfigs(t *testing.T, c *Cluster, replicas int) (configs, joint int) {
	t.Helper()
	for _, ac := range appliedConfigs(c) {
		if len(ac.voters) != replicas || (len(ac.outgoing) != 0 && len(ac.outgoing) != replicas) {
			t.Fatalf("%s applied a configuration with fewer than %d voters in a half: voters %v, outgoing %v, learners %v\n%s",
				ac.proc, replicas, ac.voters, ac.outgoing, ac.learners, ac.line)
		}
		configs++
		if len(ac.outgoing) > 0 {
			joint++
		}
	}
	return configs, joint
}

// TestMoveKeepsRedundancy: a fourth chunkserver joins three, and the
// scheduler moves copysets onto it under a verified workload, each new
// replica rebuilt through a throttled snapshot (1 MiB/s, so a move takes
// seconds). Once the first move's new member is a learner, a second member
// of that copyset (neither the one leaving nor its leader) is killed. Every
// configuration any replica applies keeps three voters in each half (the new
// member is promoted and the old one removed in one joint change, only after
// the learner caught up), the move completes with one member dead, IO goes
// on without a single failed request, and after the dead member returns the
// balancing finishes, every acknowledged write reads back and the replicas
// agree.
func TestMoveKeepsRedundancy(t *testing.T) {
	// A long grace: the killed member is not repaired; only the balance moves run.
	mdsFlags := append(slices.Clone(healFlags), "--recovery-grace=10m")
	csFlags := append(slices.Clone(healChunkserverFlags), "--snapshot-rate=1MiB")
	c := Start(t, Options{Chunkservers: 3, Copysets: 4, MDSFlags: mdsFlags, ChunkserverFlags: csFlags})
	c.CreateVolume("vol", 64<<20)
	v := c.Open("vol", false)
	w := StartWorkload(t, v, WorkloadOptions{Writers: 4, Prefill: true, Seed: 6})
	time.Sleep(time.Second)

	w.Mark("fault")
	p4 := c.AddChunkserver()
	id4 := c.IDOf(p4)

	// Wait for a move onto the new chunkserver whose new member was added as
	// a learner (a replica applied that configuration).
	var moving *api.Copyset
	c.Eventually(120*time.Second, "a move onto the new chunkserver with its learner added", func(ctx context.Context) error {
		checkConfigs(t, c, 3)
		st, err := c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		for _, cs := range st.Copysets {
			if cs.Move == nil || cs.Move.To != id4 {
				continue
			}
			g := api.GroupID(cs.PoolId, cs.Id)
			for _, ac := range appliedConfigs(c) {
				if ac.group == g && slices.Contains(ac.learners, id4) {
					moving = cs
					return nil
				}
			}
			return fmt.Errorf("copyset %d moving onto %d, no learner applied yet", g, id4)
		}
		return fmt.Errorf("no move onto chunkserver %d yet", id4)
	})
	g := api.GroupID(moving.PoolId, moving.Id)
	var victim uint64
	for _, m := range moving.Members {
		if m != moving.Move.To && m != moving.Move.From && m != moving.LeaderHint {
			victim = m
			break
		}
	}
	if victim == 0 {
		t.Fatalf("copyset %d (members %v, move %v, leader %d): no second member to kill", g, moving.Members, moving.Move, moving.LeaderHint)
	}
	vp := c.ProcOf(victim)
	killed := time.Now()
	c.Kill(vp)
	t.Logf("copyset %d moving %d → %d (leader %d); killed member %d (%s) mid-move", g, moving.Move.From, moving.Move.To, moving.LeaderHint, victim, vp)

	// The move completes with the victim dead, through a joint configuration.
	c.Eventually(180*time.Second, "the move completing with a member dead", func(ctx context.Context) error {
		checkConfigs(t, c, 3)
		st, err := c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		for _, cs := range st.Copysets {
			if cs.PoolId == moving.PoolId && cs.Id == moving.Id && cs.Move != nil {
				return fmt.Errorf("copyset %d still moving (%d → %d)", g, cs.Move.From, cs.Move.To)
			}
		}
		return nil
	})
	moveTook := time.Since(time.UnixMilli(moving.Move.StartedUnixMs))
	t.Logf("copyset %d's move done %s after it started, %s after the kill", g,
		moveTook.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	// IO goes on with one member of every copyset dead.
	acked := w.Acked()
	c.Eventually(60*time.Second, "IO after the move with a member dead", func(context.Context) error {
		if n := w.Acked() - acked; n < 200 {
			return fmt.Errorf("%d IOs acknowledged since the move completed", n)
		}
		return nil
	})

	// The dead member returns; the balancing finishes.
	c.Start(vp)
	c.Eventually(240*time.Second, "copysets balanced onto the new chunkserver", func(context.Context) error {
		checkConfigs(t, c, 3)
		p := c.Placement()
		if lo, hi := Spread(p.Members); hi != lo || p.Moves != 0 || p.Healthy != p.Total {
			return fmt.Errorf("copysets per chunkserver %v, %d moves in flight, %d/%d healthy", p.Members, p.Moves, p.Healthy, p.Total)
		}
		return nil
	})
	w.Mark("healed")
	configs, joint := checkConfigs(t, c, 3)
	var took []string
	for _, line := range strings.Split(c.MDS.Log(), "\n") {
		if strings.Contains(line, "copyset move done") {
			if i := strings.Index(line, "took="); i >= 0 {
				took = append(took, strings.Fields(line[i+len("took="):])[0])
			}
		}
	}
	t.Logf("MOVES: %d done, took %v (MDS log); %d configurations applied on the replicas, %d of them joint, "+
		"every one with 3 voters in each half", len(took), took, configs, joint)
	if joint == 0 {
		t.Error("no replica applied a joint configuration: the moves did not go through ConfChangeV2")
	}
	time.Sleep(time.Second)
	w.Stop()
	f := w.Figures("replica move, second member killed mid-move")
	f.Report(t)
	if f.Failed != 0 {
		t.Errorf("%d IOs failed (%v); a move with one more member lost must not fail any", f.Failed, w.Errors())
	}
	w.Verify(v)
	c.CompareReplicas(60 * time.Second)
}
