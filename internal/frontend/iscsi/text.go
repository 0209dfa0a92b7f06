package iscsi

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Limits on text (login and Text PDU) data.
const (
	maxKeyLen    = 63
	maxValueLen  = 8192 // CHAP_C and CHAP_R may be long; simple values are much shorter
	maxTextBytes = 64 << 10
	maxTextPairs = 256
)

// ErrBadText: text data that is not a list of key=value pairs.
var ErrBadText = errors.New("iscsi: malformed key=value text")

// kv is one key=value pair.
type kv struct{ k, v string }

// parseText parses NUL-terminated key=value pairs (RFC 7143 6.1). Empty
// strings (padding) are skipped; a key given twice is an error.
func parseText(b []byte) ([]kv, error) {
	if len(b) > maxTextBytes {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadText, len(b))
	}
	var out []kv
	seen := map[string]bool{}
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		var s []byte
		if i < 0 {
			s, b = b, nil
		} else {
			s, b = b[:i], b[i+1:]
		}
		if len(s) == 0 {
			continue
		}
		eq := bytes.IndexByte(s, '=')
		if eq <= 0 {
			return nil, fmt.Errorf("%w: %q has no key=value form", ErrBadText, trunc(s))
		}
		k, v := string(s[:eq]), string(s[eq+1:])
		if len(k) > maxKeyLen || len(v) > maxValueLen {
			return nil, fmt.Errorf("%w: key or value too long in %q", ErrBadText, trunc(s))
		}
		for _, c := range []byte(k) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '+' || c == '@' || c == '_') {
				return nil, fmt.Errorf("%w: key %q has a bad character", ErrBadText, trunc([]byte(k)))
			}
		}
		if seen[k] {
			return nil, fmt.Errorf("%w: key %q given twice", ErrBadText, k)
		}
		seen[k] = true
		if len(out) == maxTextPairs {
			return nil, fmt.Errorf("%w: more than %d keys", ErrBadText, maxTextPairs)
		}
		out = append(out, kv{k, v})
	}
	return out, nil
}

func trunc(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}

func appendText(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, '=')
	b = append(b, v...)
	return append(b, 0)
}

// parseNumber parses a decimal, 0x-hex or 0b-base64 number (RFC 7143 6.1's
// numerical values).
func parseNumber(v string) (uint64, bool) {
	if len(v) > 2 && (v[:2] == "0x" || v[:2] == "0X") {
		n, err := strconv.ParseUint(v[2:], 16, 64)
		return n, err == nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil
}

// parseBinary parses a binary value: 0x hex or 0b base64.
func parseBinary(v string) ([]byte, bool) {
	if len(v) < 3 {
		return nil, false
	}
	switch v[:2] {
	case "0x", "0X":
		s := v[2:]
		if len(s)%2 == 1 {
			s = "0" + s
		}
		b, err := hex.DecodeString(s)
		return b, err == nil
	case "0b", "0B":
		b, err := base64.StdEncoding.DecodeString(v[2:])
		return b, err == nil
	}
	return nil, false
}

func hexValue(b []byte) string { return "0x" + hex.EncodeToString(b) }

// listHas reports whether the comma-separated list v offers s.
func listHas(v, s string) bool {
	for _, x := range strings.Split(v, ",") {
		if x == s {
			return true
		}
	}
	return false
}
