package nbd

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basalt-storage/basalt/internal/latency"
)

// Metrics are the NBD server's Prometheus metrics (Config.Metrics; nil records
// nothing):
//
//	basalt_nbd_request_seconds{cmd}   header parsed (write: before its payload is read) → reply written
//	basalt_nbd_backend_seconds{cmd}   Backend.Submit → done (the client library's share)
//	basalt_nbd_reply_seconds          done → reply written (queueing for the writer, writev)
//	basalt_nbd_reply_batch            replies per writev
type Metrics struct {
	request, backend [cmdWriteZeroes + 1]prometheus.Observer
	reply, batch     prometheus.Observer
}

// NewMetrics creates the NBD metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := latency.Seconds()
	req := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "basalt", Subsystem: "nbd", Name: "request_seconds",
		Help:    "NBD request latency: header parsed to reply written.",
		Buckets: buckets,
	}, []string{"cmd"})
	be := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "basalt", Subsystem: "nbd", Name: "backend_seconds",
		Help:    "Backend (client library) latency of an NBD request: Submit to done.",
		Buckets: buckets,
	}, []string{"cmd"})
	rep := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "basalt", Subsystem: "nbd", Name: "reply_seconds",
		Help:    "Backend done to reply written (writer queueing and writev).",
		Buckets: buckets,
	})
	batch := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "basalt", Subsystem: "nbd", Name: "reply_batch",
		Help:    "Replies written by one writev.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 9),
	})
	reg.MustRegister(req, be, rep, batch)
	m := &Metrics{reply: rep, batch: batch}
	for cmd, name := range map[uint16]string{cmdRead: "read", cmdWrite: "write", cmdFlush: "flush",
		cmdTrim: "trim", cmdWriteZeroes: "write_zeroes"} {
		m.request[cmd] = req.WithLabelValues(name)
		m.backend[cmd] = be.WithLabelValues(name)
	}
	return m
}

// replied records the requests of one written batch.
func (m *Metrics) replied(batch []*request, now time.Time) {
	if m == nil {
		return
	}
	m.batch.Observe(float64(len(batch)))
	for _, r := range batch {
		if r.start.IsZero() || int(r.typ) >= len(m.request) || m.request[r.typ] == nil {
			continue
		}
		m.request[r.typ].Observe(now.Sub(r.start).Seconds())
		if !r.submitted.IsZero() && !r.finished.IsZero() {
			m.backend[r.typ].Observe(r.finished.Sub(r.submitted).Seconds())
			m.reply.Observe(now.Sub(r.finished).Seconds())
		}
	}
}
