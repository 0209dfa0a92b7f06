package chunkserver

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basalt-storage/basalt/internal/transport"
	"github.com/basalt-storage/basalt/pkg/api"
)

// metrics are the chunkserver's Prometheus metrics, on its own registry.
type metrics struct {
	reg     *prometheus.Registry
	ops     *prometheus.CounterVec   // op, status
	bytes   *prometheus.CounterVec   // op
	latency *prometheus.HistogramVec // op (successful IO only)
}

func opName(op transport.Op) string {
	switch op {
	case transport.OpRead:
		return "read"
	case transport.OpWrite:
		return "write"
	case transport.OpTrim:
		return "trim"
	case transport.OpWriteZeroes:
		return "write_zeroes"
	case transport.OpFlush:
		return "flush"
	case transport.OpPing:
		return "ping"
	case transport.OpChecksum:
		return "checksum"
	case transport.OpRaft:
		return "raft"
	case transport.OpSnapshot:
		return "snapshot"
	}
	return "unknown"
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
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
		}, []string{"op"}),
	}
	m.reg.MustRegister(m.ops, m.bytes, m.latency,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// done records one answered request. n: payload bytes moved; start zero: no latency.
func (m *metrics) done(op transport.Op, st api.Status, n int, start time.Time) {
	if m == nil {
		return
	}
	name := opName(op)
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
