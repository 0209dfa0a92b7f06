package raftstore

import (
	"context"
	"fmt"
	"log/slog"
)

// raftLogger adapts slog to raft.Logger, tagging every line with the group id.
// raft's Info lines (every vote, every term change) go out at Debug: with a
// hundred groups per chunkserver they would flood the log on each election;
// `basalt status` shows leaders and terms instead.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) enabled(level slog.Level) bool { return r.l.Enabled(context.Background(), level) }

func (r raftLogger) out(level slog.Level, msg string) {
	r.l.Log(context.Background(), level, "raft: "+msg)
}

func (r raftLogger) Debug(v ...any) {
	if r.enabled(slog.LevelDebug) {
		r.out(slog.LevelDebug, fmt.Sprint(v...))
	}
}
func (r raftLogger) Debugf(format string, v ...any) {
	if r.enabled(slog.LevelDebug) {
		r.out(slog.LevelDebug, fmt.Sprintf(format, v...))
	}
}
func (r raftLogger) Info(v ...any)                 { r.Debug(v...) }
func (r raftLogger) Infof(format string, v ...any) { r.Debugf(format, v...) }
func (r raftLogger) Warning(v ...any)              { r.out(slog.LevelWarn, fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...any) {
	r.out(slog.LevelWarn, fmt.Sprintf(format, v...))
}
func (r raftLogger) Error(v ...any) { r.out(slog.LevelError, fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...any) {
	r.out(slog.LevelError, fmt.Sprintf(format, v...))
}

// Fatal and Panic mean raft found its own state impossible: log, then panic (raft
// expects these calls not to return).
func (r raftLogger) Fatal(v ...any) { r.Panic(v...) }
func (r raftLogger) Fatalf(format string, v ...any) {
	r.Panicf(format, v...)
}
func (r raftLogger) Panic(v ...any) {
	s := fmt.Sprint(v...)
	r.out(slog.LevelError, s)
	panic("raft: " + s)
}
func (r raftLogger) Panicf(format string, v ...any) {
	s := fmt.Sprintf(format, v...)
	r.out(slog.LevelError, s)
	panic("raft: " + s)
}
