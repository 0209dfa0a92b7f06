package main

import "github.com/spf13/cobra"

// checkCommand is replaced by the scrub engineer's implementation.
func checkCommand() *cobra.Command {
	return &cobra.Command{Use: "check", Short: "Compare the replicas of every copyset", Hidden: true}
}
