package chunkserver

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/basalt-storage/basalt/internal/latency"
	"github.com/basalt-storage/basalt/pkg/api"
)

// metrics are the chunkserver's Prometheus metrics, on its own registry.
type metrics struct {
	reg     *prometheus.Registry
	ops     *prometheus.CounterVec   // op, status
	bytes   *prometheus.CounterVec   // op
	latency *prometheus.HistogramVec // op (successful IO only)
	// Per copyset (raft group id in hex, as the collector's copyset label) and op:
	// successful IO and its bytes.
	csOps, csBytes *prometheus.CounterVec
	// WAL batches: write and fdatasync time (wal.Config.OnCommit).
	walWrite, walSync prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "basalt", Subsystem: "chunkserver", Name: "io_ops_total",
			Help: "Data-plane requests answered, by op and status.",
		}, []string{"op", "status"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "basalt", Subsystem: "chunkserver", Name: "io_bytes_total",
			Help: "Bytes read or written by successful data-plane requests, by op.",
		}, []string{"op"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "basalt", Subsystem: "chunkserver", Name: "io_latency_seconds",
			Help:    "Latency of successful data-plane IO, from frame read to reply queued.",
			Buckets: latency.Seconds(),
		}, []string{"op"}),
	}
	m.csOps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "basalt", Subsystem: "chunkserver", Name: "copyset_io_ops_total",
		Help: "Successful data-plane IO per copyset (raft group id, hex) and op.",
	}, []string{"copyset", "op"})
	m.csBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "basalt", Subsystem: "chunkserver", Name: "copyset_io_bytes_total",
		Help: "Bytes of successful data-plane IO per copyset (raft group id, hex) and op.",
	}, []string{"copyset", "op"})
	m.walWrite = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "basalt", Subsystem: "chunkserver", Name: "wal_write_seconds",
		Help:    "WAL batch write (one pwrite) latency.",
		Buckets: latency.Seconds(),
	})
	m.walSync = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "basalt", Subsystem: "chunkserver", Name: "wal_fsync_seconds",
		Help:    "WAL batch fdatasync latency (batches that need one).",
		Buckets: latency.Seconds(),
	})
	m.reg.MustRegister(m.csOps, m.csBytes, m.walWrite, m.walSync)
	m.reg.MustRegister(m.ops, m.bytes, m.latency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// done records one answered request. n: payload bytes moved; start zero: no latency.
func (m *metrics) done(op api.Op, st api.Status, n int, start time.Time) {
	if m == nil {
		return
	}
	name := op.String()
	m.ops.WithLabelValues(name, st.String()).Inc()
	if st != api.StatusOK {
		return
	}
	if n > 0 {
		m.bytes.WithLabelValues(name).Add(float64(n))
	}
	if !start.IsZero() {
		m.latency.WithLabelValues(name).Observe(time.Since(start).Seconds())
	}
}

// copysetDone counts one successful IO of n bytes on raft group g.
func (m *metrics) copysetDone(g uint64, op api.Op, n int) {
	if m == nil {
		return
	}
	id, name := strconv.FormatUint(g, 16), op.String()
	m.csOps.WithLabelValues(id, name).Inc()
	m.csBytes.WithLabelValues(id, name).Add(float64(n))
}

// walCommit is the WAL's OnCommit hook.
func (m *metrics) walCommit(write, sync time.Duration, _ int) {
	m.walWrite.Observe(write.Seconds())
	if sync > 0 {
		m.walSync.Observe(sync.Seconds())
	}
}
