// Package linearize records the client operations of a test on a set of 4 KiB
// blocks and checks the history for linearizability with porcupine
// (github.com/anishathalye/porcupine), against a model where each block is a
// register: a read returns the value of the last write linearized before it.
//
// A write that returned an error or timed out may still be applied, at any
// later moment (a raft entry proposed before the timeout can commit after it):
// it is recorded as pending, its return at the end of the history, which lets
// porcupine linearize it anywhere after its invocation or never. A read that
// failed says nothing and is left out.
//
// Values are uint64, never 0 for a write: 0 is the block's initial content
// (zeros). Encode fills a block with a value; Decode reads it back and returns
// Torn for a block that is not one value repeated, which no write wrote, so
// the model rejects it.
package linearize

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// BlockSize is the size of one register.
const BlockSize = 4096

// Torn is the value Decode returns for a block that holds no single value.
const Torn = math.MaxUint64

// Input is an operation's request.
type Input struct {
	Block int
	Write bool
	Value uint64 // a write's value
}

// Output is an operation's result: a read's value. Pending marks a write
// whose outcome is unknown.
type Output struct {
	Value   uint64
	Pending bool
}

// Recorder collects operations from concurrent clients.
type Recorder struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
}

// NewRecorder starts a history; times count from now (monotonic).
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

// Call is an operation in flight.
type Call struct {
	r      *Recorder
	client int
	in     Input
	call   int64
}

// Invoke records the invocation of an operation by client (an index from 0;
// one client issues one operation at a time).
func (r *Recorder) Invoke(client int, in Input) *Call {
	return &Call{r: r, client: client, in: in, call: r.now()}
}

// Ok records a successful return; value is what a read returned (ignored for
// a write).
func (c *Call) Ok(value uint64) {
	ret := c.r.now()
	if c.in.Write {
		value = 0
	}
	c.r.add(porcupine.Operation{ClientId: c.client, Input: c.in, Call: c.call, Output: Output{Value: value}, Return: ret})
}

// Fail records an operation that returned an error: a write becomes pending
// (possibly applied, now or later); a read is dropped.
func (c *Call) Fail(err error) {
	if !c.in.Write {
		return
	}
	c.r.add(porcupine.Operation{ClientId: c.client, Input: c.in, Call: c.call, Output: Output{Pending: true},
		Return: -1, Metadata: fmt.Sprint(err)})
}

func (r *Recorder) add(op porcupine.Operation) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// Operations returns the history so far: pending writes return after every
// other operation.
func (r *Recorder) Operations() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := r.now()
	for _, op := range r.ops {
		end = max(end, op.Return)
	}
	out := make([]porcupine.Operation, len(r.ops))
	copy(out, r.ops)
	for i := range out {
		if out[i].Return < 0 {
			out[i].Return = end + 1
		}
	}
	return out
}

// Counts returns how many writes succeeded, how many are pending and how
// many reads were recorded.
func (r *Recorder) Counts() (writes, pending, reads int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, op := range r.ops {
		switch {
		case !op.Input.(Input).Write:
			reads++
		case op.Output.(Output).Pending:
			pending++
		default:
			writes++
		}
	}
	return
}

// Model is the per-block register model.
var Model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byBlock := map[int][]porcupine.Operation{}
		for _, op := range history {
			b := op.Input.(Input).Block
			byBlock[b] = append(byBlock[b], op)
		}
		keys := make([]int, 0, len(byBlock))
		for k := range byBlock {
			keys = append(keys, k)
		}
		sort.Ints(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byBlock[k])
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		in, out := input.(Input), output.(Output)
		if in.Write {
			return true, in.Value
		}
		return out.Value == state.(uint64), state
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(Input), output.(Output)
		switch {
		case in.Write && out.Pending:
			return fmt.Sprintf("write(b%d, %#x) -> unknown", in.Block, in.Value)
		case in.Write:
			return fmt.Sprintf("write(b%d, %#x)", in.Block, in.Value)
		case out.Value == Torn:
			return fmt.Sprintf("read(b%d) -> TORN", in.Block)
		}
		return fmt.Sprintf("read(b%d) -> %#x", in.Block, out.Value)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("%#x", state.(uint64)) },
}

