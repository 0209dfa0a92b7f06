package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "basalt",
		Short:         "basalt: replicated block storage for databases",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("log-level", envOr("BASALT_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	root.PersistentFlags().String("log-file", "", "append logs to this file instead of stderr")
	logToFile := false
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		lvl, _ := cmd.Flags().GetString("log-level")
		var level slog.Level
		if err := level.UnmarshalText([]byte(lvl)); err != nil {
			return fmt.Errorf("--log-level: %w", err)
		}
		var out io.Writer = os.Stderr
		if path, _ := cmd.Flags().GetString("log-file"); path != "" {
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return fmt.Errorf("--log-file: %w", err)
			}
			out, logToFile = f, true
		}
		slog.SetDefault(slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level})))
		return nil
	}
	root.AddCommand(
		mdsCommand(),
		chunkserverCommand(),
		nbdCommand(),
		nvmfCommand(),
		iscsiCommand(),
		csiCommand(),
		playgroundCommand(),
		poolCommand(),
		volumeCommand(),
		statusCommand(),
		benchCommand(),
		checkCommand(),
		certCommand(),
	)
	if err := root.Execute(); err != nil {
		if logToFile {
			// The log is where an operator looks first (the playground's
			// chunkservers write stderr nowhere else).
			slog.Error("exiting", "err", err)
		}
		fmt.Fprintln(os.Stderr, "basalt:", err)
		os.Exit(1)
	}
}

// signalContext is cancelled on SIGINT or SIGTERM, so daemons stop cleanly.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// splitList turns "a,b , c" into [a b c].
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// writePIDFile records this process's pid, so scripts (and the playground) can stop it.
func writePIDFile(path string) error {
	if path == "" {
		return nil
	}
	return os.WriteFile(path, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644)
}

// mdsFlag adds the --mds flag every client of the MDS takes.
func mdsFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("mds", envOr("BASALT_MDS", "127.0.0.1:6700"), "MDS addresses, comma-separated (env BASALT_MDS)")
}
