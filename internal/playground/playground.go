package playground

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// Run starts the playground and blocks until ctx is done, then stops everything
// in the reverse order: front end, chunkservers, MDS.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	if cfg.Procs > 0 {
		runtime.GOMAXPROCS(cfg.Procs)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("playground directory: %w", err)
	}
	statePath := filepath.Join(cfg.Dir, StateFile)
	_ = os.Remove(statePath)
	st := newState(cfg)

	// 0. A CA and every certificate, once; a second run reuses them.
	need := []identity.Need{{Role: identity.RoleMDS, Name: "mds"}, {Role: identity.RoleAdmin, Name: "admin"},
		{Role: identity.RoleAccess, Name: "playground"}, {Role: identity.RoleClient, Name: NBDClientName}}
	for i := 1; i <= cfg.Chunkservers; i++ {
		need = append(need, identity.Need{Role: identity.RoleChunkserver, Name: strconv.Itoa(i)},
			identity.Need{Role: identity.RoleAccess, Name: "cs" + strconv.Itoa(i)}) // its in-process NBD
	}
	var mdsTLS *tls.Config // nil: --insecure
	if !cfg.Insecure {
		if err := identity.EnsureCerts(st.TLSDir, "playground", need); err != nil {
			return fmt.Errorf("playground certificates in %s: %w", st.TLSDir, err)
		}
		admin, err := identity.Load(st.TLSDir, "admin")
		if err != nil {
			return err
		}
		if err := identity.WriteGnuTLSClientDir(st.TLSDir, identity.Base(identity.RoleClient, NBDClientName), st.NBDClientDir); err != nil {
			return err
		}
		mdsTLS = admin.ClientTLS(identity.RoleMDS)
	}

	// 1. The MDS and its embedded etcd, in this process.
	stopMDS, err := startMDS(cfg, &st)
	if err != nil {
		return err
	}
	defer stopMDS()
	mc, err := mdsclient.Dial([]string{st.MDS}, mdsTLS)
	if err != nil {
		return err
	}
	defer mc.Close()

	// 2. The chunkservers, as child processes.
	sup := &supervisor{log: cfg.Logger}
	defer sup.stopAll()
	if err := startChunkservers(cfg, &st, sup); err != nil {
		return err
	}

	// 3. Pool and volume, and a leader for every copyset.
	if err := prepareCluster(ctx, mc, cfg, sup); err != nil {
		return err
	}

	// 4. The front end (NBD on TCP and a Unix socket) and its metrics.
	stopFrontEnd, err := startFrontEnd(cfg, &st)
	if err != nil {
		return err
	}
	defer stopFrontEnd()

	// 5. Tell scripts and people where everything is.
	if err := writeState(statePath, &st); err != nil {
		return err
	}
	printWelcome(cfg.Out, &st)
	<-ctx.Done()
	fmt.Fprintln(cfg.Out, "\nstopping the playground...")
	_ = os.Remove(statePath)
	return nil
}
