package testcluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/basalt-storage/basalt/internal/identity"
	"github.com/basalt-storage/basalt/pkg/api"
)

// ActiveMDS returns the active MDS process: the one ClusterStatus names as
// active (a standby passes the call on to it).
func (c *Cluster) ActiveMDS() *Proc {
	c.t.Helper()
	p, err := c.mdsAt(c.Status().ActiveMds)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

func (c *Cluster) mdsAt(addr string) (*Proc, error) {
	for _, p := range c.MDSs {
		if p.Addr == addr {
			return p, nil
		}
	}
	return nil, fmt.Errorf("active MDS %q is none of %s", addr, c.MDSAddr)
}

// AwaitFailover waits until an MDS other than old is active and answers a
// call through the cluster's client, and returns it with the time from
// since (old's kill) to that first answer.
func (c *Cluster) AwaitFailover(old *Proc, since time.Time, timeout time.Duration) (*Proc, time.Duration) {
	c.t.Helper()
	// Short attempts, polled often: the time measured is when the first
	// call succeeded, not when a long retry inside the client ended.
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := c.API.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		cancel()
		if err == nil && st.ActiveMds != old.Addr {
			took := time.Since(since)
			p, err := c.mdsAt(st.ActiveMds)
			if err != nil {
				c.t.Fatal(err)
			}
			return p, took
		}
		if err == nil {
			err = fmt.Errorf("%s still answers as the active MDS", old)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %s waiting for a standby to take over from %s: %v", timeout, old, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AwaitStandby waits until MDS p serves as a standby naming active as the
// active MDS (every RPC answered Unavailable, "active is ADDR").
func (c *Cluster) AwaitStandby(p, active *Proc, timeout time.Duration) {
	c.t.Helper()
	cc, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(credentials.NewTLS(c.TLS(identity.RoleAdmin, "admin"))))
	if err != nil {
		c.t.Fatal(err)
	}
	defer cc.Close()
	mds := api.NewMDSClient(cc)
	c.Eventually(timeout, p.Name+" serving as a standby", func(ctx context.Context) error {
		_, err := mds.ClusterStatus(ctx, &api.ClusterStatusRequest{})
		if err == nil {
			return fmt.Errorf("%s answers as the active MDS", p)
		}
		if s := status.Convert(err); s.Code() != codes.Unavailable || !strings.HasSuffix(s.Message(), "active is "+active.Addr) {
			return fmt.Errorf("%s: %v", p, err)
		}
		return nil
	})
}
