package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/basalt-storage/basalt/pkg/api"
	"github.com/basalt-storage/basalt/pkg/mdsclient"
)

// adminFlags are the flags every operator command shares.
type adminFlags struct {
	mds    *string
	output *string
	tls    *tlsFlags
}

func addAdminFlags(cmd *cobra.Command) *adminFlags {
	return &adminFlags{
		mds:    mdsFlag(cmd),
		output: cmd.Flags().StringP("output", "o", "table", "output format: table or json"),
		tls:    addOperatorTLSFlags(cmd),
	}
}

// dial connects to the MDS with the admin identity.
func (a *adminFlags) dial() (*mdsclient.Client, error) {
	tc, err := a.tls.mdsTLS()
	if err != nil {
		return nil, err
	}
	c, err := mdsclient.Dial(splitList(*a.mds), tc)
	if err != nil {
		return nil, fmt.Errorf("connect to MDS %s: %w", *a.mds, err)
	}
	return c, nil
}

// call dials the MDS, runs fn with a timeout and prints what it returns.
func (a *adminFlags) call(fn func(ctx context.Context, c api.MDSClient) (any, error)) error {
	if *a.output != "table" && *a.output != "json" {
		return fmt.Errorf("--output must be table or json, not %q", *a.output)
	}
	c, err := a.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := fn(ctx, c)
	if err != nil {
		return err
	}
	if *a.output == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	if t, ok := v.(tabler); ok {
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		t.table(tw)
		return tw.Flush()
	}
	return nil
}

// tabler prints itself as a human-readable table.
type tabler interface{ table(w io.Writer) }

// ---- pools ----

type poolList []*api.Pool

func (p poolList) table(w io.Writer) {
	fmt.Fprintln(w, "ID\tNAME\tREPLICAS\tCHUNK SIZE\tCOPYSETS")
	for _, x := range p {
		fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%d\n", x.Id, x.Name, x.Replicas, formatBytes(x.ChunkSize), x.CopysetCount)
	}
}

func poolCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "Manage pools"}

	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a pool and place its copysets on the registered chunkservers",
		Args:  cobra.ExactArgs(1),
	}
	af := addAdminFlags(create)
	replicas := create.Flags().Uint32("replicas", 3, "replicas per copyset (1 for a local pool)")
	chunk := create.Flags().String("chunk-size", "16MiB", "chunk size (power of two, 1MiB..1GiB)")
	copysets := create.Flags().Uint32("copysets", 0, "number of copysets (default: about 100 per chunkserver / replicas)")
	create.RunE = func(_ *cobra.Command, args []string) error {
		cs, err := parseBytes(*chunk)
		if err != nil {
			return fmt.Errorf("--chunk-size: %w", err)
		}
		return af.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.CreatePool(ctx, &api.CreatePoolRequest{Name: args[0], Replicas: *replicas, ChunkSize: cs, CopysetCount: *copysets})
			if err != nil {
				return nil, err
			}
			return poolList{r.Pool}, nil
		})
	}

	ls := &cobra.Command{Use: "ls", Short: "List pools", Args: cobra.NoArgs}
	lf := addAdminFlags(ls)
	ls.RunE = func(*cobra.Command, []string) error {
		return lf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.ListPools(ctx, &api.ListPoolsRequest{})
			if err != nil {
				return nil, err
			}
			return poolList(r.Pools), nil
		})
	}
	cmd.AddCommand(create, ls)
	return cmd
}

// ---- volumes ----

type volumeList []*api.Volume

