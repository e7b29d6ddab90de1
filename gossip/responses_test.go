package gossip

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/memberlist"

	"github.com/kvroute/kvroute/respown"
)

// vid is a vLLM-made response id.
func vid(i int) string { return fmt.Sprintf("resp_%032x", i) }

func responsesOf(m message) responsesMsg { r, _ := m.body.(responsesMsg); return r }

func TestResponsesRoundTrip(t *testing.T) {
	tests := []responsesMsg{
		{Entries: []respown.Entry{{ID: vid(1), Node: "n0"}}},
		{State: true, Entries: []respown.Entry{
			{ID: vid(1), Node: "pod-a"},
			{ID: "caller's own id", Node: "pod-b"},
			{ID: vid(2), Node: "pod-a"},
			{ID: strings.Repeat("x", respown.MaxIDBytes), Node: strings.Repeat("p", 255)},
			{ID: "resp_0123456789ABCDEF0123456789abcdef", Node: "pod-b"}, // upper case: sent as it is
		}},
		{State: true, Entries: []respown.Entry{}},
	}
	for _, want := range tests {
		b, err := encodeResponses(want)
		if err != nil {
			t.Fatalf("encodeResponses(%+v) error %v", want, err)
		}
		got, err := decodeMsg(b)
		if err != nil || got.kind != kindResponses {
			t.Fatalf("decodeMsg(responses) = %+v, %v", got, err)
		}
		if diff := cmp.Diff(want, responsesOf(got)); diff != "" {
			t.Errorf("decodeMsg(responses) mismatch (-want +got):\n%s", diff)
		}
	}
	// A vLLM id travels in 17 bytes, not 38.
	one, _ := encodeResponses(responsesMsg{Entries: []respown.Entry{{ID: vid(1), Node: "n"}}})
	two, _ := encodeResponses(responsesMsg{Entries: []respown.Entry{{ID: vid(1), Node: "n"}, {ID: vid(2), Node: "n"}}})
	if d := len(two) - len(one); d != 18 {
		t.Errorf("an entry of a vLLM id costs %d bytes; want 18 (index, marker, 16)", d)
	}
	for _, bad := range []responsesMsg{
		{Entries: []respown.Entry{{ID: "", Node: "n"}}},
		{Entries: []respown.Entry{{ID: strings.Repeat("x", respown.MaxIDBytes+1), Node: "n"}}},
		{Entries: []respown.Entry{{ID: vid(1), Node: ""}}},
		{Entries: []respown.Entry{{ID: vid(1), Node: strings.Repeat("p", 256)}}},
		{Entries: make([]respown.Entry, maxRespEntries+1)},
	} {
		if _, err := encodeResponses(bad); err == nil {
			t.Errorf("encodeResponses(%d entries, first %+v): no error", len(bad.Entries), bad.Entries[0])
		}
	}
}

func TestDecodeResponsesErrors(t *testing.T) {
	good, _ := encodeResponses(responsesMsg{Entries: []respown.Entry{{ID: vid(1), Node: "a"}, {ID: "x", Node: "b"}}})
	tests := []struct {
		name string
		in   []byte
	}{
		{"kind only", []byte{kindResponses}},
		{"no flags", []byte{kindResponses, respVersion}},
		{"version 0", []byte{kindResponses, 0, 0, 0, 0}}, // a newer version's 2 is ErrNewer (TestDecodeMsgNewer)
		{"unknown flag", []byte{kindResponses, respVersion, 2, 0, 0}},
		{"owner count over the bytes", []byte{kindResponses, respVersion, 0, 5, 1, 'a', 0}},
		{"empty owner", []byte{kindResponses, respVersion, 0, 1, 0, 0}},
		{"no entry count", []byte{kindResponses, respVersion, 0, 1, 1, 'a'}},
		{"entry count over the bytes", []byte{kindResponses, respVersion, 0, 1, 1, 'a', 9, 0, 1, 'x'}},
		{"owner index out of range", []byte{kindResponses, respVersion, 0, 1, 1, 'a', 1, 1, 1, 'x'}},
		{"packed id truncated", append([]byte{kindResponses, respVersion, 0, 1, 1, 'a', 1, 0, 0}, make([]byte, 15)...)},
		{"raw id truncated", []byte{kindResponses, respVersion, 0, 1, 1, 'a', 1, 0, 3, 'x', 'y'}},
		{"raw id too long", append([]byte{kindResponses, respVersion, 0, 1, 1, 'a', 1, 0, respown.MaxIDBytes + 1}, make([]byte, respown.MaxIDBytes+1)...)},
		{"trailing bytes", append(good[:len(good):len(good)], 0)},
		{"truncated", good[:len(good)-1]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if m, err := decodeMsg(tt.in); !errors.Is(err, ErrMsg) {
				t.Errorf("decodeMsg(%x) = %+v, %v; want ErrMsg", tt.in, m, err)
			}
		})
	}
}

