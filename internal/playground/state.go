package playground

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/basalt-storage/basalt/internal/frontend/iscsi"
	"os"
	"path/filepath"
	"time"

	"github.com/basalt-storage/basalt/internal/frontend/nvmf"
)

// ChunkserverState is one chunkserver of the playground.
type ChunkserverState struct {
	Index   int    `json:"index"`
	Addr    string `json:"addr"`
	Metrics string `json:"metrics"`
	// NBDSocket: the NBD front end inside this chunkserver (basalt chunkserver
	// --nbd-socket); volumes whose copysets it leads take the local fast path.
	NBDSocket  string   `json:"nbd_socket,omitempty"`
	PID        int      `json:"pid"`
	DataDir    string   `json:"data_dir"`
	Log        string   `json:"log"`
	RestartCmd []string `json:"restart_cmd"`
}

// State is what playground.json holds.
type State struct {
	Dir        string `json:"dir"`
	PID        int    `json:"pid"` // the playground process (MDS, etcd, NBD)
	MDS        string `json:"mds"`
	Etcd       string `json:"etcd"`
	NBD        string `json:"nbd"`
	NBDSocket  string `json:"nbd_socket"`
	NBDURI     string `json:"nbd_uri"`
	NBDUnixURI string `json:"nbd_unix_uri"`
	// NBDSURI is the volume's nbds:// URI (NBD over TLS) with the client
	// certificate directory NBDClientDir (ca-cert.pem, client-cert.pem,
	// client-key.pem, as libnbd and qemu want them); NBDTLS is the TCP
	// listener's policy.
	NBDSURI      string `json:"nbds_uri"`
	NBDClientDir string `json:"nbd_client_dir"`
	NBDTLS       string `json:"nbd_tls"`
	NVMf         string `json:"nvmf"`              // NVMe/TCP target (host:port)
	NVMfNQN      string `json:"nvmf_nqn"`          // the volume's subsystem NQN
	ISCSI        string `json:"iscsi"`             // the iSCSI portal
	ISCSITarget  string `json:"iscsi_target"`      // the volume's target name
	ISCSIURI     string `json:"iscsi_uri"`         // libiscsi's URL of LUN 0
	Metrics      string `json:"metrics,omitempty"` // this process's /metrics
	Debug        string `json:"debug,omitempty"`   // this process's /debug/pprof/
	// TLSDir holds the playground's CA and every certificate (docs/security.md);
	// AdminCert is the one operator commands use (basalt status --tls-dir TLSDir).
	TLSDir       string             `json:"tls_dir"`
	AdminCert    string             `json:"admin_cert"`
	Volume       string             `json:"volume"`
	Size         uint64             `json:"size"`
	Chunkservers []ChunkserverState `json:"chunkservers"`
}

// TLSDir is the name of the certificate directory inside the playground directory.
const TLSDir = "tls"

// NBDClientName names the client certificate (basalt://playground/client/nbd)
// laid out in TLSDir/NBDClientDirName for nbds:// and qemu.
const (
	NBDClientName    = "nbd"
	NBDClientDirName = "nbd-client"
)

// StateFile is the name of the state file inside the playground directory.
const StateFile = "playground.json"

// newState is the State of a playground about to start: every address is
// fixed by cfg; the chunkservers and the front end's metrics fill in later.
func newState(cfg Config) State {
	st := State{
		Dir:       cfg.Dir,
		PID:       os.Getpid(),
		MDS:       addr(cfg.PortBase),
		Etcd:      "https://" + addr(cfg.PortBase+1),
		TLSDir:    filepath.Join(cfg.Dir, TLSDir),
		NBD:       cfg.NBDListen,
		NBDSocket: cfg.NBDSocket,
		Volume:    cfg.Volume,
		Size:      cfg.Size,
	}
	st.AdminCert = filepath.Join(st.TLSDir, "admin.crt")
	if cfg.Insecure {
		st.Etcd = "http://" + addr(cfg.PortBase+1)
		st.TLSDir, st.AdminCert = "", ""
	}
	st.NBDURI = "nbd://" + st.NBD + "/" + cfg.Volume
	st.NBDClientDir = filepath.Join(st.TLSDir, NBDClientDirName)
	st.NBDSURI = "nbds://" + st.NBD + "/" + cfg.Volume + "?tls-certificates=" + st.NBDClientDir
	st.NBDTLS = cfg.NBDTLS
	st.NVMf = cfg.NVMfListen
	st.NVMfNQN = nvmf.VolumeNQNPrefix + cfg.Volume
	st.NBDUnixURI = "nbd+unix:///" + cfg.Volume + "?socket=" + st.NBDSocket
	st.ISCSI = cfg.ISCSIListen
	st.ISCSITarget = iscsi.TargetName(ISCSICluster, cfg.Volume)
	st.ISCSIURI = "iscsi://" + st.ISCSI + "/" + st.ISCSITarget + "/0"
	return st
}

func writeState(path string, st *State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadState reads DIR/playground.json.
func ReadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", StateFile, err)
	}
	return &st, nil
}

var errNotReady = errors.New("playground: not ready")

// WaitReady waits until DIR/playground.json exists and returns it.
func WaitReady(ctx context.Context, dir string) (*State, error) {
	for {
		st, err := ReadState(dir)
		if err == nil {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %v", errNotReady, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