func (v volumeList) table(w io.Writer) {
	fmt.Fprintln(w, "ID\tNAME\tSIZE\tPOOL\tEPOCH\tCREATED\tNVME HOSTS")
	for _, x := range v {
		created := time.UnixMilli(x.CreatedUnixMs).UTC().Format(time.RFC3339)
		hosts := "any"
		if n := len(x.AllowedHosts); n > 0 {
			hosts = strconv.Itoa(n)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", x.Id, x.Name, formatBytes(x.Size), x.PoolName, x.Epoch, created, hosts)
	}
}

// volumeInfo is `basalt volume info`: the volume's row, then every host
// its NVMe allow-list names; in JSON a list of one, as before.
type volumeInfo struct{ *api.Volume }

func (v volumeInfo) MarshalJSON() ([]byte, error) { return json.Marshal([]*api.Volume{v.Volume}) }

func (v volumeInfo) table(w io.Writer) {
	volumeList{v.Volume}.table(w)
	if len(v.AllowedHosts) == 0 {
		fmt.Fprintln(w, "\nNVMe hosts allowed: any (the targets' --allow-hosts decide)")
		return
	}
	fmt.Fprintln(w, "\nNVMe hosts allowed:")
	for _, h := range v.AllowedHosts {
		fmt.Fprintf(w, "  %s\n", h)
	}
}

// hostChanged is what `basalt volume allow-host` and `deny-host` did.
type hostChanged struct {
	Volume       string   `json:"volume"`
	HostNQN      string   `json:"host_nqn"`
	Allow        bool     `json:"allow"`
	Changed      bool     `json:"changed"`
	AllowedHosts []string `json:"allowed_hosts"`
}

func (h hostChanged) table(w io.Writer) {
	switch {
	case h.Allow && h.Changed:
		fmt.Fprintf(w, "volume %s: host %s allowed\n", h.Volume, h.HostNQN)
	case h.Allow:
		fmt.Fprintf(w, "volume %s: host %s was allowed already; nothing changed\n", h.Volume, h.HostNQN)
	case h.Changed:
		fmt.Fprintf(w, "volume %s: host %s no longer allowed (its controllers already connected stay)\n", h.Volume, h.HostNQN)
	default:
		fmt.Fprintf(w, "volume %s: host %s was not on the list; nothing changed\n", h.Volume, h.HostNQN)
	}
	if len(h.AllowedHosts) == 0 {
		fmt.Fprintf(w, "volume %s allows any NVMe host now (its list is empty; the targets' --allow-hosts decide)\n", h.Volume)
	} else {
		fmt.Fprintf(w, "volume %s allows %d NVMe hosts: %s\n", h.Volume, len(h.AllowedHosts), strings.Join(h.AllowedHosts, ", "))
	}
}

// volumeHostCommand is `basalt volume allow-host` (allow) or `deny-host`:
// a change to the volume's NVMe allow-list, kept in the MDS for every
// NVMe/TCP access node.
func volumeHostCommand(allow bool) *cobra.Command {
	use, short := "deny-host VOLUME HOSTNQN", "Take an NVMe host off the volume's allow-list (an empty list allows any host)"
	if allow {
		use, short = "allow-host VOLUME HOSTNQN", "Let an NVMe host connect to the volume's subsystem: once a volume has a list, only the hosts on it may (docs/nvmf.md)"
	}
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.ExactArgs(2)}
	f := addAdminFlags(cmd)
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		return f.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.SetVolumeHost(ctx, &api.SetVolumeHostRequest{Volume: args[0], HostNqn: args[1], Allow: allow})
			if err != nil {
				return nil, err
			}
			return hostChanged{Volume: args[0], HostNQN: args[1], Allow: allow, Changed: r.Changed,
				AllowedHosts: append([]string{}, r.Volume.AllowedHosts...)}, nil
		})
	}
	return cmd
}

func volumeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "volume", Short: "Manage volumes"}

	create := &cobra.Command{Use: "create NAME", Short: "Create a volume", Args: cobra.ExactArgs(1)}
	cf := addAdminFlags(create)
	size := create.Flags().String("size", "", "size, e.g. 10GiB (required)")
	pool := create.Flags().String("pool", "", "pool name (default: the only pool)")
	_ = create.MarkFlagRequired("size")
	create.RunE = func(_ *cobra.Command, args []string) error {
		n, err := parseBytes(*size)
		if err != nil {
			return fmt.Errorf("--size: %w", err)
		}
		return cf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.CreateVolume(ctx, &api.CreateVolumeRequest{Name: args[0], Size: n, Pool: *pool})
			if err != nil {
				return nil, err
			}
			return volumeList{r.Volume}, nil
		})
	}

	ls := &cobra.Command{Use: "ls", Short: "List volumes", Args: cobra.NoArgs}
	lf := addAdminFlags(ls)
	ls.RunE = func(*cobra.Command, []string) error {
		return lf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.ListVolumes(ctx, &api.ListVolumesRequest{})
			if err != nil {
				return nil, err
			}
			sort.Slice(r.Volumes, func(i, j int) bool { return r.Volumes[i].Name < r.Volumes[j].Name })
			return volumeList(r.Volumes), nil
		})
	}

	info := &cobra.Command{Use: "info NAME", Short: "Show one volume", Args: cobra.ExactArgs(1)}
	inf := addAdminFlags(info)
	info.RunE = func(_ *cobra.Command, args []string) error {
		return inf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.GetVolume(ctx, &api.GetVolumeRequest{Name: args[0]})
			if err != nil {
				return nil, err
			}
			return volumeInfo{r.Volume}, nil
		})
	}

	resize := &cobra.Command{Use: "resize NAME", Short: "Grow a volume", Args: cobra.ExactArgs(1)}
	rf := addAdminFlags(resize)
	newSize := resize.Flags().String("size", "", "new size, larger than the current one (required)")
	_ = resize.MarkFlagRequired("size")
	resize.RunE = func(_ *cobra.Command, args []string) error {
		n, err := parseBytes(*newSize)
		if err != nil {
			return fmt.Errorf("--size: %w", err)
		}
		return rf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.ResizeVolume(ctx, &api.ResizeVolumeRequest{Name: args[0], Size: n})
			if err != nil {
				return nil, err
			}
			return volumeList{r.Volume}, nil
		})
	}

	rm := &cobra.Command{Use: "rm NAME", Short: "Delete a volume and its data", Args: cobra.ExactArgs(1)}
	mf := addAdminFlags(rm)
	rm.RunE = func(_ *cobra.Command, args []string) error {
		return mf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			if _, err := c.DeleteVolume(ctx, &api.DeleteVolumeRequest{Name: args[0]}); err != nil {
				return nil, err
			}
			return deleted{Deleted: args[0]}, nil
		})
	}
	cmd.AddCommand(create, ls, info, resize, rm, volumeCHAPCommand(), volumeHostCommand(true), volumeHostCommand(false))
	return cmd
}

