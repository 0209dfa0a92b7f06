// Package frontend holds what every access protocol server (NBD now; iSCSI and
// NVMe/TCP later) serves: a Backend per export, found by name through Exports.
package frontend
