// Methods of api.MDSClient: each runs through Client.call.

package mdsclient

import (
	"context"

	"google.golang.org/grpc"

	"github.com/basalt-storage/basalt/pkg/api"
)

// RegisterChunkServer calls RegisterChunkServer on the active MDS.
func (c *Client) RegisterChunkServer(ctx context.Context, in *api.RegisterChunkServerRequest, opts ...grpc.CallOption) (*api.RegisterChunkServerResponse, error) {
	var out *api.RegisterChunkServerResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.RegisterChunkServer(ctx, in, opts...)
		return err
	})
	return out, err
}

// Heartbeat calls Heartbeat on the active MDS.
func (c *Client) Heartbeat(ctx context.Context, in *api.HeartbeatRequest, opts ...grpc.CallOption) (*api.HeartbeatResponse, error) {
	var out *api.HeartbeatResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.Heartbeat(ctx, in, opts...)
		return err
	})
	return out, err
}

// ListChunkServers calls ListChunkServers on the active MDS.
func (c *Client) ListChunkServers(ctx context.Context, in *api.ListChunkServersRequest, opts ...grpc.CallOption) (*api.ListChunkServersResponse, error) {
	var out *api.ListChunkServersResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.ListChunkServers(ctx, in, opts...)
		return err
	})
	return out, err
}

// CreatePool calls CreatePool on the active MDS.
func (c *Client) CreatePool(ctx context.Context, in *api.CreatePoolRequest, opts ...grpc.CallOption) (*api.CreatePoolResponse, error) {
	var out *api.CreatePoolResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.CreatePool(ctx, in, opts...)
		return err
	})
	return out, err
}

// ListPools calls ListPools on the active MDS.
func (c *Client) ListPools(ctx context.Context, in *api.ListPoolsRequest, opts ...grpc.CallOption) (*api.ListPoolsResponse, error) {
	var out *api.ListPoolsResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.ListPools(ctx, in, opts...)
		return err
	})
	return out, err
}

// GetCopysets calls GetCopysets on the active MDS.
func (c *Client) GetCopysets(ctx context.Context, in *api.GetCopysetsRequest, opts ...grpc.CallOption) (*api.GetCopysetsResponse, error) {
	var out *api.GetCopysetsResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.GetCopysets(ctx, in, opts...)
		return err
	})
	return out, err
}

// CreateVolume calls CreateVolume on the active MDS.
func (c *Client) CreateVolume(ctx context.Context, in *api.CreateVolumeRequest, opts ...grpc.CallOption) (*api.CreateVolumeResponse, error) {
	var out *api.CreateVolumeResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.CreateVolume(ctx, in, opts...)
		return err
	})
	return out, err
}

// GetVolume calls GetVolume on the active MDS.
func (c *Client) GetVolume(ctx context.Context, in *api.GetVolumeRequest, opts ...grpc.CallOption) (*api.GetVolumeResponse, error) {
	var out *api.GetVolumeResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.GetVolume(ctx, in, opts...)
		return err
	})
	return out, err
}

// ListVolumes calls ListVolumes on the active MDS.
func (c *Client) ListVolumes(ctx context.Context, in *api.ListVolumesRequest, opts ...grpc.CallOption) (*api.ListVolumesResponse, error) {
	var out *api.ListVolumesResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.ListVolumes(ctx, in, opts...)
		return err
	})
	return out, err
}

// ResizeVolume calls ResizeVolume on the active MDS.
func (c *Client) ResizeVolume(ctx context.Context, in *api.ResizeVolumeRequest, opts ...grpc.CallOption) (*api.ResizeVolumeResponse, error) {
	var out *api.ResizeVolumeResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.ResizeVolume(ctx, in, opts...)
		return err
	})
	return out, err
}

// SetVolumeMeta calls SetVolumeMeta on the active MDS.
func (c *Client) SetVolumeMeta(ctx context.Context, in *api.SetVolumeMetaRequest, opts ...grpc.CallOption) (*api.SetVolumeMetaResponse, error) {
	var out *api.SetVolumeMetaResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.SetVolumeMeta(ctx, in, opts...)
		return err
	})
	return out, err
}

// SetVolumeHost calls SetVolumeHost on the active MDS.
func (c *Client) SetVolumeHost(ctx context.Context, in *api.SetVolumeHostRequest, opts ...grpc.CallOption) (*api.SetVolumeHostResponse, error) {
	var out *api.SetVolumeHostResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.SetVolumeHost(ctx, in, opts...)
		return err
	})
	return out, err
}

// DeleteVolume calls DeleteVolume on the active MDS.
func (c *Client) DeleteVolume(ctx context.Context, in *api.DeleteVolumeRequest, opts ...grpc.CallOption) (*api.DeleteVolumeResponse, error) {
	var out *api.DeleteVolumeResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.DeleteVolume(ctx, in, opts...)
		return err
	})
	return out, err
}

// OpenVolume calls OpenVolume on the active MDS.
func (c *Client) OpenVolume(ctx context.Context, in *api.OpenVolumeRequest, opts ...grpc.CallOption) (*api.OpenVolumeResponse, error) {
	var out *api.OpenVolumeResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.OpenVolume(ctx, in, opts...)
		return err
	})
	return out, err
}