// chapShown is `basalt volume chap show`: the user names, never a secret.
type chapShown struct {
	Volume     string `json:"volume"`
	CHAP       bool   `json:"chap"`
	User       string `json:"user,omitempty"`
	MutualUser string `json:"mutual_user,omitempty"`
}

func (c chapShown) table(w io.Writer) {
	switch {
	case !c.CHAP:
		fmt.Fprintf(w, "volume %s: no CHAP of its own (the portals' --chap-user, if any, applies)\n", c.Volume)
	case c.MutualUser == "":
		fmt.Fprintf(w, "volume %s: CHAP user %s (secret set), no mutual CHAP\n", c.Volume, c.User)
	default:
		fmt.Fprintf(w, "volume %s: CHAP user %s, mutual user %s (secrets set)\n", c.Volume, c.User, c.MutualUser)
	}
}

// volumeCHAPCommand is `basalt volume chap set|clear|show`: the CHAP of a
// volume's iSCSI target, kept in the MDS for every access node.
func volumeCHAPCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "chap", Short: "Set, clear or show the CHAP a volume's iSCSI target requires (docs/iscsi.md)"}

	set := &cobra.Command{Use: "set VOLUME", Short: "Require CHAP (and answer mutual CHAP) at logins to the volume's target, on every access node", Args: cobra.ExactArgs(1)}
	sf := addAdminFlags(set)
	user := set.Flags().String("user", "", "the user name initiators log in with (required)")
	secretFile := set.Flags().String("secret-file", "", "file holding the secret initiators must know, 12 to 255 bytes (required)")
	mutualUser := set.Flags().String("mutual-user", "", "mutual CHAP: the name the target answers with")
	mutualSecretFile := set.Flags().String("mutual-secret-file", "", "mutual CHAP: file holding the secret the target answers with")
	set.RunE = func(_ *cobra.Command, args []string) error {
		if *user == "" {
			return fmt.Errorf("--user is required")
		}
		secret, err := readSecret(*secretFile, "--secret-file")
		if err != nil {
			return err
		}
		chap := &api.TargetCHAP{User: *user, Secret: []byte(secret)}
		if *mutualUser != "" || *mutualSecretFile != "" {
			if *mutualUser == "" {
				return fmt.Errorf("--mutual-user is required with --mutual-secret-file")
			}
			ms, err := readSecret(*mutualSecretFile, "--mutual-secret-file")
			if err != nil {
				return err
			}
			chap.MutualUser, chap.MutualSecret = *mutualUser, []byte(ms)
		}
		return sf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			if _, err := c.SetTargetCHAP(ctx, &api.SetTargetCHAPRequest{Volume: args[0], Chap: chap}); err != nil {
				return nil, err
			}
			return chapShown{Volume: args[0], CHAP: true, User: chap.User, MutualUser: chap.MutualUser}, nil
		})
	}

	clr := &cobra.Command{Use: "clear VOLUME", Short: "Remove the volume's own CHAP (the portals' --chap-user, if any, applies again)", Args: cobra.ExactArgs(1)}
	cf := addAdminFlags(clr)
	clr.RunE = func(_ *cobra.Command, args []string) error {
		return cf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			if _, err := c.SetTargetCHAP(ctx, &api.SetTargetCHAPRequest{Volume: args[0]}); err != nil {
				return nil, err
			}
			return chapShown{Volume: args[0]}, nil
		})
	}

	show := &cobra.Command{Use: "show VOLUME", Short: "Show the CHAP user names of the volume's target (never the secrets)", Args: cobra.ExactArgs(1)}
	hf := addAdminFlags(show)
	show.RunE = func(_ *cobra.Command, args []string) error {
		return hf.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.GetTargetCHAP(ctx, &api.GetTargetCHAPRequest{Volume: args[0]})
			if err != nil {
				return nil, err
			}
			out := chapShown{Volume: args[0]}
			if r.Chap != nil {
				out.CHAP, out.User, out.MutualUser = true, r.Chap.User, r.Chap.MutualUser
			}
			return out, nil
		})
	}
	cmd.AddCommand(set, clr, show)
	return cmd
}

