package gossip

import (
	"fmt"
	"time"
)

// needFull asks Origin to send its full digest to Requester. Wire form:
//
//	kind | requester len u8 | requester | origin len u8 | origin
type needFull struct{ Requester, Origin string }

func encodeNeedFull(n needFull) ([]byte, error) {
	if len(n.Requester) > 255 || len(n.Origin) > 255 {
		return nil, fmt.Errorf("encode need-full: name over 255 bytes")
	}
	b := make([]byte, 0, 3+len(n.Requester)+len(n.Origin))
	b = append(b, kindNeedFull, byte(len(n.Requester)))
	b = append(b, n.Requester...)
	b = append(b, byte(len(n.Origin)))
	b = append(b, n.Origin...)
	return b, nil
}

func decodeNeedFullMsg(b []byte) (payload, error) {
	var names [2]string
	for i := range names {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return nil, fmt.Errorf("truncated need-full")
		}
		names[i] = string(b[1 : 1+int(b[0])])
		b = b[1+int(b[0]):]
	}
	if len(b) != 0 || names[0] == "" || names[1] == "" {
		return nil, fmt.Errorf("need-full with %d trailing bytes or an empty name", len(b))
	}
	return needFull{Requester: names[0], Origin: names[1]}, nil
}

func (n needFull) encode() ([]byte, error) { return encodeNeedFull(n) }

// apply queues the full local digest for the requester, if the request is
// ours to answer.
func (n needFull) apply(m *Mesh, _ time.Time) {
	s := m.members.get(n.Requester)
	if n.Origin != m.cfg.NodeName || s == nil || !m.digests.has() {
		m.stats.unknownOrigin.Add(1)
		return
	}
	m.stats.fullServed.Add(1)
	s.requestFull()
}

// askLocked sends a need-full request to id unless one went recently. The
// caller holds tableMu.
func (m *Mesh) askLocked(id string, now time.Time) {
	if m.table.ask(id, now, m.cfg.NeedFullInterval) {
		m.sendNeedFullLocked(id)
	}
}

// sendNeedFullLocked queues a need-full request to id. The caller holds
// tableMu.
func (m *Mesh) sendNeedFullLocked(id string) {
	s := m.members.get(id)
	if s == nil {
		return
	}
	b, err := encodeNeedFull(needFull{Requester: m.cfg.NodeName, Origin: id})
	if err != nil {
		return // names are bounded by validate and memberlist
	}
	m.stats.fullRequests.Add(1)
	s.enqueue(out{b: b})
}
