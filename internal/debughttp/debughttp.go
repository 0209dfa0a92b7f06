// Package debughttp serves a daemon's observability endpoints: Prometheus
// /metrics from the daemon's own registry (never the default one, which
// embedded etcd fills) on the --metrics listener, and Go's /debug/pprof/
// profiles (`go tool pprof http://ADDR/debug/pprof/profile?seconds=10`)
// only on a separate --debug-listen listener an operator asked for: a
// profile or the command line reveals too much to serve next to metrics
// (docs/security.md).
package debughttp

import (
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Mux returns a handler serving only /metrics from reg.
func Mux(reg prometheus.Gatherer) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// DebugMux returns a handler serving only Go's /debug/pprof/.
func DebugMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Serve listens on addr and serves Mux(reg) until the returned server is closed.
func Serve(addr string, reg prometheus.Gatherer) (*http.Server, net.Addr, error) {
	return serve(addr, Mux(reg))
}

// ServeDebug listens on addr and serves DebugMux until the returned server
// is closed.
func ServeDebug(addr string) (*http.Server, net.Addr, error) {
	return serve(addr, DebugMux())
}

func serve(addr string, h http.Handler) (*http.Server, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	s := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	go s.Serve(ln)
	return s, ln.Addr(), nil
}

// NewRegistry returns a registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
