// Package capability is the signed session capability of the data plane
// (docs/security.md): the MDS signs, for each session it opens or renews,
// (volume, session, epoch, mode, expiry) with an Ed25519 key; chunkservers,
// which learn the MDS's public keys over mutually authenticated TLS (the
// heartbeat response), serve a volume's IO on a connection only under a
// valid capability attached to that connection, and never take an epoch
// above the signed one. So no client can reach a volume it did not open,
// nor invent an epoch that fences the volume's writer.
//
// # Token format (version 1)
//
// All integers big-endian; 102 bytes:
//
//	 0  u8    version (1)
//	 1  u32   key id        which MDS key signed it
//	 5  u64   volume id
//	13  u64   session id
//	21  u64   epoch         the session's writer epoch (0: read-only)
//	29  u8    mode          1 read, 2 read and write
//	30  i64   expiry        Unix milliseconds
//	38  [64]  signature     Ed25519 over signedPrefix || bytes 0..38
//
// # Keys and rotation
//
// A Signer holds the current key and the previous one; Rotate makes a new
// current key. Verifiers (Keys) accept a token signed by any key they were
// given (the MDS sends both), so tokens signed just before a rotation stay
// valid until they expire; a key rotated out twice signs nothing anyone
// accepts. Expiry is checked against the verifier's clock with Skew of
// slack.
package capability

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Errors of Verify.
var (
	// ErrMalformed: not a version 1 token of the right size.
	ErrMalformed = errors.New("capability: malformed token")
	// ErrUnknownKey: signed by a key this verifier does not hold (rotated
	// out, another cluster's, or forged).
	ErrUnknownKey = errors.New("capability: unknown signing key")
	// ErrBadSignature: the signature does not verify.
	ErrBadSignature = errors.New("capability: bad signature")
	// ErrExpired: the token's expiry (plus Skew) has passed.
	ErrExpired = errors.New("capability: expired")
)

// Mode is what a capability allows.
type Mode uint8

const (
	ModeRead  Mode = 1 // reads, at epochs up to the signed one
	ModeWrite Mode = 2 // reads and writes (trim, zeroes, fence) at epochs up to the signed one
)

// Size is the encoded size of a token.
const Size = 38 + ed25519.SignatureSize

// Skew is the clock difference tolerated between the MDS and a chunkserver.
const Skew = 30 * time.Second

const version = 1

// signedPrefix separates these signatures from any other use of the key.
var signedPrefix = []byte("basalt data-plane capability v1\x00")

// Capability is what a token grants.
type Capability struct {
	KeyID   uint32
	Volume  uint64
	Session uint64
	Epoch   uint64
	Mode    Mode
	Expiry  time.Time
}

// Allows reports whether c permits op at epoch on its volume: an epoch
// above the signed one never counts.
func (c *Capability) Allows(write bool, epoch uint64) bool {
	if epoch > c.Epoch {
		return false
	}
	return !write || c.Mode == ModeWrite
}

func (c *Capability) body() []byte {
	b := make([]byte, 38, Size)
	b[0] = version
	binary.BigEndian.PutUint32(b[1:], c.KeyID)
	binary.BigEndian.PutUint64(b[5:], c.Volume)
	binary.BigEndian.PutUint64(b[13:], c.Session)
	binary.BigEndian.PutUint64(b[21:], c.Epoch)
	b[29] = byte(c.Mode)
	binary.BigEndian.PutUint64(b[30:], uint64(c.Expiry.UnixMilli()))
	return b
}

func message(body []byte) []byte {
	return append(append(make([]byte, 0, len(signedPrefix)+len(body)), signedPrefix...), body...)
}

// Key is one signing key as verifiers know it.
type Key struct {
	ID     uint32
	Public ed25519.PublicKey
}

// PrivateKey is one signing key as the MDS keeps it.
type PrivateKey struct {
	ID      uint32
	Private ed25519.PrivateKey
	Created time.Time
}

// NewKey makes a signing key with id.
func NewKey(id uint32, now time.Time) (PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return PrivateKey{}, err
	}
	return PrivateKey{ID: id, Private: priv, Created: now}, nil
}

