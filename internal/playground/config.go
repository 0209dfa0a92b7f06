package playground

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"github.com/basalt-storage/basalt/internal/frontend/nbd"
)

// Config describes the playground to run.
type Config struct {
	Dir       string // all data and logs; default ./basalt-data
	Volume    string // default "demo"
	Size      uint64 // volume size; default 8 GiB
	NBDListen string // default 127.0.0.1:10809
	NBDSocket string // default DIR/nbd.sock
	// NBDTLS and NBDSocketTLS are the NBD_OPT_STARTTLS policies of the two
	// NBD listeners: "off", "allow" or "require"; default "allow" (plaintext
	// for the kernel's nbd-client and the tour, nbds:// with the
	// certificates in DIR/tls/nbd-client).
	NBDTLS, NBDSocketTLS string
	PortBase             int // MDS on PortBase, etcd on +1/+2, the iSCSI portal on +3, chunkservers on +11.., metrics on +21.., NVMe/TCP on +28; default 6700
	// NVMfListen is the NVMe over TCP target's address; default 127.0.0.1:PortBase+28.
	NVMfListen string
	// ISCSIListen is the iSCSI portal; default 127.0.0.1:PortBase+3.
	ISCSIListen  string
	Chunkservers int    // default 3
	Copysets     uint32 // copysets of the pool; 0 = the MDS default
	Binary       string // the basalt binary to start chunkservers with; default this executable
	// Metrics: where this process serves /metrics (NBD front end, client library,
	// Go runtime); "" = nowhere.
	Metrics string
	// DebugListen: where this process serves Go's /debug/pprof/; "" = nowhere.
	DebugListen string
	// Procs is GOMAXPROCS for this process and each chunkserver: 0 shares the CPUs
	// among them (NumCPU / (Chunkservers+1), at least 1) unless the GOMAXPROCS
	// environment variable is set; negative leaves Go's default.
	Procs int
	// DataMode is the chunkservers' --data-mode: "authenticated" (the
	// default) or "encrypted"; clients and front ends follow it
	// (docs/security.md).
	DataMode string
	// TCPOnly: chunkservers serve clients and peers over TCP only, not the
	// same-host socket (where the encrypted mode does not encrypt).
	TCPOnly bool
	// Insecure runs everything without TLS or authorization: the pre-security
	// data path, for the bench's comparison only (docs/security.md).
	Insecure bool
	Logger   *slog.Logger
	Out      io.Writer // where the welcome text goes; default os.Stdout
}

// maxSocketPath: longer Unix socket paths do not fit sockaddr_un.
const maxSocketPath = 100

func (c *Config) setDefaults() error {
	if c.Dir == "" {
		c.Dir = "basalt-data"
	}
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		return err
	}
	c.Dir = abs
	if c.Volume == "" {
		c.Volume = "demo"
	}
	if c.Size == 0 {
		c.Size = 8 << 30
	}
	if c.NBDListen == "" {
		c.NBDListen = "127.0.0.1:10809"
	}
	if c.NBDSocket == "" {
		c.NBDSocket = filepath.Join(c.Dir, "nbd.sock")
	}
	for _, p := range []*string{&c.NBDTLS, &c.NBDSocketTLS} {
		if *p == "" {
			*p = "allow"
		}
		if _, err := nbd.ParseTLSPolicy(*p); err != nil {
			return err
		}
	}
	if c.PortBase == 0 {
		c.PortBase = 6700
	}
	if c.NVMfListen == "" {
		c.NVMfListen = addr(c.PortBase + 28)
	}
	if c.ISCSIListen == "" {
		c.ISCSIListen = addr(c.PortBase + 3)
	}
	if c.Chunkservers == 0 {
		c.Chunkservers = 3
	}
	if c.Binary == "" {
		if c.Binary, err = os.Executable(); err != nil {
			return err
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Procs == 0 && os.Getenv("GOMAXPROCS") == "" {
		c.Procs = max(1, runtime.NumCPU()/(c.Chunkservers+1))
	}
	if c.Insecure && c.DataMode != "" {
		return fmt.Errorf("playground: --insecure and --data-mode %s exclude each other", c.DataMode)
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	return nil
}

func addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
