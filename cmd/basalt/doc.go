// Command basalt is the one binary of basalt: every daemon, the playground and the
// operator's CLI are subcommands. It only turns flags into Config structs and wires
// packages together; the work happens in internal/ and pkg/.
package main
