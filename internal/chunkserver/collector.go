package chunkserver

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basalt-storage/basalt/internal/raftstore"
)

// hostCollector exports the raft host's, the WAL's and each copyset's state
// at scrape time.
type hostCollector struct {
	c *ChunkServer

	applied, leader, term, healthy          *prometheus.Desc
	proposeCommit, apply, logSave           *prometheus.Desc
	counters                                *prometheus.Desc
	walSyncs, walBytes, walEntries, walSegs *prometheus.Desc
	walSyncSeconds, walRecycled             *prometheus.Desc
}

func newHostCollector(c *ChunkServer) *hostCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("basalt_chunkserver_"+name, help, labels, nil)
	}
	return &hostCollector{
		c:              c,
		applied:        d("copyset_applied_index", "Last applied raft index of a copyset replica.", "copyset"),
		leader:         d("copyset_leader", "Raft leader of a copyset as this replica knows it (0: unknown).", "copyset"),
		term:           d("copyset_term", "Raft term of a copyset replica.", "copyset"),
		healthy:        d("copyset_healthy", "1 while the replica runs, 0 after a disk error stopped it.", "copyset"),
		proposeCommit:  d("raft_propose_commit_seconds", "Proposal to commit latency."),
		apply:          d("raft_apply_seconds", "State machine Apply latency."),
		logSave:        d("raft_log_save_seconds", "WAL group-commit Save latency."),
		counters:       d("raft_events_total", "Raft host counters by event.", "event"),
		walSyncs:       d("wal_syncs_total", "WAL batches written, one fdatasync each."),
		walBytes:       d("wal_bytes_total", "WAL record bytes written."),
		walEntries:     d("wal_entries_total", "Raft entries appended to the WAL."),
		walSegs:        d("wal_segments", "WAL segment files now."),
		walSyncSeconds: d("wal_sync_seconds_total", "Total time spent in WAL fdatasync."),
		walRecycled:    d("wal_segments_recycled_total", "WAL segments made from a removed segment's file (no zero-fill)."),
	}
}

func (hc *hostCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{hc.applied, hc.leader, hc.term, hc.healthy, hc.proposeCommit,
		hc.apply, hc.logSave, hc.counters, hc.walSyncs, hc.walBytes, hc.walEntries, hc.walSegs, hc.walSyncSeconds, hc.walRecycled} {
		ch <- d
	}
}

func (hc *hostCollector) Collect(ch chan<- prometheus.Metric) {
	host := hc.c.host
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	for _, gs := range host.Groups() {
		id := strconv.FormatUint(gs.ID, 16)
		gauge(hc.applied, float64(gs.Applied), id)
		gauge(hc.leader, float64(gs.Leader), id)
		gauge(hc.term, float64(gs.Term), id)
		h := 0.0
		if gs.Healthy {
			h = 1
		}
		gauge(hc.healthy, h, id)
	}
	st := host.Stats()
	hist(ch, hc.proposeCommit, st.ProposeCommit)
	hist(ch, hc.apply, st.Apply)
	hist(ch, hc.logSave, st.LogSave)
	for name, v := range map[string]uint64{
		"ready_rounds": st.ReadyRounds, "ready_groups": st.ReadyGroups, "proposals": st.Proposals,
		"lease_reads": st.LeaseReads, "read_index_reads": st.ReadIndexReads,
		"snapshots_created": st.SnapshotsCreated, "snapshots_sent": st.SnapshotsSent,
		"snapshots_received": st.SnapshotsReceived, "snapshots_failed": st.SnapshotsFailed,
	} {
		counter(hc.counters, float64(v), name)
	}
	ws := hc.c.wal.Stats()
	counter(hc.walSyncs, float64(ws.Syncs))
	counter(hc.walBytes, float64(ws.Bytes))
	counter(hc.walEntries, float64(ws.Entries))
	gauge(hc.walSegs, float64(ws.Segments))
	counter(hc.walSyncSeconds, ws.SyncTime.Seconds())
	counter(hc.walRecycled, float64(ws.RecycledSegments))
}

// hist exports a raftstore histogram as a Prometheus histogram.
func hist(ch chan<- prometheus.Metric, d *prometheus.Desc, s raftstore.HistogramSnapshot) {
	buckets := make(map[float64]uint64, len(s.Bounds))
	var cum uint64
	for i, b := range s.Bounds {
		if i < len(s.Buckets) {
			cum += s.Buckets[i]
		}
		buckets[b.Seconds()] = cum
	}
	ch <- prometheus.MustNewConstHistogram(d, s.Count, s.Sum.Seconds(), buckets)
}
