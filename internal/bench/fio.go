package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Stats is what one fio job measured, reduced to the table's figures.
type Stats struct {
	IOPS     float64 // IOs per second, reads and writes together
	BWBytes  float64 // bytes per second, reads and writes together
	MeanNs   float64 // mean total latency (lat_ns)
	P99Ns    float64 // 99th percentile total latency (lat_ns; clat_ns when fio gave no lat percentiles)
	TotalIOs uint64  // IOs completed after the ramp
	// P99Approx is set when the p99 is not one exact percentile over all IOs:
	// read and write reported apart (the larger is taken), or the durable
	// write+sync upper bound.
	P99Approx bool
}

// ErrFioJob: fio ran but reported an error for the job.
var ErrFioJob = errors.New("bench: fio job failed")

// fioOutput is the part of `fio --output-format=json` the bench reads.
type fioOutput struct {
	Version string   `json:"fio version"`
	Jobs    []fioJob `json:"jobs"`
}

type fioJob struct {
	Name  string  `json:"jobname"`
	Error int     `json:"error"`
	Read  *fioDir `json:"read"`
	Write *fioDir `json:"write"`
	Mixed *fioDir `json:"mixed"` // unified_rw_reporting=mixed
	Sync  *fioDir `json:"sync"`  // fsync/fdatasync latencies
}

type fioDir struct {
	IOBytes  uint64  `json:"io_bytes"`
	BWBytes  float64 `json:"bw_bytes"`
	IOPS     float64 `json:"iops"`
	TotalIOs uint64  `json:"total_ios"`
	Lat      fioLat  `json:"lat_ns"`
	CLat     fioLat  `json:"clat_ns"`
}

type fioLat struct {
	N          uint64             `json:"N"`
	Mean       float64            `json:"mean"`
	Percentile map[string]float64 `json:"percentile"`
}

// percentile returns the p-th percentile fio reported ("99.000000"), or NaN.
func (l fioLat) percentile(p float64) float64 {
	for k, v := range l.Percentile {
		if f, err := strconv.ParseFloat(k, 64); err == nil && math.Abs(f-p) < 1e-9 {
			return v
		}
	}
	return math.NaN()
}

// p99 prefers the total-latency percentile and falls back to completion latency.
func (d *fioDir) p99() float64 {
	if v := d.Lat.percentile(99); !math.IsNaN(v) {
		return v
	}
	return d.CLat.percentile(99)
}

// ParseFio reads the JSON fio wrote for one job (one job, or group_reporting) and
// returns its figures and fio's version string. Text fio may print before the JSON
// (warnings) is skipped. durable marks a fdatasync=1 job; see the package doc for
// how its latency is reported.
func ParseFio(data []byte, durable bool) (Stats, string, error) {
	if i := bytes.IndexByte(data, '{'); i > 0 {
		data = data[i:]
	}
	var out fioOutput
	if err := json.Unmarshal(data, &out); err != nil {
		return Stats{}, "", fmt.Errorf("bench: fio JSON: %w", err)
	}
	if len(out.Jobs) == 0 {
		return Stats{}, out.Version, fmt.Errorf("bench: fio JSON has no jobs")
	}
	j := out.Jobs[0]
	if j.Error != 0 {
		return Stats{}, out.Version, fmt.Errorf("%w: %s: error %d", ErrFioJob, j.Name, j.Error)
	}
	var s Stats
	switch {
	case j.Mixed != nil:
		s = dirStats(j.Mixed)
	default:
		var dirs []*fioDir
		for _, d := range []*fioDir{j.Read, j.Write} {
			if d != nil && d.TotalIOs > 0 {
				dirs = append(dirs, d)
			}
		}
		switch len(dirs) {
		case 0:
			return Stats{}, out.Version, fmt.Errorf("%w: %s completed no IO", ErrFioJob, j.Name)
		case 1:
			s = dirStats(dirs[0])
		default:
			s = mergeDirs(dirs[0], dirs[1])
		}
	}
	if s.TotalIOs == 0 {
		return Stats{}, out.Version, fmt.Errorf("%w: %s completed no IO", ErrFioJob, j.Name)
	}
	if durable && j.Sync != nil && s.IOPS > 0 {
		// fio submits the fdatasync while the write is in flight, so the two
		// latencies overlap: at QD1 the time per durable write is 1/IOPS.
		s.MeanNs = 1e9 / s.IOPS
		if sp := j.Sync.Lat.percentile(99); !math.IsNaN(sp) {
			s.P99Ns += sp
			s.P99Approx = true
		}
	}
	return s, out.Version, nil
}

func dirStats(d *fioDir) Stats {
	return Stats{IOPS: d.IOPS, BWBytes: d.BWBytes, MeanNs: d.Lat.Mean, P99Ns: d.p99(), TotalIOs: d.TotalIOs}
}

// mergeDirs combines reads and writes reported apart: sums, an IO-weighted mean,
// and the larger p99 (percentiles do not combine exactly).
func mergeDirs(a, b *fioDir) Stats {
	n := float64(a.TotalIOs + b.TotalIOs)
	return Stats{
		IOPS:      a.IOPS + b.IOPS,
		BWBytes:   a.BWBytes + b.BWBytes,
		MeanNs:    (a.Lat.Mean*float64(a.TotalIOs) + b.Lat.Mean*float64(b.TotalIOs)) / n,
		P99Ns:     math.Max(a.p99(), b.p99()),
		TotalIOs:  a.TotalIOs + b.TotalIOs,
		P99Approx: true,
	}
}
