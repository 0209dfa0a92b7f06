package linearize

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// op builds an operation with explicit times (the recorder's clock is real).
func op(client, block int, write bool, value uint64, call, ret int64, pending bool) porcupine.Operation {
	in := Input{Block: block, Write: write}
	out := Output{Pending: pending}
	if write {
		in.Value = value
	} else {
		out.Value = value
	}
	return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
}

func check(t *testing.T, ops []porcupine.Operation) porcupine.CheckResult {
	t.Helper()
	res, info := Check(ops, 10*time.Second)
	if res == porcupine.Illegal {
		// The visualization must be writable for a rejected history.
		if err := Visualize(info, filepath.Join(t.TempDir(), "h.html")); err != nil {
			t.Fatalf("visualize: %v", err)
		}
	}
	return res
}

func TestLinearizableHistoryAccepted(t *testing.T) {
	ops := []porcupine.Operation{
		op(0, 0, true, 1, 0, 10, false),
		op(1, 0, false, 0, 1, 5, false), // concurrent with the write: old value allowed
		op(1, 0, false, 1, 11, 20, false),
		op(0, 1, true, 7, 12, 30, false),
		op(2, 1, false, 7, 25, 40, false), // concurrent, new value allowed
		op(2, 0, false, 1, 41, 50, false),
	}
	if res := check(t, ops); res != porcupine.Ok {
		t.Fatalf("a linearizable history: %s", res)
	}
}

// A read that returns a value overwritten by a write acknowledged before the
// read began is a stale read: rejected.
func TestStaleReadRejected(t *testing.T) {
	ops := []porcupine.Operation{
		op(0, 0, true, 1, 0, 10, false),
		op(0, 0, true, 2, 20, 30, false),
		op(1, 0, false, 1, 40, 50, false), // stale: 2 was acknowledged at 30
	}
	if res := check(t, ops); res != porcupine.Illegal {
		t.Fatalf("a stale read: %s, want Illegal", res)
	}
	// The same read on another block is fine: blocks are separate registers.
	ops[2] = op(1, 1, false, 0, 40, 50, false)
	if res := check(t, ops); res != porcupine.Ok {
		t.Fatalf("other block: %s", res)
	}
}

// A lost acknowledged write (a later read sees the old value) is rejected.
func TestLostWriteRejected(t *testing.T) {
	ops := []porcupine.Operation{
		op(0, 3, true, 5, 0, 10, false),
		op(1, 3, false, 0, 20, 30, false),
	}
	if res := check(t, ops); res != porcupine.Illegal {
		t.Fatalf("a lost write: %s, want Illegal", res)
	}
}

// A torn block (no single value) is rejected.
func TestTornReadRejected(t *testing.T) {
	b := Encode(9)
	b[100] ^= 1
	if Decode(b) != Torn || Decode(Encode(9)) != 9 || Decode(make([]byte, BlockSize)) != 0 {
		t.Fatal("Decode")
	}
	ops := []porcupine.Operation{op(0, 0, true, 9, 0, 10, false), op(0, 0, false, Torn, 20, 30, false)}
	if res := check(t, ops); res != porcupine.Illegal {
		t.Fatalf("a torn read: %s, want Illegal", res)
	}
}

// A write of unknown outcome may take effect at any time after it began, or
// never; but once a read saw it, a later read may not see the older value.
func TestPendingWrite(t *testing.T) {
	r := NewRecorder()
	r.Invoke(0, Input{Block: 0, Write: true, Value: 1}).Ok(0)
	r.Invoke(0, Input{Block: 0, Write: true, Value: 2}).Fail(errors.New("timeout"))
	r.Invoke(1, Input{Block: 0}).Ok(1) // not applied yet
	r.Invoke(1, Input{Block: 0}).Ok(2) // applied now
	r.Invoke(1, Input{Block: 0}).Fail(errors.New("x"))
	if w, p, rd := r.Counts(); w != 1 || p != 1 || rd != 2 {
		t.Fatalf("counts %d %d %d", w, p, rd)
	}
	if res := check(t, r.Operations()); res != porcupine.Ok {
		t.Fatalf("pending write seen late: %s", res)
	}
	r.Invoke(1, Input{Block: 0}).Ok(1) // back to the old value: impossible
	if res := check(t, r.Operations()); res != porcupine.Illegal {
		t.Fatalf("pending write seen, then the old value: %s, want Illegal", res)
	}
}

func TestVisualizeWrites(t *testing.T) {
	_, info := Check([]porcupine.Operation{op(0, 0, true, 1, 0, 10, false)}, time.Second)
	p := filepath.Join(t.TempDir(), "h.html")
	if err := Visualize(info, p); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p); err != nil || st.Size() == 0 {
		t.Fatalf("visualization: %v", err)
	}
}

// Explain names the block and ends at the stale read.
func TestExplain(t *testing.T) {
	ops := []porcupine.Operation{
		op(0, 0, true, 1, 0, 10, false),
		op(1, 1, false, 0, 0, 10, false),
		op(0, 0, true, 2, 20, 30, false),
		op(1, 0, false, 1, 40, 50, false),
		op(1, 0, false, 2, 60, 70, false),
	}
	s := Explain(ops, 10, time.Second)
	if !strings.Contains(s, "block 0:") || strings.Contains(s, "block 1:") ||
		!strings.Contains(s, "read(b0) -> 0x1") || strings.Contains(s, "read(b0) -> 0x2") {
		t.Fatalf("Explain:\n%s", s)
	}
}
