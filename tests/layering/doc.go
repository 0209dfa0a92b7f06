// Package layering holds one test: every basalt package imports only what its place
// in the picture allows (docs/architecture.md). Front ends reach the core only
// through the client library, the MDS never touches the data plane, placement stays
// pure, nothing imports cmd/, and test support stays out of production code.
package layering