type deleted struct {
	Deleted string `json:"deleted"`
}

func (d deleted) table(w io.Writer) { fmt.Fprintf(w, "deleted volume %s\n", d.Deleted) }

// ---- status ----

type clusterStatus struct{ *api.ClusterStatusResponse }

func (s clusterStatus) MarshalJSON() ([]byte, error) { return json.Marshal(s.ClusterStatusResponse) }

func (s clusterStatus) health() string {
	switch {
	case s.CopysetsUnavailable > 0:
		return "UNAVAILABLE"
	case s.CopysetsDegraded > 0:
		return "DEGRADED"
	default:
		return "HEALTHY"
	}
}

func (s clusterStatus) table(w io.Writer) {
	up := 0
	for _, c := range s.Chunkservers {
		if c.Online {
			up++
		}
	}
	fmt.Fprintf(w, "health:\t%s\n", s.health())
	fmt.Fprintf(w, "active mds:\t%s\n", s.ActiveMds)
	fmt.Fprintf(w, "chunkservers:\t%d up, %d down\n", up, len(s.Chunkservers)-up)
	fmt.Fprintf(w, "copysets:\t%d healthy, %d degraded, %d unavailable\n", s.CopysetsHealthy, s.CopysetsDegraded, s.CopysetsUnavailable)
	members := map[uint64]int{}
	for _, c := range s.Copysets {
		for _, m := range c.Members {
			members[m]++
		}
	}
	if s.MovesInFlight > 0 {
		fmt.Fprintf(w, "moves:\t%d in flight\n", s.MovesInFlight)
		for _, c := range s.Copysets {
			if m := c.Move; m != nil {
				fmt.Fprintf(w, "\tpool %d copyset %d: %d -> %d (%s, %s)\n", c.PoolId, c.Id, m.From, m.To, m.Reason,
					time.Since(time.UnixMilli(m.StartedUnixMs)).Round(time.Second))
			}
		}
	}
	fmt.Fprintf(w, "pools:\t%d\nvolumes:\t%d\n\n", len(s.Pools), s.Volumes)
	fmt.Fprintln(w, "ID\tADDRESS\tZONE\tSERVER\tSTATE\tONLINE\tCOPYSETS\tLEADERS\tUSED\tCAPACITY")
	for _, c := range s.Chunkservers {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%v\t%d\t%d\t%s\t%s\n", c.Id, c.Addr, c.Zone, c.Server, diskStateText(c.DiskState), c.Online,
			members[c.Id], s.LeadersPerChunkserver[c.Id], formatBytes(c.UsedBytes), formatBytes(c.CapacityBytes))
	}
}

func statusCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "status", Short: "Cluster health: chunkservers, copysets, leaders", Args: cobra.NoArgs}
	f := addAdminFlags(cmd)
	cmd.RunE = func(*cobra.Command, []string) error {
		return f.call(func(ctx context.Context, c api.MDSClient) (any, error) {
			r, err := c.ClusterStatus(ctx, &api.ClusterStatusRequest{})
			if err != nil {
				return nil, err
			}
			sort.Slice(r.Chunkservers, func(i, j int) bool { return r.Chunkservers[i].Id < r.Chunkservers[j].Id })
			return clusterStatus{r}, nil
		})
	}
	return cmd
}

// ---- sizes ----

var units = []struct {
	suffix string
	mult   uint64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1},
}

// parseBytes reads "8GiB", "512M", "4096".
func parseBytes(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	mult := uint64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("not a size: %q (use e.g. 8GiB, 512MiB, 4096)", s)
	}
	if n > (1<<63)/mult {
		return 0, fmt.Errorf("size too large: %q", s)
	}
	return n * mult, nil
}

func formatBytes(n uint64) string {
	for _, u := range units[:4] {
		if n >= u.mult {
			v := float64(n) / float64(u.mult)
			if v == float64(uint64(v)) {
				return fmt.Sprintf("%d%s", uint64(v), u.suffix)
			}
			return fmt.Sprintf("%.1f%s", v, u.suffix)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// diskStateText is how status shows a chunkserver's disk state.
func diskStateText(s api.DiskState) string {
	switch s {
	case api.DiskState_DISK_STATE_OK:
		return "ok"
	case api.DiskState_DISK_STATE_FULL:
		return "disk full"
	case api.DiskState_DISK_STATE_IO_ERROR:
		return "io error"
	}
	return "unknown"
}
