package clusterkey

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	k, err := Load(write("ok", "  0123456789abcdef-secret\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(k.Gossip) != 32 || len(k.Hop) != 32 || bytes.Equal(k.Gossip, k.Hop) {
		t.Errorf("keys %x / %x: want two different 32-byte keys", k.Gossip, k.Hop)
	}
	same, _ := Derive([]byte("0123456789abcdef-secret"))
	if !bytes.Equal(same.Hop, k.Hop) || !bytes.Equal(same.Gossip, k.Gossip) {
		t.Errorf("Load differs from Derive of the trimmed secret")
	}
	other, _ := Derive([]byte("0123456789abcdef-secreT"))
	if bytes.Equal(other.Hop, k.Hop) {
		t.Errorf("two secrets derived one hop key")
	}
	if _, err := Load(write("short", "too short\n")); err == nil {
		t.Errorf("a 9-byte secret was accepted")
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("a missing secret file was accepted")
	}
	none, err := Load("")
	if err != nil || none.Gossip != nil || len(none.Hop) == 0 {
		t.Errorf("no secret: %+v, %v; want no gossip key and the loop-guard hop key", none, err)
	}
}