// Signer signs capabilities with the current key; safe for concurrent use.
type Signer struct {
	mu   sync.RWMutex
	keys []PrivateKey // oldest first; the last is current; at most 2
}

// NewSigner returns a Signer with keys (oldest first, at least one); only
// the last two are kept.
func NewSigner(keys []PrivateKey) (*Signer, error) {
	if len(keys) == 0 {
		return nil, errors.New("capability: a signer needs a key")
	}
	s := &Signer{}
	s.Set(keys)
	return s, nil
}

// Set replaces the keys (oldest first), keeping the last two.
func (s *Signer) Set(keys []PrivateKey) {
	if len(keys) > 2 {
		keys = keys[len(keys)-2:]
	}
	s.mu.Lock()
	s.keys = append([]PrivateKey(nil), keys...)
	s.mu.Unlock()
}

// Keys returns the keys (oldest first).
func (s *Signer) Keys() []PrivateKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append([]PrivateKey(nil), s.keys...)
}

// Rotate makes a new current key; the current one becomes the previous,
// and the previous is dropped. It returns the keys now held.
func (s *Signer) Rotate(now time.Time) ([]PrivateKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := NewKey(s.keys[len(s.keys)-1].ID+1, now)
	if err != nil {
		return nil, err
	}
	s.keys = append(s.keys, next)
	if len(s.keys) > 2 {
		s.keys = s.keys[len(s.keys)-2:]
	}
	return append([]PrivateKey(nil), s.keys...), nil
}

// Public returns the verifiers' view of the keys.
func (s *Signer) Public() []Key {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Key, len(s.keys))
	for i, k := range s.keys {
		out[i] = Key{ID: k.ID, Public: k.Private.Public().(ed25519.PublicKey)}
	}
	return out
}

// Sign returns the token for c, signed with the current key (c.KeyID is set
// to it).
func (s *Signer) Sign(c Capability) []byte {
	s.mu.RLock()
	k := s.keys[len(s.keys)-1]
	s.mu.RUnlock()
	c.KeyID = k.ID
	body := c.body()
	return append(body, ed25519.Sign(k.Private, message(body))...)
}

// Keys verifies tokens with the public keys it was given; safe for
// concurrent use. The zero value holds no key and verifies nothing.
type Keys struct {
	mu   sync.RWMutex
	keys map[uint32]ed25519.PublicKey
}

// Set replaces the keys.
func (k *Keys) Set(keys []Key) {
	m := make(map[uint32]ed25519.PublicKey, len(keys))
	for _, key := range keys {
		if len(key.Public) == ed25519.PublicKeySize {
			m[key.ID] = append(ed25519.PublicKey(nil), key.Public...)
		}
	}
	k.mu.Lock()
	k.keys = m
	k.mu.Unlock()
}

// Known reports whether any key is held.
func (k *Keys) Known() bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return len(k.keys) > 0
}

// Verify checks token and returns what it grants.
func (k *Keys) Verify(token []byte, now time.Time) (Capability, error) {
	if len(token) != Size || token[0] != version {
		return Capability{}, ErrMalformed
	}
	c := Capability{
		KeyID:   binary.BigEndian.Uint32(token[1:]),
		Volume:  binary.BigEndian.Uint64(token[5:]),
		Session: binary.BigEndian.Uint64(token[13:]),
		Epoch:   binary.BigEndian.Uint64(token[21:]),
		Mode:    Mode(token[29]),
		Expiry:  time.UnixMilli(int64(binary.BigEndian.Uint64(token[30:]))),
	}
	if c.Mode != ModeRead && c.Mode != ModeWrite {
		return Capability{}, fmt.Errorf("%w: mode %d", ErrMalformed, c.Mode)
	}
	k.mu.RLock()
	pub := k.keys[c.KeyID]
	k.mu.RUnlock()
	if pub == nil {
		return Capability{}, fmt.Errorf("%w: %d", ErrUnknownKey, c.KeyID)
	}
	if !ed25519.Verify(pub, message(token[:38]), token[38:]) {
		return Capability{}, ErrBadSignature
	}
	if now.After(c.Expiry.Add(Skew)) {
		return Capability{}, fmt.Errorf("%w at %s", ErrExpired, c.Expiry.UTC().Format(time.RFC3339))
	}
	return c, nil
}
