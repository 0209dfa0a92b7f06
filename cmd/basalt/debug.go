package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/internal/debughttp"
)

// debugFlag adds --debug-listen: Go's pprof profiles, on a listener of
// their own (--metrics serves only /metrics).
func debugFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("debug-listen", "", "serve Go's /debug/pprof/ profiles on this address (empty: none; keep it on localhost)")
}

// serveDebug serves pprof on addr unless it is empty; stop closes it.
func serveDebug(addr string) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	hs, a, err := debughttp.ServeDebug(addr)
	if err != nil {
		return nil, fmt.Errorf("--debug-listen: %w", err)
	}
	slog.Info("serving pprof", "addr", a.String())
	return func() { hs.Close() }, nil
}
