package raftstore

import (
	"context"
	"fmt"
	"log/slog"
)

// raftLogger adapts slog to raft.Logger, tagging every line with the group id.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) out(level slog.Level, msg string) {
	r.l.Log(context.Background(), level, "raft: "+msg)
}

func (r raftLogger) Debug(v ...any) { r.out(slog.LevelDebug, fmt.Sprint(v...)) }
func (r raftLogger) Debugf(format string, v ...any) {
	r.out(slog.LevelDebug, fmt.Sprintf(format, v...))
}
func (r raftLogger) Info(v ...any)                 { r.out(slog.LevelInfo, fmt.Sprint(v...)) }
func (r raftLogger) Infof(format string, v ...any) { r.out(slog.LevelInfo, fmt.Sprintf(format, v...)) }
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
