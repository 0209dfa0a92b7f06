package testhost

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// defaultCacheDir is $BASALT_TESTHOST_CACHE, else .cache/testhost in the root
// of the Go module the working directory is in (where scripts/install-deps
// puts the kernel; .gitignore lists .cache/).
func defaultCacheDir() (string, error) {
	if d := os.Getenv("BASALT_TESTHOST_CACHE"); d != "" {
		return d, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".cache", "testhost"), nil
}

// moduleRoot is the nearest directory above the working directory with a go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testhost: no go.mod above the working directory; set BASALT_TESTHOST_CACHE")
		}
		dir = parent
	}
}

var (
	agentOnce sync.Once
	agentPath string
	agentErr  error
)

// buildAgent builds the guest agent, static and without build paths so every
// checkout builds the same bytes (and the initramfs cache hits), once per process.
func buildAgent(cacheDir string) (string, error) {
	agentOnce.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			agentErr = err
			return
		}
		dir := filepath.Join(cacheDir, "agent")
		if agentErr = os.MkdirAll(dir, 0o755); agentErr != nil {
			return
		}
		tmp, err := os.CreateTemp(dir, ".agent-*")
		if err != nil {
			agentErr = err
			return
		}
		tmp.Close()
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp.Name(),
			"github.com/basalt-storage/basalt/internal/testhost/agent")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp.Name())
			agentErr = fmt.Errorf("testhost: building the guest agent: %v\n%s", err, out)
			return
		}
		agentPath = filepath.Join(dir, "testhost-agent")
		agentErr = os.Rename(tmp.Name(), agentPath)
	})
	return agentPath, agentErr
}
