package main

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"
	"os"
)

// clusterKeys are the two keys derived from the one cluster secret: one for
// memberlist's AES-GCM and one for hop-header HMACs. Deriving them keeps a
// single Secret to rotate and makes neither key reveal the other.
type clusterKeys struct {
	Gossip []byte // 32 bytes (AES-256); nil when unauthenticated
	Hop    []byte
}

// unauthenticatedHopKey is used without a secret: hop headers are then only
// a loop guard, not a security boundary (the sidecar warns at start-up).
var unauthenticatedHopKey = []byte("kvroute unauthenticated hop key")

func loadClusterKeys(path string) (clusterKeys, error) {
	if path == "" {
		return clusterKeys{Hop: unauthenticatedHopKey}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return clusterKeys{}, fmt.Errorf("read cluster secret: %w", err)
	}
	secret := bytes.TrimSpace(b)
	if len(secret) < 16 {
		return clusterKeys{}, fmt.Errorf("cluster secret in %s is %d bytes; want at least 16", path, len(secret))
	}
	return deriveKeys(secret)
}

func deriveKeys(secret []byte) (clusterKeys, error) {
	g, err := hkdf.Key(sha256.New, secret, nil, "kvroute gossip v1", 32)
	if err != nil {
		return clusterKeys{}, err
	}
	h, err := hkdf.Key(sha256.New, secret, nil, "kvroute hop v1", 32)
	if err != nil {
		return clusterKeys{}, err
	}
	return clusterKeys{Gossip: g, Hop: h}, nil
}