// Check checks the history within timeout (porcupine.Unknown when it ran out).
func Check(ops []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	return porcupine.CheckOperationsVerbose(Model, ops, timeout)
}

// Visualize writes porcupine's HTML view of a checked history to path.
func Visualize(info porcupine.LinearizationInfo, path string) error {
	return porcupine.VisualizePath(Model, info, path)
}

// Encode fills a BlockSize buffer with v.
func Encode(v uint64) []byte {
	b := make([]byte, BlockSize)
	for i := 0; i < BlockSize; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], v)
	}
	return b
}

// Decode returns the value a block holds, or Torn.
func Decode(b []byte) uint64 {
	v := binary.LittleEndian.Uint64(b)
	for i := 8; i+8 <= len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) != v {
			return Torn
		}
	}
	return v
}

// Explain finds, for each block whose history is not linearizable, the
// earliest moment T such that the operations that returned by T (with the
// writes invoked by T and still running taken as of unknown outcome) are not
// linearizable, and lists the operations of that block up to T: the last read
// there returned a value no order of what came before can explain. ctxOps
// bounds the lines per block.
func Explain(ops []porcupine.Operation, ctxOps int, timeout time.Duration) string {
	var b strings.Builder
	for _, part := range Model.Partition(ops) {
		if porcupine.CheckOperationsTimeout(Model, part, timeout) != porcupine.Illegal {
			continue
		}
		upTo := func(t int64) []porcupine.Operation {
			var out []porcupine.Operation
			for _, op := range part {
				switch {
				case op.Return <= t:
					out = append(out, op)
				case op.Call <= t && op.Input.(Input).Write:
					op.Output, op.Return = Output{Pending: true}, t+1
					out = append(out, op)
				}
			}
			return out
		}
		rets := make([]int64, len(part))
		for i, op := range part {
			rets[i] = op.Return
		}
		sort.Slice(rets, func(i, j int) bool { return rets[i] < rets[j] })
		i := sort.Search(len(rets), func(i int) bool {
			return porcupine.CheckOperationsTimeout(Model, upTo(rets[i]), timeout) == porcupine.Illegal
		})
		if i == len(rets) {
			i--
		}
		prefix := upTo(rets[i])
		sort.Slice(prefix, func(i, j int) bool { return prefix[i].Call < prefix[j].Call })
		blk := part[0].Input.(Input).Block
		fmt.Fprintf(&b, "block %d: %d operations; not linearizable by %.3f ms; its last %d operations by then (times in ms from the start; a pending write's end is shown as 'end'):\n",
			blk, len(part), float64(rets[i])/1e6, min(ctxOps, len(prefix)))
		shown := prefix[max(0, len(prefix)-ctxOps):]
		// Earlier operations that wrote or read a value read in the window:
		// where the value came from.
		seen := map[uint64]bool{}
		for _, op := range shown {
			if !op.Input.(Input).Write {
				seen[op.Output.(Output).Value] = true
			}
		}
		var earlier []porcupine.Operation
		for _, op := range prefix[:len(prefix)-len(shown)] {
			in := op.Input.(Input)
			if (in.Write && seen[in.Value]) || (!in.Write && seen[op.Output.(Output).Value]) {
				earlier = append(earlier, op)
			}
		}
		if len(earlier) > ctxOps {
			earlier = earlier[len(earlier)-ctxOps:]
		}
		if len(earlier) > 0 {
			b.WriteString("  ... (earlier, only those with a value read below)\n")
		}
		for _, op := range append(earlier, shown...) {
			end := fmt.Sprintf("%.3f", float64(op.Return)/1e6)
			if op.Output.(Output).Pending {
				end = "end"
			}
			fmt.Fprintf(&b, "  client %d [%.3f, %s] %s", op.ClientId, float64(op.Call)/1e6, end,
				Model.DescribeOperation(op.Input, op.Output))
			if op.Metadata != nil && op.Metadata != "" {
				fmt.Fprintf(&b, " (%v)", op.Metadata)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