func FuzzResponses(f *testing.F) {
	for _, r := range []responsesMsg{
		{Entries: []respown.Entry{{ID: vid(7), Node: "n0"}}},
		{State: true, Entries: []respown.Entry{{ID: vid(1), Node: "a"}, {ID: "own-id", Node: "b"}, {ID: vid(2), Node: "a"}}},
		{},
	} {
		b, _ := encodeResponses(r)
		f.Add(b)
	}
	// A raw id in vLLM's form decodes to the id a packed one does.
	f.Add([]byte("\xd6\x01\x00\x01\x01n\x01\x00\x25resp_0123456789abcdef0123456789abcdef"))
	f.Add([]byte{kindResponses, respVersion, 0, 2, 1, 'a', 1, 'a', 2, 1, 1, 'x', 0, 1, 'y'}) // one name twice
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMsg(b)
		if err != nil || m.kind != kindResponses {
			return
		}
		r := responsesOf(m)
		again, err := r.encode()
		if err != nil {
			t.Fatalf("re-encode %+v: %v", r, err)
		}
		m2, err := decodeMsg(again)
		if err != nil {
			t.Fatalf("decodeMsg(re-encoded) error %v", err)
		}
		if diff := cmp.Diff(r, responsesOf(m2)); diff != "" {
			t.Fatalf("round trip mismatch (-first +second):\n%s", diff)
		}
		for _, e := range r.Entries {
			if !respown.Valid(e.ID) || e.Node == "" {
				t.Fatalf("decoded an entry the table refuses: %+v", e)
			}
		}
	})
}

// owner is ResponseOwner as one comparable value.
type owner struct {
	Node      string
	Alive, OK bool
}

func ownerOf(m *Mesh, id string) owner {
	n, alive, ok := m.ResponseOwner(id)
	return owner{n, alive, ok}
}

func TestMeshAnnounceResponses(t *testing.T) {
	ms := cluster(t, 3, nil)
	ids := make([]string, 0, 2*respBatch+100)
	for i := range cap(ids) - 1 {
		ids = append(ids, vid(i))
	}
	ids = append(ids, "caller-chosen id")
	start := time.Now()
	ms[0].AnnounceResponses(append(ids, "", strings.Repeat("x", respown.MaxIDBytes+1))...)
	if got, want := ownerOf(ms[0], ids[0]), (owner{"n0", true, true}); got != want {
		t.Errorf("announcer's own ResponseOwner = %+v; want %+v at once", got, want)
	}
	// The requirement: a follow-up a second later, through another
	// sidecar, finds the owner.
	waitFor(t, time.Second, "every announced response on n1 and n2", func() bool {
		for _, m := range ms[1:] {
			for _, id := range ids {
				if ownerOf(m, id) != (owner{"n0", true, true}) {
					return false
				}
			}
		}
		return true
	})
	t.Logf("announcements of %d ids seen by every peer after %v", len(ids), time.Since(start))
	for _, m := range ms {
		if got := ownerOf(m, strings.Repeat("x", respown.MaxIDBytes+1)); got.OK {
			t.Errorf("%s knows an owner of an over-long id: %+v", m.cfg.NodeName, got)
		}
		if got := ownerOf(m, vid(1<<20)); got != (owner{}) {
			t.Errorf("%s ResponseOwner(never announced) = %+v; want zero", m.cfg.NodeName, got)
		}
	}
	// Batches of respBatch: at least three messages to each peer.
	if s := ms[0].Stats(); s.Sent.All["responses"].Msgs < 6 {
		t.Errorf("n0 sent %d responses messages; want >= 6 (3 per peer)", s.Sent.All["responses"].Msgs)
	}
	if s := ms[1].Stats(); s.Received.All["responses"].Msgs < 3 || s.DecodeErrors != 0 {
		t.Errorf("n1 received %d responses messages, %d decode errors; want >= 3, 0", s.Received.All["responses"].Msgs, s.DecodeErrors)
	}
}

