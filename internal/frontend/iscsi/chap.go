package iscsi

import (
	"crypto/md5"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"hash"
	"log/slog"
	"strconv"
	"strings"
)

// CHAP is the Challenge-Handshake Authentication of a target (RFC 7143
// 12.1.3, RFC 1994): the initiator proves it knows Secret; if it asks for
// mutual authentication, the target proves it knows MutualSecret.
type CHAP struct {
	// User and Secret: the name and secret the initiator must answer with.
	User, Secret string
	// MutualUser and MutualSecret: what the target answers with when the
	// initiator challenges it. Empty: mutual CHAP is refused.
	MutualUser, MutualSecret string
}

// String names the users, never the secrets, so a CHAP printed by mistake
// leaks nothing.
func (c CHAP) String() string {
	if c.MutualUser == "" {
		return fmt.Sprintf("CHAP{user %q}", c.User)
	}
	return fmt.Sprintf("CHAP{user %q, mutual user %q}", c.User, c.MutualUser)
}

// LogValue is String for log/slog.
func (c CHAP) LogValue() slog.Value { return slog.StringValue(c.String()) }

// CHAP_A algorithm numbers (IANA "PPP Authentication Algorithms").
const (
	chapMD5    = 5
	chapSHA1   = 6
	chapSHA256 = 7
)

func chapHash(alg int) func() hash.Hash {
	switch alg {
	case chapMD5:
		return md5.New
	case chapSHA1:
		return sha1.New
	case chapSHA256:
		return sha256.New
	}
	return nil
}

// chooseCHAPAlg picks the first algorithm of the initiator's CHAP_A list this
// target supports; 0 if none.
func chooseCHAPAlg(list string) int {
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err == nil && chapHash(n) != nil {
			return n
		}
	}
	return 0
}

// chapResponse is H(id || secret || challenge).
func chapResponse(alg int, id byte, secret string, challenge []byte) []byte {
	h := chapHash(alg)()
	h.Write([]byte{id})
	h.Write([]byte(secret))
	h.Write(challenge)
	return h.Sum(nil)
}

// chapState is one login's CHAP exchange, from the target's side.
type chapState struct {
	step      int // 0: AuthMethod not yet agreed; 1: CHAP agreed, awaiting CHAP_A; 2: challenge sent; 3: done
	alg       int
	id        byte
	challenge []byte
}

func newChallenge(n int) (byte, []byte) {
	b := make([]byte, n+1)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return b[0], b[1:]
}

func constEq(a, b []byte) bool { return subtle.ConstantTimeCompare(a, b) == 1 }
