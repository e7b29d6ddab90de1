package forward

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// HopHeader marks a request one sidecar forwarded to another. The receiver
// serves a request carrying a valid header locally: one hop, never a loop
// (docs/design.md D5).
const HopHeader = "X-Kvroute-Hop"

// HopVersion is the hop header's format, its first field; the header is
// the one sidecar-to-sidecar message that does not travel by gossip, and
// this is its wire version (docs/compat.md). v0.1.0 and v0.2.0 both write
// "v1". v0.1.0 takes a header of another format, or with fields past the
// time, for malformed, and routes the request again as if a client had
// sent it: so the format stays v1 for as long as a v0.1.0 sidecar may
// receive a hop. From v0.2.0 on Verify reads fields appended after the
// time (the MAC covers them) and ignores them, so a later version may add
// one and still be trusted by this one; it must add it only for targets
// whose gossip wire version (their node meta) says they read it.
const HopVersion = "v1"

// Hop errors say why a header was not trusted; the handler counts them and
// routes the request as if the header were absent.
var (
	ErrHopMalformed = errors.New("hop header malformed")
	ErrHopBadMAC    = errors.New("hop header signature mismatch")
	ErrHopStale     = errors.New("hop header outside its validity window")
	ErrHopOtherNode = errors.New("hop header addressed to another node")
)

// Hop signs and verifies hop headers with the cluster's hop key. A header is
// bound to its target node and to a time window, so a captured header cannot
// be replayed against another pod or long after.
type Hop struct {
	key    []byte
	maxAge time.Duration
}

// NewHop returns a signer with key (derived from the cluster secret) that
// accepts headers at most maxAge old (and at most maxAge in the future, to
// tolerate clock skew between nodes).
func NewHop(key []byte, maxAge time.Duration) Hop {
	return Hop{key: append([]byte(nil), key...), maxAge: maxAge}
}

// Sign returns the header value for a request forwarded from node from to
// node to at time now. Format: "v1;from;to;unixmillis;mac".
func (h Hop) Sign(from, to string, now time.Time) string {
	body := HopVersion + ";" + from + ";" + to + ";" + strconv.FormatInt(now.UnixMilli(), 10)
	return body + ";" + h.mac(body)
}

// Verify checks value for a request arriving at node self and returns the
// sending node. Fields after the time, which a later version may append,
// are authenticated with the rest and otherwise ignored.
func (h Hop) Verify(value, self string, now time.Time) (from string, err error) {
	i := strings.LastIndexByte(value, ';')
	if i < 0 {
		return "", ErrHopMalformed
	}
	body, mac := value[:i], value[i+1:]
	parts := strings.Split(body, ";")
	if len(parts) < 4 || parts[0] != HopVersion {
		return "", ErrHopMalformed
	}
	ms, err := strconv.ParseInt(parts[3], 10, 64)
	if err != nil {
		return "", ErrHopMalformed
	}
	if !hmac.Equal([]byte(mac), []byte(h.mac(body))) {
		return "", ErrHopBadMAC
	}
	if parts[2] != self {
		return "", ErrHopOtherNode
	}
	age := now.Sub(time.UnixMilli(ms))
	if age > h.maxAge || age < -h.maxAge {
		return "", ErrHopStale
	}
	return parts[1], nil
}

func (h Hop) mac(body string) string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(body))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