// A response that n2's vLLM made while n0 sent it the request directly
// (n2's sidecar draining or away) is n2's on every member, announced by n0,
// mixed in one flush with n0's own; one for a node that is no member is
// away at once, so it ages out unless that node comes back.
func TestMeshAnnounceResponsesOf(t *testing.T) {
	ms := cluster(t, 3, nil)
	ms[0].AnnounceResponses(vid(1))
	ms[0].AnnounceResponsesOf("n2", vid(2), vid(3))
	ms[0].AnnounceResponsesOf("left-a-moment-ago", vid(4))
	ms[0].AnnounceResponsesOf("", vid(5))
	waitFor(t, 2*time.Second, "n0's and n2's responses on n1 and n2", func() bool {
		for _, m := range ms[1:] {
			if ownerOf(m, vid(1)) != (owner{"n0", true, true}) || ownerOf(m, vid(3)) != (owner{"n2", true, true}) ||
				ownerOf(m, vid(4)).Node != "left-a-moment-ago" {
				return false
			}
		}
		return true
	})
	for _, m := range ms {
		if got := ownerOf(m, vid(2)); got != (owner{"n2", true, true}) {
			t.Errorf("%s: owner of a response n2 made for n0 = %+v; want n2, alive", m.cfg.NodeName, got)
		}
		if l, _ := m.LookupResponse(vid(4)); l.Status != respown.Away {
			t.Errorf("%s: a non-member's announced response is %+v; want away", m.cfg.NodeName, l)
		}
		if got := ownerOf(m, vid(5)); got.OK {
			t.Errorf("%s: a response announced for no node has owner %+v", m.cfg.NodeName, got)
		}
	}
}

func TestMeshResponsesOfALeaver(t *testing.T) {
	ms := cluster(t, 3, nil)
	ms[2].AnnounceResponses(vid(1), vid(2))
	waitFor(t, 2*time.Second, "n2's responses on n0 and n1", func() bool {
		return ownerOf(ms[0], vid(2)).Alive && ownerOf(ms[1], vid(2)).Alive
	})
	if err := ms[2].Leave(time.Second); err != nil {
		t.Fatalf("Leave error %v", err)
	}
	ms[2].Shutdown()
	gone := owner{"n2", false, true}
	waitFor(t, 3*time.Second, "n2's responses held by a gone node", func() bool {
		return ownerOf(ms[0], vid(1)) == gone && ownerOf(ms[1], vid(2)) == gone
	})
	for _, m := range ms[:2] {
		m.responses.mu.Lock()
		g := m.responses.table.IsGone("n2")
		m.responses.mu.Unlock()
		if !g {
			t.Errorf("%s's table: n2 not marked gone, so its entries would never age out", m.cfg.NodeName)
		}
	}
	// Leaving is not proof its store went (a sidecar restart leaves too):
	// Away for the grace (Gone after it: respown's TestLookupGrace).
	l, ok := ms[0].LookupResponse(vid(1))
	if !ok || l.Node != "n2" || l.Status != respown.Away || l.Left.IsZero() {
		t.Errorf("LookupResponse(n2's) just after it left = %+v, %v; want n2, away, with the time it left", l, ok)
	}
	if got := ms[0].AwayNodes(); !slices.Equal(got, []string{"n2"}) {
		t.Errorf("AwayNodes() just after n2 left = %v; want [n2]", got)
	}
	if l, _ := ms[1].LookupResponse(vid(1)); l.Status != respown.Away {
		t.Errorf("n1's LookupResponse(n2's) = %+v; want away too", l)
	}
}

