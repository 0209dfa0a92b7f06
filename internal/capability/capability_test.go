package capability

import (
	"errors"
	"testing"
	"time"
)

func signer(t testing.TB, id uint32) *Signer {
	t.Helper()
	k, err := NewKey(id, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSigner([]PrivateKey{k})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSignVerifyRotate(t *testing.T) {
	now := time.Now()
	s := signer(t, 1)
	var keys Keys
	keys.Set(s.Public())
	c := Capability{Volume: 7, Session: 9, Epoch: 3, Mode: ModeWrite, Expiry: now.Add(time.Minute)}
	tok := s.Sign(c)
	got, err := keys.Verify(tok, now)
	if err != nil {
		t.Fatal(err)
	}
	if got.Volume != 7 || got.Session != 9 || got.Epoch != 3 || got.Mode != ModeWrite || got.KeyID != 1 ||
		got.Expiry.UnixMilli() != c.Expiry.UnixMilli() {
		t.Fatalf("got %+v", got)
	}
	if !got.Allows(true, 3) || !got.Allows(false, 0) || got.Allows(false, 4) || got.Allows(true, ^uint64(0)) {
		t.Fatal("Allows: an epoch above the signed one must never count")
	}
	ro := Capability{Volume: 7, Epoch: 3, Mode: ModeRead, Expiry: now.Add(time.Minute)}
	if g, _ := keys.Verify(s.Sign(ro), now); g.Allows(true, 3) {
		t.Fatal("a read capability allows a write")
	}
	// Every bit matters.
	for i := range tok {
		bad := append([]byte(nil), tok...)
		bad[i] ^= 0x10
		if _, err := keys.Verify(bad, now); err == nil {
			t.Fatalf("token with byte %d changed verifies", i)
		}
	}
	if _, err := keys.Verify(tok, now.Add(time.Minute+Skew+time.Second)); !errors.Is(err, ErrExpired) {
		t.Fatalf("expired token: %v", err)
	}
	// Another key (a forger's) is unknown.
	if _, err := keys.Verify(signer(t, 1).Sign(c), now); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("forged token: %v", err)
	}
	// Rotation: the previous key still verifies, the one before it not.
	if _, err := s.Rotate(now); err != nil {
		t.Fatal(err)
	}
	keys.Set(s.Public())
	if _, err := keys.Verify(tok, now); err != nil {
		t.Fatalf("token of the previous key after one rotation: %v", err)
	}
	tok2 := s.Sign(c)
	if _, err := s.Rotate(now); err != nil {
		t.Fatal(err)
	}
	keys.Set(s.Public())
	if _, err := keys.Verify(tok, now); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("token of a key rotated out twice: %v", err)
	}
	if _, err := keys.Verify(tok2, now); err != nil {
		t.Fatal(err)
	}
	var none Keys
	if _, err := none.Verify(tok2, now); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("no keys: %v", err)
	}
}

// FuzzVerify: no input panics Verify or verifies without the key's signature.
func FuzzVerify(f *testing.F) {
	s := signer(f, 1)
	var keys Keys
	keys.Set(s.Public())
	now := time.Now()
	good := s.Sign(Capability{Volume: 1, Epoch: 2, Mode: ModeWrite, Expiry: now.Add(time.Hour)})
	f.Add(good)
	f.Add([]byte{})
	f.Add(make([]byte, Size))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := keys.Verify(b, now)
		if err == nil && string(b) != string(good) {
			// Ed25519 signatures are not malleable: only the signed token passes.
			t.Fatalf("verified a token the key never signed: %+v", c)
		}
	})
}
