package scrub

import "github.com/prometheus/client_golang/prometheus"

// collector exports a Scrubber's Stats as Prometheus counters at scrape time.
type collector struct {
	s     *Scrubber
	descs [7]*prometheus.Desc
}

// Collector returns a prometheus.Collector of s's counts, named
// <prefix>scrub_<what>_total (e.g. prefix "basalt_chunkserver_"):
// passes, copysets, chunks_compared, mismatches, unsettled, unreachable, bytes.
func (s *Scrubber) Collector(prefix string) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prefix+"scrub_"+name+"_total", help, nil, nil)
	}
	return &collector{s: s, descs: [7]*prometheus.Desc{
		d("passes", "Background scrub passes over every led copyset completed."),
		d("copysets", "Copyset replica comparisons completed."),
		d("chunks_compared", "Chunks compared across replicas."),
		d("mismatches", "Chunks whose replicas persistently differ (each pass counts again)."),
		d("unsettled", "Chunks that kept changing while re-checked (not judged)."),
		d("unreachable", "Replicas that could not be asked for checksums."),
		d("bytes", "Chunk bytes the replicas read to checksum them."),
	}}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	for i, v := range [7]uint64{st.Passes, st.CopysetsScrubbed, st.ChunksCompared, st.Mismatches,
		st.Unsettled, st.Unreachable, st.BytesChecksummed} {
		ch <- prometheus.MustNewConstMetric(c.descs[i], prometheus.CounterValue, float64(v))
	}
}