// A node that says, as it leaves, that its store is gone (its vLLM no
// longer listens) has its responses Gone on every peer at once: no grace.
func TestMeshResponsesOfALeaverWhoseStoreIsGone(t *testing.T) {
	ms := cluster(t, 3, nil)
	ms[2].AnnounceResponses(vid(1))
	waitFor(t, 2*time.Second, "n2's responses on n0 and n1", func() bool {
		return ownerOf(ms[0], vid(1)).Alive && ownerOf(ms[1], vid(1)).Alive
	})
	ms[2].SetStoreGone()
	// Before it leaves, its view says so: a peer that has the meta but not
	// yet the leaving answers the 404 all the same (forward).
	waitFor(t, 2*time.Second, "n2's view with its store gone on n0 and n1", func() bool {
		for _, m := range ms[:2] {
			gone := false
			for _, v := range m.Snapshot(time.Now()) {
				gone = gone || v.ID == "n2" && v.StoreGone
			}
			if !gone {
				return false
			}
		}
		return true
	})
	if err := ms[2].Leave(time.Second); err != nil {
		t.Fatalf("Leave error %v", err)
	}
	ms[2].Shutdown()
	for _, m := range ms[:2] {
		waitFor(t, 10*time.Second, m.cfg.NodeName+" has n2's responses gone", func() bool {
			l, ok := m.LookupResponse(vid(1))
			return ok && l.Node == "n2" && l.Status == respown.Gone
		})
		if got := m.AwayNodes(); len(got) != 0 {
			t.Errorf("%s: AwayNodes() = %v; want none (n2 is not coming back with a store)", m.cfg.NodeName, got)
		}
	}
}

// A member's entry is Live, recorded when it was announced; one whose owner
// is no member is Away even before the table heard it leave.
func TestMeshLookupResponse(t *testing.T) {
	m := start(t, testConfig("solo"))
	before := time.Now().Truncate(time.Second)
	m.AnnounceResponses(vid(1))
	l, ok := m.LookupResponse(vid(1))
	if !ok || l.Node != "solo" || l.Status != respown.Live || l.At.Before(before) || l.At.After(time.Now()) {
		t.Errorf("LookupResponse(own) = %+v, %v; want solo, live, recorded now to the second", l, ok)
	}
	m.responses.mu.Lock()
	m.responses.table.Add("stranger", []string{vid(2)}, time.Now())
	m.responses.mu.Unlock()
	if l, _ := m.LookupResponse(vid(2)); l.Status != respown.Away || l.Left.IsZero() {
		t.Errorf("LookupResponse(a non-member's) = %+v; want away", l)
	}
}

func TestMeshRestartLearnsResponses(t *testing.T) {
	for _, graceful := range []bool{true, false} {
		t.Run(fmt.Sprintf("leave=%v", graceful), func(t *testing.T) {
			ms := cluster(t, 3, nil)
			ms[1].AnnounceResponses(vid(1), "n1's own id")
			ms[0].AnnounceResponses(vid(2))
			ms[2].AnnounceResponses(vid(3))
			waitFor(t, 2*time.Second, "every response everywhere", func() bool {
				for _, m := range ms {
					if !ownerOf(m, vid(1)).OK || !ownerOf(m, vid(2)).OK || !ownerOf(m, vid(3)).OK {
						return false
					}
				}
				return true
			})
			// The sidecar restarts; its pod, and so its address and name,
			// and its vLLM's store, live on.
			c := testConfig("n1")
			_, port, _ := net.SplitHostPort(gossipAddr(ms[1]))
			c.BindPort, _ = strconv.Atoi(port)
			c.Join = []string{gossipAddr(ms[0])}
			if graceful {
				if err := ms[1].Leave(time.Second); err != nil {
					t.Fatalf("Leave error %v", err)
				}
			}
			ms[1].Shutdown()
			n1 := start(t, c)
			// Its own pod's responses come only from peers' tables (n0 and
			// n2 replay only their own announcements), so this is push/pull.
			want := map[string]owner{
				vid(1):        {"n1", true, true},
				"n1's own id": {"n1", true, true},
				vid(2):        {"n0", true, true},
				vid(3):        {"n2", true, true},
			}
			waitFor(t, 5*time.Second, "the restarted node knows every owner", func() bool {
				for id, w := range want {
					if ownerOf(n1, id) != w {
						return false
					}
				}
				return true
			})
			waitFor(t, 5*time.Second, "peers see n1's responses alive again", func() bool {
				return ownerOf(ms[0], vid(1)) == want[vid(1)] && ownerOf(ms[2], vid(1)) == want[vid(1)]
			})
		})
	}
}

func TestMeshReplaysToNewcomer(t *testing.T) {
	ms := cluster(t, 2, nil)
	ms[0].AnnounceResponses(vid(1), vid(2))
	waitFor(t, 2*time.Second, "n0's responses on n1", func() bool { return ownerOf(ms[1], vid(2)).OK })
	// n1 lost them (its push/pull came before the announcement reached
	// anyone it asked); n0 seeing it join sends its latest again.
	ms[1].responses.mu.Lock()
	ms[1].responses.table = respown.New(16, time.Minute, 0)
	ms[1].responses.mu.Unlock()
	ms[0].responsesJoined("n1")
	waitFor(t, 2*time.Second, "the replay on n1", func() bool {
		return ownerOf(ms[1], vid(1)) == owner{"n0", true, true} && ownerOf(ms[1], vid(2)).OK
	})
}

