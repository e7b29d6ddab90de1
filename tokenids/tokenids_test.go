package tokenids

import (
	"encoding/json"
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []uint32
		ok   bool
	}{
		{`[1,2,3]`, []uint32{1, 2, 3}, true},
		{" \t[ 0 ,\n 4294967295 ]\r\n", []uint32{0, 4294967295}, true},
		{`[4294967296]`, nil, false},
		{`[]`, nil, false},
		{`[01]`, nil, false},
		{`[-1]`, nil, false},
		{`[1.0]`, nil, false},
		{`[1e3]`, nil, false},
		{`[1,]`, nil, false},
		{`[1 2]`, nil, false},
		{`[[1,2]]`, nil, false},
		{`["1"]`, nil, false},
		{`[1]x`, nil, false},
		{`[1`, nil, false},
		{`"abc"`, nil, false},
		{``, nil, false},
	} {
		got, ok := Parse([]byte(tt.in))
		if ok != tt.ok || !slices.Equal(got, tt.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzParse checks the fast path against encoding/json: whatever it
// accepts, json decodes to the same ids; whatever non-empty flat array json
// accepts, it accepts too (so it never sends a valid prompt the slow way).
func FuzzParse(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, ` [ 0 , 4294967295 ] `, `[01]`, `[1.5]`, `[-0]`, `[]`, `[1e2]`, `[[1]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := Parse(b)
		var slow []uint32
		err := json.Unmarshal(b, &slow)
		if ok && (err != nil || !slices.Equal(fast, slow)) {
			t.Fatalf("Parse(%q) = %v; json gives %v, %v", b, fast, slow, err)
		}
		if !ok && err == nil && len(slow) > 0 {
			t.Fatalf("Parse(%q) declined; json gives %v", b, slow)
		}
	})
}

// FuzzParsePrefix checks that what ParsePrefix takes is a valid JSON array
// ending where it says, with the ids encoding/json reads from it, and that
// it takes whatever Parse takes.
func FuzzParsePrefix(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, ` [ 0 , 4294967295 ] ,"x"`, `[1]]`, `[01]`, `[1,]`, `[]`, `[1]{`, `[2 3]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, n, ok := ParsePrefix(b)
		if whole, wok := Parse(b); wok && (!ok || !slices.Equal(ids, whole)) {
			t.Fatalf("Parse(%q) = %v; ParsePrefix %v, %v", b, whole, ids, ok)
		}
		if !ok {
			return
		}
		var slow []uint32
		if n < 1 || n > len(b) || b[n-1] != ']' || !json.Valid(b[:n]) || json.Unmarshal(b[:n], &slow) != nil || !slices.Equal(ids, slow) {
			t.Fatalf("ParsePrefix(%q) = %v, %d: json gives %v for %q", b, ids, n, slow, b[:min(max(n, 0), len(b))])
		}
	})
}

// FuzzIDs checks IDs against []uint32 as a struct field: same error or not,
// same ids.
func FuzzIDs(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, `null`, `[]`, `[1.5]`, `"x"`, `[4294967296]`, `[[1]]`, `[1,]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		doc := append(append([]byte(`{"tokens":`), b...), '}')
		var fast struct{ Tokens IDs }
		var slow struct{ Tokens []uint32 }
		ef, es := json.Unmarshal(doc, &fast), json.Unmarshal(doc, &slow)
		if (ef == nil) != (es == nil) {
			t.Fatalf("%s: IDs error %v, []uint32 error %v", doc, ef, es)
		}
		if ef == nil && !slices.Equal(fast.Tokens, slow.Tokens) {
			t.Fatalf("%s: IDs %v, []uint32 %v", doc, fast.Tokens, slow.Tokens)
		}
	})
}

// BenchmarkDecode compares a 1032-id /tokenize answer decoded into IDs
// and into []uint32.
func BenchmarkDecode(b *testing.B) {
	ids := make([]uint32, 1032)
	for i := range ids {
		ids[i] = uint32(1000 + i*37)
	}
	doc, _ := json.Marshal(map[string]any{"count": len(ids), "max_model_len": 131072, "tokens": ids})
	b.Run("IDs", func(b *testing.B) {
		for b.Loop() {
			var v struct{ Tokens IDs }
			if err := json.Unmarshal(doc, &v); err != nil || len(v.Tokens) != len(ids) {
				b.Fatal(err)
			}
		}
	})
	b.Run("uint32s", func(b *testing.B) {
		for b.Loop() {
			var v struct{ Tokens []uint32 }
			if err := json.Unmarshal(doc, &v); err != nil || len(v.Tokens) != len(ids) {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkParse32k is a 32k-token prompt's ids (~190 KB), the largest
// token prompt the text benchmarks send: ~240 us, 7 ns an id, half the
// front's own time for such a request (forward BenchmarkFront). Reading
// ids eight bytes at a time (SWAR, Lemire's eight-digit parse) gave 223 us
// in one pass and 196 us with the ends found first: not worth its code.
func BenchmarkParse32k(b *testing.B) {
	ids := make([]uint32, 32768)
	for i := range ids {
		ids[i] = uint32(1000 + i*37%150000)
	}
	raw, _ := json.Marshal(ids)
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if got, ok := Parse(raw); !ok || len(got) != len(ids) {
			b.Fatal(ok, len(got))
		}
	}
}
