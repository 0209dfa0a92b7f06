package client

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basalt-storage/basalt/internal/latency"
	"github.com/basalt-storage/basalt/pkg/api"
)

// Metrics are the client library's Prometheus metrics. One Metrics serves any
// number of volumes (Config.Metrics); nil records nothing.
//
//	basalt_client_io_seconds{op}            Submit → done, all retries included
//	basalt_client_attempt_seconds{op}       one attempt: frame queued → reply handled
//	basalt_client_io_total{volume,op}       IO completed without error
//	basalt_client_io_bytes_total{volume,op} bytes of those IO
//	basalt_client_io_errors_total{volume,op}
//	basalt_client_retries_total{reason}     not_leader, busy, conn
//	basalt_client_local_attempts_total      attempts served by Config.Local
type Metrics struct {
	io, attempt          *prometheus.HistogramVec
	ops, bytes, errs     *prometheus.CounterVec
	retries              *prometheus.CounterVec
	local                prometheus.Counter
	retryNotLeader       prometheus.Counter
	retryBusy, retryConn prometheus.Counter
	ioByOp, attemptByOp  [api.OpCompareAndWrite + 1]prometheus.Observer // by metered op
}

// metered reports whether op is IO the metrics count: the block IO ops and
// compare-and-write (not the fences of Open, nor OpMapped).
func metered(op api.Op) bool { return op.IsBlockIO() || op == api.OpCompareAndWrite }

// NewMetrics creates the client metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		io: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "basalt", Subsystem: "client", Name: "io_seconds",
			Help:    "Latency of one IO through the client library, from Submit to done, retries included.",
			Buckets: latency.Seconds(),
		}, []string{"op"}),
		attempt: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "basalt", Subsystem: "client", Name: "attempt_seconds",
			Help:    "Latency of one attempt of one piece: frame handed to the connection (or Config.Local) to reply handled.",
			Buckets: latency.Seconds(),
		}, []string{"op"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "basalt", Subsystem: "client", Name: "io_total",
			Help: "IO completed without error, per volume and op.",
		}, []string{"volume", "op"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "basalt", Subsystem: "client", Name: "io_bytes_total",
			Help: "Bytes of IO completed without error, per volume and op.",
		}, []string{"volume", "op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "basalt", Subsystem: "client", Name: "io_errors_total",
			Help: "IO completed with an error, per volume and op.",
		}, []string{"volume", "op"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "basalt", Subsystem: "client", Name: "retries_total",
			Help: "Attempts that had to be repeated, by reason.",
		}, []string{"reason"}),
		local: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "basalt", Subsystem: "client", Name: "local_attempts_total",
			Help: "Attempts served in process by Config.Local (the local fast path).",
		}),
	}
	m.retryNotLeader = m.retries.WithLabelValues("not_leader")
	m.retryBusy = m.retries.WithLabelValues("busy")
	m.retryConn = m.retries.WithLabelValues("conn")
	for op := range api.OpCompareAndWrite + 1 {
		if !metered(op) {
			continue
		}
		m.ioByOp[op] = m.io.WithLabelValues(op.String())
		m.attemptByOp[op] = m.attempt.WithLabelValues(op.String())
	}
	reg.MustRegister(m.io, m.attempt, m.ops, m.bytes, m.errs, m.retries, m.local)
	return m
}

// volumeMetrics are one volume's counters, resolved once at Open so an IO does
// no label lookup.
type volumeMetrics struct {
	m                *Metrics
	ops, bytes, errs [api.OpCompareAndWrite + 1]prometheus.Counter
}

func (m *Metrics) forVolume(name string) *volumeMetrics {
	if m == nil {
		return nil
	}
	vm := &volumeMetrics{m: m}
	for op := range api.OpCompareAndWrite + 1 {
		if !metered(op) {
			continue
		}
		vm.ops[op] = m.ops.WithLabelValues(name, op.String())
		vm.bytes[op] = m.bytes.WithLabelValues(name, op.String())
		vm.errs[op] = m.errs.WithLabelValues(name, op.String())
	}
	return vm
}

// ioDone records one completed IO.
func (vm *volumeMetrics) ioDone(op api.Op, n int64, start time.Time, err error) {
	if vm == nil || !metered(op) {
		return
	}
	var me *MiscompareError
	switch {
	case errors.As(err, &me): // an answer, not a failure; nothing written
		vm.ops[op].Inc()
	case err != nil:
		vm.errs[op].Inc()
	default:
		vm.ops[op].Inc()
		if op != api.OpFlush {
			vm.bytes[op].Add(float64(n))
		}
	}
	vm.m.ioByOp[op].Observe(time.Since(start).Seconds())
}

func (vm *volumeMetrics) attemptDone(op api.Op, sent time.Time) {
	if vm == nil || !metered(op) {
		return
	}
	vm.m.attemptByOp[op].Observe(time.Since(sent).Seconds())
}

func (vm *volumeMetrics) retry(c prometheus.Counter) {
	if vm == nil {
		return
	}
	c.Inc()
}

func (vm *volumeMetrics) notLeader() prometheus.Counter {
	if vm == nil {
		return nil
	}
	return vm.m.retryNotLeader
}

func (vm *volumeMetrics) busy() prometheus.Counter {
	if vm == nil {
		return nil
	}
	return vm.m.retryBusy
}

func (vm *volumeMetrics) conn() prometheus.Counter {
	if vm == nil {
		return nil
	}
	return vm.m.retryConn
}