// RenewSession calls RenewSession on the active MDS.
func (c *Client) RenewSession(ctx context.Context, in *api.RenewSessionRequest, opts ...grpc.CallOption) (*api.RenewSessionResponse, error) {
	var out *api.RenewSessionResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.RenewSession(ctx, in, opts...)
		return err
	})
	return out, err
}

// CloseSession calls CloseSession on the active MDS.
func (c *Client) CloseSession(ctx context.Context, in *api.CloseSessionRequest, opts ...grpc.CallOption) (*api.CloseSessionResponse, error) {
	var out *api.CloseSessionResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.CloseSession(ctx, in, opts...)
		return err
	})
	return out, err
}

// ClusterStatus calls ClusterStatus on the active MDS.
func (c *Client) ClusterStatus(ctx context.Context, in *api.ClusterStatusRequest, opts ...grpc.CallOption) (*api.ClusterStatusResponse, error) {
	var out *api.ClusterStatusResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.ClusterStatus(ctx, in, opts...)
		return err
	})
	return out, err
}

// RegisterAccessNode calls RegisterAccessNode on the active MDS.
func (c *Client) RegisterAccessNode(ctx context.Context, in *api.RegisterAccessNodeRequest, opts ...grpc.CallOption) (*api.RegisterAccessNodeResponse, error) {
	var out *api.RegisterAccessNodeResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.RegisterAccessNode(ctx, in, opts...)
		return err
	})
	return out, err
}

// AccessNodeHeartbeat calls AccessNodeHeartbeat on the active MDS.
func (c *Client) AccessNodeHeartbeat(ctx context.Context, in *api.AccessNodeHeartbeatRequest, opts ...grpc.CallOption) (*api.AccessNodeHeartbeatResponse, error) {
	var out *api.AccessNodeHeartbeatResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.AccessNodeHeartbeat(ctx, in, opts...)
		return err
	})
	return out, err
}

// SetNVMfSubsystem calls SetNVMfSubsystem on the active MDS.
func (c *Client) SetNVMfSubsystem(ctx context.Context, in *api.SetNVMfSubsystemRequest, opts ...grpc.CallOption) (*api.SetNVMfSubsystemResponse, error) {
	var out *api.SetNVMfSubsystemResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.SetNVMfSubsystem(ctx, in, opts...)
		return err
	})
	return out, err
}

// ListANA calls ListANA on the active MDS.
func (c *Client) ListANA(ctx context.Context, in *api.ListANARequest, opts ...grpc.CallOption) (*api.ListANAResponse, error) {
	var out *api.ListANAResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.ListANA(ctx, in, opts...)
		return err
	})
	return out, err
}

// RegisterNode calls RegisterNode on the active MDS.
func (c *Client) RegisterNode(ctx context.Context, in *api.RegisterNodeRequest, opts ...grpc.CallOption) (*api.RegisterNodeResponse, error) {
	var out *api.RegisterNodeResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.RegisterNode(ctx, in, opts...)
		return err
	})
	return out, err
}

// AttachVolume calls AttachVolume on the active MDS.
func (c *Client) AttachVolume(ctx context.Context, in *api.AttachVolumeRequest, opts ...grpc.CallOption) (*api.AttachVolumeResponse, error) {
	var out *api.AttachVolumeResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.AttachVolume(ctx, in, opts...)
		return err
	})
	return out, err
}

// DetachVolume calls DetachVolume on the active MDS.
func (c *Client) DetachVolume(ctx context.Context, in *api.DetachVolumeRequest, opts ...grpc.CallOption) (*api.DetachVolumeResponse, error) {
	var out *api.DetachVolumeResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.DetachVolume(ctx, in, opts...)
		return err
	})
	return out, err
}

// GetReservation calls GetReservation on the active MDS.
func (c *Client) GetReservation(ctx context.Context, in *api.GetReservationRequest, opts ...grpc.CallOption) (*api.GetReservationResponse, error) {
	var out *api.GetReservationResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.GetReservation(ctx, in, opts...)
		return err
	})
	return out, err
}

// ApplyReservation calls ApplyReservation on the active MDS. Give the
// request a RequestId: a retry after a lost answer is then applied once.
func (c *Client) ApplyReservation(ctx context.Context, in *api.ApplyReservationRequest, opts ...grpc.CallOption) (*api.ApplyReservationResponse, error) {
	var out *api.ApplyReservationResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.ApplyReservation(ctx, in, opts...)
		return err
	})
	return out, err
}

// SetTargetCHAP calls SetTargetCHAP on the active MDS.
func (c *Client) SetTargetCHAP(ctx context.Context, in *api.SetTargetCHAPRequest, opts ...grpc.CallOption) (*api.SetTargetCHAPResponse, error) {
	var out *api.SetTargetCHAPResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.SetTargetCHAP(ctx, in, opts...)
		return err
	})
	return out, err
}

// GetTargetCHAP calls GetTargetCHAP on the active MDS.
func (c *Client) GetTargetCHAP(ctx context.Context, in *api.GetTargetCHAPRequest, opts ...grpc.CallOption) (*api.GetTargetCHAPResponse, error) {
	var out *api.GetTargetCHAPResponse
	err := c.call(ctx, func(ctx context.Context, s api.MDSClient) error {
		var err error
		out, err = s.GetTargetCHAP(ctx, in, opts...)
		return err
	})
	return out, err
}
