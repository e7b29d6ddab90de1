package kvevent

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

// fullEvent sets every Event field but Kind and Tag to a value of its own,
// found by reflection so that a field added later is set too. Hashes and
// the parent sit above 2^63 and the ints are negative, to cross the
// unsigned and signed wire forms.
func fullEvent(t *testing.T) Event {
	var e Event
	v := reflect.ValueOf(&e).Elem()
	for i := range v.NumField() {
		f, n := v.Field(i), uint64(i+1)
		if name := v.Type().Field(i).Name; name == "Kind" || name == "Tag" {
			continue // set per kind under test
		}
		switch p := f.Addr().Interface().(type) {
		case *[]uint64:
			*p = []uint64{1<<63 + n, n}
		case **uint64:
			*p = ptr(1<<63 + 100 + n)
		case *[]uint32:
			*p = []uint32{uint32(n), 1<<32 - 1, 300}
		case *int:
			*p = int(16 * n)
		case **int64:
			*p = ptr(-int64(n))
		case **string:
			*p = ptr(fmt.Sprintf("v%d", n))
		case *[][]any:
			*p = [][]any{{fmt.Sprintf("k%d", n), int64(n)}, nil}
		default:
			t.Fatalf("fullEvent: no test value for Event.%s of type %s", v.Type().Field(i).Name, f.Type())
		}
	}
	return e
}

// setFields names the Event fields (other than Kind and Tag) that e holds
// a non-zero value in.
func setFields(e Event) []string {
	var names []string
	v := reflect.ValueOf(e)
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		if name != "Kind" && name != "Tag" && !v.Field(i).IsZero() {
			names = append(names, name)
		}
	}
	return names
}

// TestTableRoundTrip encodes every kind with every Event field set, in both
// encodings, and checks that exactly the kind's table fields come back,
// unchanged and each into a struct field of its own, under the wire names
// of the table; and that every Event field belongs to some kind.
func TestTableRoundTrip(t *testing.T) {
	full := fullEvent(t)
	covered := map[string]bool{}
	for k := range Kind(len(kinds)) {
		if n := len(kinds[k].fields); n > 64 {
			t.Fatalf("%v has %d fields; the map encoder's bit set holds 64", k, n)
		}
		for _, enc := range []Encoding{ArrayEncoding, MapEncoding} {
			t.Run(fmt.Sprintf("%v/%s", k, []string{"array", "map"}[enc]), func(t *testing.T) {
				in := full
				in.Kind, in.Tag = k, k.String()
				if k == Unknown {
					in.Tag = "Future"
				}
				p, err := Encode(Batch{TS: 1, Events: []Event{in}}, enc)
				if err != nil {
					t.Fatalf("Encode: %v", err)
				}
				b, err := Decode(p)
				if err != nil {
					t.Fatalf("Decode(Encode): %v", err)
				}
				got := b.Events[0]
				if got.Kind != k || got.Tag != in.Tag {
					t.Fatalf("Decode(Encode) kind %v tag %q; want %v %q", got.Kind, got.Tag, k, in.Tag)
				}
				set := setFields(got)
				if len(set) != len(kinds[k].fields) {
					t.Errorf("Decode(Encode) set %d Event fields %v; want one per table field (%d)", len(set), set, len(kinds[k].fields))
				}
				want := reflect.ValueOf(full)
				for _, name := range set {
					covered[name] = true
					g := reflect.ValueOf(got).FieldByName(name).Interface()
					if diff := cmp.Diff(want.FieldByName(name).Interface(), g); diff != "" {
						t.Errorf("Event.%s after Decode(Encode) (-want +got):\n%s", name, diff)
					}
				}
				names := tableNames(k)
				if enc == MapEncoding {
					slices.Sort(names)
				}
				if diff := cmp.Diff(names, wireNames(t, p, enc)); diff != "" {
					t.Errorf("wire fields (-table +wire):\n%s", diff)
				}
			})
		}
	}
	for _, name := range setFields(full) {
		if !covered[name] {
			t.Errorf("Event.%s is in no kind's table: Decode never sets it", name)
		}
	}
}

func tableNames(k Kind) []string {
	var names []string
	for _, f := range kinds[k].fields {
		names = append(names, f.name)
	}
	return names
}

// wireNames reads the one event in p with an independent msgpack decoder
// and returns its field names: the map keys but "type", or, for the array
// form, one table name per element after the tag.
func wireNames(t *testing.T, p []byte, enc Encoding) []string {
	var b []any
	if err := msgpack.Unmarshal(p, &b); err != nil {
		t.Fatalf("msgpack.Unmarshal: %v", err)
	}
	ev := b[1].([]any)[0]
	var names []string
	if enc == MapEncoding {
		for k := range ev.(map[string]any) {
			if k != "type" {
				names = append(names, k)
			}
		}
		// Map keys come back unordered; the encoder's order is pinned by
		// TestEncodeFixtureBytes.
		slices.Sort(names)
		return names
	}
	arr := ev.([]any)
	k, _ := kindOf([]byte(fmt.Sprint(arr[0])))
	for i := range arr[1:] {
		if i < len(kinds[k].fields) {
			names = append(names, kinds[k].fields[i].name)
		} else {
			names = append(names, fmt.Sprintf("extra element %d", i+1))
		}
	}
	return names
}

// The tap reads the same table: every field yields in declaration order,
// lists vLLM never sends as None are non-nil, None pointers are nil.
func TestEventFields(t *testing.T) {
	e := Event{Kind: BlockRemoved, BlockHashes: nil, Medium: ptr("GPU")}
	var names []string
	var values []any
	for n, v := range e.Fields() {
		names = append(names, n)
		values = append(values, v)
	}
	if want := []string{"block_hashes", "medium", "group_idx", "locality"}; !slices.Equal(names, want) {
		t.Errorf("BlockRemoved Fields names = %v; want %v", names, want)
	}
	if want := []any{[]uint64{}, "GPU", nil, nil}; !cmp.Equal(values, want) || values[0] == nil {
		t.Errorf("BlockRemoved Fields values = %#v; want %#v", values, want)
	}
	for _, k := range []Kind{Unknown, AllBlocksCleared, Kind(200)} {
		e := Event{Kind: k, BlockHashes: []uint64{1}}
		for n := range e.Fields() {
			t.Errorf("%v Fields yields %q; want nothing", k, n)
		}
	}
	// Stopping early is honoured.
	n := 0
	for range (&Event{Kind: BlockStored}).Fields() {
		n++
		break
	}
	if n != 1 {
		t.Errorf("Fields after break yielded %d; want 1", n)
	}
}