func TestResponseState(t *testing.T) {
	m := start(t, testConfig("solo"))
	if b := m.responseState(true); b != nil {
		t.Errorf("state of an empty table = %d bytes; want none", len(b))
	}
	n := maxRespEntries + 100
	ids := make([]string, n)
	for i := range ids {
		ids[i] = vid(i)
	}
	m.AnnounceResponses(ids...)
	responsesMsg{State: true, Entries: []respown.Entry{{ID: "a ghost's", Node: "ghost"}}}.apply(m, time.Now())
	if got := ownerOf(m, "a ghost's"); got != (owner{"ghost", false, true}) {
		t.Errorf("ResponseOwner(an owner never a member) = %+v; want it, not alive", got)
	}
	for _, tt := range []struct {
		join bool
		want int
	}{{true, maxRespEntries}, {false, respSyncEntries}} {
		b := m.responseState(tt.join)
		got, err := decodeMsg(b)
		if err != nil {
			t.Fatalf("decodeMsg(state) error %v", err)
		}
		r := responsesOf(got)
		if !r.State || len(r.Entries) != tt.want || r.Entries[len(r.Entries)-1].ID != ids[n-1] || r.Entries[0].ID != ids[n-tt.want] {
			t.Errorf("state(join %v): State %v, %d entries from %s to %s; want the newest %d, none of the gone node's",
				tt.join, r.State, len(r.Entries), r.Entries[0].ID, r.Entries[len(r.Entries)-1].ID, tt.want)
		}
		if tt.join && len(b) > 200<<10 {
			t.Errorf("join state of %d entries is %d bytes; want about 150 KB", len(r.Entries), len(b))
		}
	}
	// A state fills gaps and never moves an id; an announcement does.
	responsesMsg{State: true, Entries: []respown.Entry{{ID: ids[0], Node: "ghost"}}}.apply(m, time.Now())
	if got := ownerOf(m, ids[0]); got.Node != "solo" {
		t.Errorf("after a state naming another owner: %+v; want solo", got)
	}
	responsesMsg{Entries: []respown.Entry{{ID: ids[0], Node: "ghost"}}}.apply(m, time.Now())
	if got := ownerOf(m, ids[0]); got.Node != "ghost" {
		t.Errorf("after an announcement by another owner: %+v; want ghost", got)
	}
}

// A pod being deleted says its store is gone and leaves at once, as the
// sidecar's shutdown does, while other updates of its meta go out (the
// drain's repeat, its engine's state): those must not end SetStoreGone's
// wait before its update is sent. memberlist drops a queued alive message
// about a node when another one is queued and wakes the first one's
// waiter as if it had been sent; the leave then drops the newer one, and
// peers hold the responses as away (for the grace), not gone.
func TestMeshStoreGoneOutlivesOtherMetaUpdates(t *testing.T) {
	// Gossip rounds far apart, so that little goes out by chance between
	// an update replaced and the leave: SetStoreGone's own must.
	slow := func(_ int, c *Config) {
		c.Memberlist = func(mc *memberlist.Config) { fastDetection(mc); mc.GossipInterval = 300 * time.Millisecond }
	}
	for i := range 3 {
		ms := cluster(t, 2, slow)
		ms[1].AnnounceResponses(vid(i))
		waitFor(t, 2*time.Second, "n1's response on n0", func() bool { return ownerOf(ms[0], vid(i)).Alive })
		stop, done := make(chan struct{}), make(chan struct{})
		go func() { // other updates, each replacing the one before
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					ms[1].updateMeta(time.Millisecond)
				}
			}
		}()
		ms[1].SetStoreGone()
		close(stop)
		<-done
		if err := ms[1].Leave(time.Second); err != nil {
			t.Fatalf("Leave error %v", err)
		}
		ms[1].Shutdown()
		waitFor(t, 5*time.Second, fmt.Sprintf("round %d: n1's response gone on n0", i), func() bool {
			l, ok := ms[0].LookupResponse(vid(i))
			return ok && l.Status == respown.Gone
		})
	}
}
