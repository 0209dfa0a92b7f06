// Package api holds basalt's public wire definitions: the control-plane gRPC service
// of the MDS (mds.proto, with the generated code committed; regenerate with
// `make generate`) and the numeric status codes of the data plane.
//
// The data-plane frame layout itself is specified in internal/transport.
package api
