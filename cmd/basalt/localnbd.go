package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"

	"github.com/basalt-storage/basalt/internal/chunkserver"
	"github.com/basalt-storage/basalt/internal/frontend/nbd"
	"github.com/basalt-storage/basalt/internal/frontend/volumes"
	"github.com/basalt-storage/basalt/pkg/client"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// startLocalNBD serves NBD from inside a chunkserver (DESIGN §7): the volumes'
// clients take the local fast path (client.Config.Local) for every copyset this
// chunkserver leads, and the network for the rest. Its metrics go to the
// chunkserver's registry. The returned stop closes the front end and the volumes
// (call it before the chunkserver stops, so in-flight IO can finish).
func startLocalNBD(cs *chunkserver.ChunkServer, mds []string, listen, socket string) (stop func(), err error) {
	mc, err := mdsclient.Dial(mds)
	if err != nil {
		return nil, err
	}
	log := slog.Default().With("component", "nbd")
	host, _ := os.Hostname()
	reg := cs.Registry()
	exports := volumes.New(volumes.Config{
		MDS: mds, Lister: mc, Logger: log, Local: cs, Metrics: client.NewMetrics(reg),
		ClientName: fmt.Sprintf("chunkserver-nbd@%s/%d", host, os.Getpid()),
	})
	srv, err := nbd.NewServer(nbd.Config{Exports: exports, ErrorCode: volumes.NBDErrorCode, Logger: log, Metrics: nbd.NewMetrics(reg)})
	if err != nil {
		exports.Close()
		mc.Close()
		return nil, err
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			srv.Close()
			exports.Close()
			mc.Close()
		})
	}
	if listen != "" {
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			stop()
			return nil, fmt.Errorf("--nbd-listen: %w", err)
		}
		log.Info("serving NBD in process", "addr", ln.Addr().String())
		go srv.Serve(ln)
	}
	if socket != "" {
		_ = os.Remove(socket)
		ln, err := net.Listen("unix", socket)
		if err != nil {
			stop()
			return nil, fmt.Errorf("--nbd-socket: %w", err)
		}
		log.Info("serving NBD in process", "addr", socket)
		go srv.Serve(ln)
	}
	return stop, nil
}
