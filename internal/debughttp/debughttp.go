// Package debughttp serves a daemon's observability endpoints on one HTTP
// listener: Prometheus /metrics from the daemon's own registry (never the
// default one, which embedded etcd fills) and Go's /debug/pprof/ profiles
// (`go tool pprof http://ADDR/debug/pprof/profile?seconds=10`).
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

// Mux returns a handler serving /metrics from reg and /debug/pprof/.
func Mux(reg prometheus.Gatherer) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Serve listens on addr and serves Mux(reg) until the returned server is closed.
func Serve(addr string, reg prometheus.Gatherer) (*http.Server, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	s := &http.Server{Handler: Mux(reg), ReadHeaderTimeout: 5 * time.Second}
	go s.Serve(ln)
	return s, ln.Addr(), nil
}

// NewRegistry returns a registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
