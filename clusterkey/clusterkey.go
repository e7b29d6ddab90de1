// Package clusterkey derives the mesh's keys from the one cluster secret:
// memberlist's gossip encryption key and the hop-header HMAC key. The
// sidecar and anything that talks to sidecars (tests, tools) derive them
// here, the one place that knows how.
package clusterkey

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"
	"os"
)

// Keys are the two keys derived from the one cluster secret: one for
// memberlist's AES-GCM and one for hop-header HMACs. Deriving them keeps a
// single Secret to rotate and makes neither key reveal the other.
type Keys struct {
	Gossip []byte // 32 bytes (AES-256); nil when unauthenticated
	Hop    []byte
}

// unauthenticatedHopKey is used without a secret: hop headers are then only
// a loop guard, not a security boundary (the sidecar warns at start-up).
var unauthenticatedHopKey = []byte("kvroute unauthenticated hop key")

// MinSecretBytes is the shortest secret accepted.
const MinSecretBytes = 16

// Load reads the secret from path (surrounding white space trimmed) and
// derives the keys. An empty path means no secret: no gossip encryption,
// and hop headers that are a loop guard only.
func Load(path string) (Keys, error) {
	if path == "" {
		return Keys{Hop: unauthenticatedHopKey}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Keys{}, fmt.Errorf("read cluster secret: %w", err)
	}
	secret := bytes.TrimSpace(b)
	if len(secret) < MinSecretBytes {
		return Keys{}, fmt.Errorf("cluster secret in %s is %d bytes; want at least %d", path, len(secret), MinSecretBytes)
	}
	return Derive(secret)
}

// Derive returns the keys of a secret: HKDF-SHA256 with the infos
// "kvroute gossip v1" and "kvroute hop v1", 32 bytes each.
func Derive(secret []byte) (Keys, error) {
	g, err := hkdf.Key(sha256.New, secret, nil, "kvroute gossip v1", 32)
	if err != nil {
		return Keys{}, err
	}
	h, err := hkdf.Key(sha256.New, secret, nil, "kvroute hop v1", 32)
	if err != nil {
		return Keys{}, err
	}
	return Keys{Gossip: g, Hop: h}, nil
}
