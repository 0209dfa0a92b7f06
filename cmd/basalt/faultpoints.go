package main

import (
	"io"

	"github.com/basalt-storage/basalt/internal/chunkserver"
	"github.com/basalt-storage/basalt/internal/faultpoint"
	"github.com/basalt-storage/basalt/internal/raftstore"
)

// armFaultPoints wires every point of fp (internal/faultpoint) into the
// chunkserver's knobs, keeping the hooks already there (--fault-slow-disk-file).
func armFaultPoints(k *chunkserver.Knobs, fp *faultpoint.Set) {
	beforeSync := k.WAL.BeforeSync
	k.WAL.BeforeSync = func() error {
		if err := fp.Hit(faultpoint.WALBeforeSync); err != nil {
			return err
		}
		if beforeSync != nil {
			return beforeSync()
		}
		return nil
	}
	afterSync := k.WAL.AfterSync
	k.WAL.AfterSync = func() {
		_ = fp.Hit(faultpoint.WALAfterSync)
		if afterSync != nil {
			afterSync()
		}
	}
	installStep := k.Datastore.BeforeInstallStep
	k.Datastore.BeforeInstallStep = func(step int) error {
		if step == 2 { // the old chunks moved aside, the new ones not in place
			if err := fp.Hit(faultpoint.SnapshotInstall); err != nil {
				return err
			}
		}
		if installStep != nil {
			return installStep(step)
		}
		return nil
	}
	k.Transport = func(t raftstore.Transport) raftstore.Transport { return &faultTransport{Transport: t, fp: fp} }
	k.AfterMoveStep = func(_ uint64, step raftstore.MoveStep) {
		switch step.Kind {
		case raftstore.MoveAddLearner:
			_ = fp.Hit(faultpoint.MoveLearnerAdded)
		case raftstore.MoveReplace:
			_ = fp.Hit(faultpoint.MoveJoint)
		}
	}
}

// faultTransport is the raft transport with the raft-before-send and
// snapshot-send points.
type faultTransport struct {
	raftstore.Transport
	fp *faultpoint.Set
}

func (t *faultTransport) Send(msgs []raftstore.Message) {
	for _, m := range msgs {
		if len(m.Msg.GetEntries()) > 0 {
			if t.fp.Hit(faultpoint.RaftBeforeSend) != nil {
				return // the action error: the batch is lost on the way
			}
			break
		}
	}
	t.Transport.Send(msgs)
}

func (t *faultTransport) SendSnapshot(m raftstore.Message, write func(io.Writer) error) error {
	return t.Transport.SendSnapshot(m, func(w io.Writer) error {
		return write(&faultWriter{w: w, fp: t.fp})
	})
}

// faultWriter hits snapshot-send once per faultpoint.SnapshotSendStep bytes
// written through it.
type faultWriter struct {
	w  io.Writer
	fp *faultpoint.Set
	n  int64
}

func (w *faultWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	before := w.n / faultpoint.SnapshotSendStep
	w.n += int64(n)
	for range w.n/faultpoint.SnapshotSendStep - before {
		if ferr := w.fp.Hit(faultpoint.SnapshotSend); ferr != nil {
			return n, ferr
		}
	}
	return n, err
}
