package iscsi

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzReadPDU: any byte stream either parses into PDUs that re-encode to
// the same bytes, or fails cleanly; never a panic or an oversized buffer.
func FuzzReadPDU(f *testing.F) {
	nop := &pdu{data: []byte("ping")}
	nop.bhs[0], nop.bhs[1] = opNopOut|0x40, 0x80
	f.Add(appendPDU(nil, nop, false, false), false, false)
	f.Add(appendPDU(nil, nop, true, true), true, true)
	cmd := &pdu{ahs: []byte{0, 5, 1, 0, 1, 2, 3, 4}}
	cmd.bhs[0], cmd.bhs[1] = opSCSICmd, 0xa0
	f.Add(appendPDU(nil, cmd, true, false), true, false)
	f.Add([]byte{0x3f, 0x80, 0, 0, 255, 255, 255, 255}, false, false)
	f.Fuzz(func(t *testing.T, b []byte, hd, dd bool) {
		const maxData = 8192
		br := bufio.NewReader(bytes.NewReader(b))
		for {
			p, err := readPDU(br, hd, dd, maxData)
			if err != nil {
				return
			}
			if len(p.data) > maxData || len(p.ahs) > 255*4 {
				t.Fatalf("parsed a PDU beyond the bounds: data %d, AHS %d", len(p.data), len(p.ahs))
			}
			_ = p.extendedCDB()
			again, err := readPDU(bufio.NewReader(bytes.NewReader(appendPDU(nil, p, hd, dd))), hd, dd, maxData)
			if err != nil || again.bhs != p.bhs || !bytes.Equal(again.ahs, p.ahs) || !bytes.Equal(again.data, p.data) {
				t.Fatalf("re-encoding did not round-trip: %v", err)
			}
		}
	})
}

// FuzzParseText: the login and Text key=value parser is bounded and, for
// what it accepts, the encoding round-trips; negotiating the keys never
// panics.
func FuzzParseText(f *testing.F) {
	f.Add([]byte("InitiatorName=iqn.2026-11.x:y\x00SessionType=Normal\x00TargetName=t\x00"))
	f.Add([]byte("AuthMethod=CHAP,None\x00CHAP_A=7,5\x00"))
	f.Add([]byte("HeaderDigest=CRC32C,None\x00MaxBurstLength=0x10000\x00X-foo=bar\x00\x00\x00"))
	f.Add([]byte("a=1\x00a=2\x00"))
	f.Add([]byte("CHAP_C=0bAAAA\x00CHAP_R=0x1\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		kvs, err := parseText(b)
		if err != nil {
			return
		}
		if len(kvs) > maxTextPairs {
			t.Fatalf("%d pairs", len(kvs))
		}
		var enc []byte
		for _, x := range kvs {
			enc = appendText(enc, x.k, x.v)
			parseNumber(x.v)
			parseBinary(x.v)
			chooseCHAPAlg(x.v)
		}
		again, err := parseText(enc)
		if err != nil || len(again) != len(kvs) {
			t.Fatalf("re-encoded text did not parse back: %v", err)
		}
		for i := range kvs {
			if again[i] != kvs[i] {
				t.Fatalf("pair %d: %v became %v", i, kvs[i], again[i])
			}
		}
		c := newConn(&Server{cfg: Config{MaxRecvDataSegment: 8192}}, nil)
		for _, x := range kvs {
			c.operationalKey(x.k, x.v)
		}
		if c.maxBurst < 512 || c.firstBurst > c.maxBurst || c.peerMaxData < 512 {
			t.Fatalf("negotiated nonsense: MaxBurst %d FirstBurst %d MRDSL %d", c.maxBurst, c.firstBurst, c.peerMaxData)
		}
	})
}
