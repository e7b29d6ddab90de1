package prompt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
)

// scanObject validates b as one JSON document (RFC 8259, as encoding/json
// accepts it) whose top level is an object, and calls member for each of
// its members in order with the key's raw bytes (between the quotes, still
// escaped) and the value's raw bytes. It is the request path's one pass
// over a body: encoding/json validated the body, then scanned it again to
// find the fields, which cost ~40 us for a 1k-token prompt and ~1 ms at 32k.
func scanObject(b []byte, member func(key, val []byte) error) error {
	return scanObjectTaking(b, member, nil)
}

// scanObjectTaking is scanObject that first offers each top-level member's
// value to take (when not nil), with its name (raw) and its offset in b:
// take returns the value's length if it has read it whole and it is valid
// JSON, 0 to leave it to the scan. A 32k-token prompt's ids are then
// walked once, not once to validate and again to parse, and so are a
// conversation's messages (walker).
func scanObjectTaking(b []byte, member func(key, val []byte) error, take func(key []byte, v int) int) error {
	s := scanner{b: b}
	i := s.space(0)
	if i >= len(b) || b[i] != '{' {
		return s.fail(i, "want an object")
	}
	end, err := s.object(i, 1, func(k []byte, v int) (int, error) {
		vend := v
		if take != nil {
			vend += take(k, v)
		}
		if vend == v {
			var err error
			if vend, err = s.value(v, 1); err != nil {
				return vend, err
			}
		}
		return vend, member(k, b[v:vend])
	})
	if err != nil {
		return err
	}
	if i = s.space(end); i != len(b) {
		return s.fail(i, "data after the object")
	}
	return nil
}

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

var errSyntax = errors.New("invalid JSON")

type scanner struct {
	b []byte
}

func (s scanner) fail(i int, what string) error {
	if i >= len(s.b) {
		return fmt.Errorf("%w: unexpected end of input: %s", errSyntax, what)
	}
	return fmt.Errorf("%w: byte %d (%q): %s", errSyntax, i, s.b[i], what)
}

func (s scanner) space(i int) int {
	for i < len(s.b) {
		switch s.b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value returns the end of the value starting at i.
func (s scanner) value(i, depth int) (int, error) {
	if i >= len(s.b) {
		return i, s.fail(i, "want a value")
	}
	switch c := s.b[i]; {
	case c == '"':
		return s.str(i)
	case c == '{':
		return s.object(i, depth+1, nil)
	case c == '[':
		return s.array(i, depth+1, nil)
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number(i)
	case c == 't':
		return s.literal(i, "true")
	case c == 'f':
		return s.literal(i, "false")
	case c == 'n':
		return s.literal(i, "null")
	}
	return i, s.fail(i, "want a value")
}

func (s scanner) literal(i int, lit string) (int, error) {
	if len(s.b)-i < len(lit) || string(s.b[i:i+len(lit)]) != lit {
		return i, s.fail(i, "want "+lit)
	}
	return i + len(lit), nil
}

// object returns the end of the object starting at i, at nesting depth.
// It validates each member's value itself when f is nil; else it calls f
// with the member's name (raw, between the quotes, see key) and the
// offset of its value, and f returns the value's end, having validated it
// (a walker with check, scanObjectTaking's take). The body's scan and a
// conversion's validating walk are thus one grammar in one loop.
func (s scanner) object(i, depth int, f func(k []byte, v int) (int, error)) (int, error) {
	if depth > maxDepth {
		return i, s.fail(i, "nested too deeply")
	}
	i = s.space(i + 1)
	if i < len(s.b) && s.b[i] == '}' {
		return i + 1, nil
	}
	for {
		if i >= len(s.b) || s.b[i] != '"' {
			return i, s.fail(i, "want a member name")
		}
		kend, err := s.str(i)
		if err != nil {
			return kend, err
		}
		j := s.space(kend)
		if j >= len(s.b) || s.b[j] != ':' {
			return j, s.fail(j, "want ':' after a member name")
		}
		v := s.space(j + 1)
		var vend int
		switch {
		case v >= len(s.b):
			return v, s.fail(v, "want a value")
		case f == nil:
			vend, err = s.value(v, depth)
		default:
			vend, err = f(s.b[i+1:kend-1], v)
		}
		if err != nil {
			return vend, err
		}
		i = s.space(vend)
		if i < len(s.b) && s.b[i] == ',' {
			i = s.space(i + 1)
			continue
		}
		if i < len(s.b) && s.b[i] == '}' {
			return i + 1, nil
		}
		return i, s.fail(i, "want ',' or '}' in an object")
	}
}

// array is object for the elements of the array at i: f, when not nil,
// gets each element's offset.
func (s scanner) array(i, depth int, f func(v int) (int, error)) (int, error) {
	if depth > maxDepth {
		return i, s.fail(i, "nested too deeply")
	}
	i = s.space(i + 1)
	if i < len(s.b) && s.b[i] == ']' {
		return i + 1, nil
	}
	for {
		var end int
		var err error
		switch {
		case i >= len(s.b):
			return i, s.fail(i, "want a value")
		case f == nil:
			end, err = s.value(i, depth)
		default:
			end, err = f(i)
		}
		if err != nil {
			return end, err
		}
		i = s.space(end)
		if i < len(s.b) && s.b[i] == ',' {
			i = s.space(i + 1)
			continue
		}
		if i < len(s.b) && s.b[i] == ']' {
			return i + 1, nil
		}
		return i, s.fail(i, "want ',' or ']' in an array")
	}
}

// str returns the end (after the closing quote) of the string at i. Like
// encoding/json it rejects control characters and bad escapes and accepts
// any other bytes, invalid UTF-8 included.
func (s scanner) str(i int) (int, error) {
	for i++; i < len(s.b); i++ {
		// Skip plain bytes 32 and then eight at a time: a 160 KB
		// conversation is almost all string bytes, and this is most of a
		// chat's parse. Four words a step let the CPU test them at once.
		// The word that holds the next special byte says where it is, so
		// a string's last bytes are not tested again one by one: that
		// was half a Messages body's scan, which is a thousand short
		// strings (names, types, ids) between its long ones.
		for i+32 <= len(s.b) && plain32(s.b[i:i+32]) {
			i += 32
		}
		for i+8 <= len(s.b) {
			if m := special(binary.LittleEndian.Uint64(s.b[i:])) & hi8; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(s.b) && s.b[i] >= 0x20 && s.b[i] != '"' && s.b[i] != '\\' {
			i++
		}
		if i >= len(s.b) {
			break
		}
		switch c := s.b[i]; {
		case c == '"':
			return i + 1, nil
		case c < 0x20:
			return i, s.fail(i, "control character in a string")
		case c == '\\':
			i++
			if i >= len(s.b) {
				return i, s.fail(i, "unterminated escape")
			}
			switch s.b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(s.b)-i < 5 || !hex4(s.b[i+1:i+5]) {
					return i, s.fail(i, `want four hex digits after \u`)
				}
				i += 4
			default:
				return i, s.fail(i, "bad escape")
			}
		}
	}
	return i, s.fail(i, "unterminated string")
}

// plain8 reports whether none of w's bytes ends or escapes a string or is
// a control character.
func plain8(w uint64) bool { return special(w)&hi8 == 0 }

// plain32 is plain8 for the four words of b[:32].
func plain32(b []byte) bool {
	_ = b[31]
	return (special(binary.LittleEndian.Uint64(b))|special(binary.LittleEndian.Uint64(b[8:]))|
		special(binary.LittleEndian.Uint64(b[16:]))|special(binary.LittleEndian.Uint64(b[24:])))&hi8 == 0
}

const lo8, hi8 = 0x0101010101010101, 0x8080808080808080

// special has the top bit set in each byte of w that is '"', '\\' or below
// 0x20, and maybe in bytes above one that is (the classic has-zero-byte and
// has-less-than word tricks); it is zero only when no byte is, and its
// lowest set bit is always in the first byte that is (a false flag needs
// a borrow from a flagged byte below it).
func special(w uint64) uint64 {
	q, bs := w^(lo8*'"'), w^(lo8*'\\')
	return (q-lo8)&^q | (bs-lo8)&^bs | (w-lo8*0x20)&^w
}

func hex4(b []byte) bool {
	for _, c := range b[:4] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// number returns the end of the number at i:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s scanner) number(i int) (int, error) {
	if s.b[i] == '-' {
		i++
	}
	switch {
	case i < len(s.b) && s.b[i] == '0':
		i++
	case i < len(s.b) && s.b[i] >= '1' && s.b[i] <= '9':
		i = s.digits(i)
	default:
		return i, s.fail(i, "want a digit")
	}
	if i < len(s.b) && s.b[i] == '.' {
		j := s.digits(i + 1)
		if j == i+1 {
			return j, s.fail(j, "want a digit after '.'")
		}
		i = j
	}
	if i < len(s.b) && (s.b[i] == 'e' || s.b[i] == 'E') {
		i++
		if i < len(s.b) && (s.b[i] == '+' || s.b[i] == '-') {
			i++
		}
		j := s.digits(i)
		if j == i {
			return j, s.fail(j, "want a digit in the exponent")
		}
		i = j
	}
	return i, nil
}

func (s scanner) digits(i int) int {
	for i < len(s.b) && s.b[i] >= '0' && s.b[i] <= '9' {
		i++
	}
	return i
}

// appendString appends s as a JSON string, encoded as encoding/json
// encodes it.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= 0x80 {
			enc, _ := json.Marshal(s) // a string always encodes
			return append(b, enc...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// walkArray calls f with the offset of each element of the array at b[i],
// which the body's scan has validated, and returns the array's end. f
// returns the element's end, having read into it as far as it needs: the
// conversions walk the values the one validating pass handed them, so
// they skip without checking again, strings by their quotes with
// IndexByte's vector search, and a walk that reads into a value as it
// goes skips each text once.
func walkArray(b []byte, i int, f func(v int) (int, error)) (int, error) {
	i = skipSpace(b, i+1)
	if i >= len(b) || b[i] == ']' {
		return i + 1, nil
	}
	for i < len(b) {
		end, err := f(i)
		if err != nil {
			return end, err
		}
		if i = skipSpace(b, end); i >= len(b) || b[i] != ',' {
			return i + 1, nil
		}
		i = skipSpace(b, i+1)
	}
	return i, nil
}

// walkObject is walkArray for the members of the object at b[i]: f gets
// each member's name (raw, see key) and the offset of its value.
func walkObject(b []byte, i int, f func(k []byte, v int) (int, error)) (int, error) {
	i = skipSpace(b, i+1)
	for i < len(b) && b[i] == '"' {
		kend := skipString(b, i)
		end, err := f(b[i+1:kend-1], skipSpace(b, skipSpace(b, kend)+1))
		if err != nil {
			return end, err
		}
		if i = skipSpace(b, end); i >= len(b) || b[i] != ',' {
			return i + 1, nil
		}
		i = skipSpace(b, i+1)
	}
	return i + 1, nil
}

// appendRawString appends the JSON text v as a JSON string: its quotes
// and backslashes escaped, its control characters (valid JSON has them
// only as whitespace) as \n, \r, \t. Other bytes pass as they are, so
// the string holds exactly v's text.
func appendRawString(b, v []byte) []byte {
	b = append(b, '"')
	for len(v) > 0 {
		i := 0
		for i < len(v) && v[i] != '"' && v[i] != '\\' && v[i] >= 0x20 {
			i++
		}
		b = append(b, v[:i]...)
		if i == len(v) {
			break
		}
		switch c := v[i]; c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, fmt.Sprintf(`\u%04x`, c)...)
		}
		v = v[i+1:]
	}
	return append(b, '"')
}

// walker walks a value for a conversion: its arrays' elements and its
// objects' members, in order, as walkArray and walkObject do. With check
// set it is also the value's one validating pass: the body's scan hands
// the value to it (scanObjectTaking's take), and it walks it with the
// scanner's own loops (scanner.object and scanner.array, which then call
// back for each member and element), so a conversation's messages are
// read as they are validated instead of walked again after. Without
// check the value was validated already, and it skips.
type walker struct {
	s     scanner
	check bool
	// depth is the nesting of the container being walked, as the
	// scanner counts it (1 for a top-level member's value's parent).
	depth int
}

// array calls f with the offset of each element of the array at i and
// returns the array's end; f returns the element's end, having walked
// (with check: validated) it whole.
func (w *walker) array(i int, f func(v int) (int, error)) (int, error) {
	if !w.check {
		return walkArray(w.s.b, i, f)
	}
	w.depth++
	end, err := w.s.array(i, w.depth, f)
	w.depth--
	return end, err
}

// object is array for the members of the object at i: f gets each
// member's name (raw, see key) and the offset of its value.
func (w *walker) object(i int, f func(k []byte, v int) (int, error)) (int, error) {
	if !w.check {
		return walkObject(w.s.b, i, f)
	}
	w.depth++
	end, err := w.s.object(i, w.depth, f)
	w.depth--
	return end, err
}

// skip returns the end of the value at i, a member's or an element's.
func (w *walker) skip(i int) (int, error) {
	if !w.check {
		return skipValue(w.s.b, i), nil
	}
	return w.s.value(i, w.depth)
}

// raw is skip that also returns the value's bytes.
func (w *walker) raw(i int) ([]byte, int, error) {
	end, err := w.skip(i)
	return w.s.b[i:end], end, err
}

// str is skip for the string at i.
func (w *walker) str(i int) (int, error) {
	if !w.check {
		return skipString(w.s.b, i), nil
	}
	return w.s.str(i)
}

// elems calls f with each element of the valid array b.
func elems(b []byte, f func(v []byte) error) error {
	_, err := walkArray(b, 0, func(v int) (int, error) {
		end := skipValue(b, v)
		return end, f(b[v:end])
	})
	return err
}

// members calls f with each member of the valid object b: its name (raw,
// see key) and value.
func members(b []byte, f func(k, v []byte) error) error {
	_, err := walkObject(b, 0, func(k []byte, v int) (int, error) {
		end := skipValue(b, v)
		return end, f(k, b[v:end])
	})
	return err
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the end of the valid string at i: the first quote
// not escaped, one with an even run of backslashes before it.
func skipString(b []byte, i int) int {
	for i++; ; {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return len(b)
		}
		i += q
		n := 0
		for n < i && b[i-1-n] == '\\' {
			n++
		}
		if i++; n%2 == 0 {
			return i
		}
	}
}

// skipValue returns the end of the valid value at i.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// key is a member name's raw bytes decoded; names match exactly, as
// pydantic's do. A name with escapes is rare and decoded the slow way.
// `switch string(key(k))` compares without allocating.
func key(k []byte) []byte {
	if bytes.IndexByte(k, '\\') < 0 {
		return k
	}
	s, _ := jsonString(append(append([]byte{'"'}, k...), '"'), "member name", nil)
	return []byte(s)
}

// strIs reports whether v is the JSON string s.
func strIs(v []byte, s string) bool {
	if !isStr(v) {
		return false
	}
	if b := body(v); bytes.IndexByte(b, '\\') < 0 {
		return string(b) == s
	}
	d, err := jsonString(v, "", nil)
	return err == nil && d == s
}

// kind is the JSON type of a raw value by its first byte: '"', '{', '[',
// 'n' (null), 't'/'f' (true, false) or '0' (a number).
func kind(v []byte) byte {
	if len(v) == 0 {
		return 0
	}
	switch c := v[0]; {
	case c == '-' || c >= '0' && c <= '9':
		return '0'
	default:
		return c
	}
}

// Raw JSON string literals (quotes included) are spliced, not decoded: a
// conversion's strings are the client's, and joining two literals' bodies
// gives the literal of the joined strings, so text is copied once and
// never decoded and re-encoded.

// isStr reports whether v is a JSON string literal.
func isStr(v []byte) bool { return kind(v) == '"' }

// optional returns v (a member's value or nil) when it is of kind want,
// nil when it is null or absent, as pydantic checks a "str | None" ('"')
// or "dict | None" ('{') field; ok is false for a value of another kind.
func optional(v []byte, want byte) (val []byte, ok bool) {
	switch kind(v) {
	case 0, 'n':
		return nil, true
	case want:
		return v, true
	}
	return nil, false
}

// optStr is optional for a string member named field.
func optStr(v []byte, field string) ([]byte, error) {
	v, ok := optional(v, '"')
	if !ok {
		return nil, badf("%s: want a string", field)
	}
	return v, nil
}

// truthy reports whether the literal s is a non-empty string (Python's
// truth of a str that may be None).
func truthy(s []byte) bool { return len(s) > 2 }

// body is a literal's text between the quotes, still escaped.
func body(s []byte) []byte { return s[1 : len(s)-1] }

// joinLit returns the literal of the strings of lits joined by sep (a
// literal body), skipping empty ones when skipEmpty (Python's
// "sep".join(t for t in texts if t)).
func joinLit(sep string, skipEmpty bool, lits ...[]byte) []byte {
	n, size, one := 0, 2, []byte(nil)
	for _, l := range lits {
		if l == nil || skipEmpty && !truthy(l) {
			continue
		}
		n, size, one = n+1, size+len(l)-2+len(sep), l
	}
	switch {
	case n == 0:
		return []byte(`""`)
	case n == 1:
		return one // a literal is never written to, so it is shared
	}
	b := make([]byte, 1, size)
	b[0] = '"'
	first := true
	for _, l := range lits {
		if l == nil || skipEmpty && !truthy(l) {
			continue
		}
		if !first {
			b = append(b, sep...)
		}
		b = append(b, body(l)...)
		first = false
	}
	return append(b, '"')
}

// lit is the literal of a Go string.
func lit(s string) []byte { return appendString(nil, s) }

// hasPrefix reports whether the string of literal l starts with p.
func hasPrefix(l []byte, p string) bool {
	b := body(l)
	if n := min(len(b), len(p)); bytes.IndexByte(b[:n], '\\') < 0 {
		return string(b[:n]) == p
	}
	s, err := jsonString(l, "", nil)
	return err == nil && len(s) >= len(p) && s[:len(p)] == p
}

// nonEmptyObject reports whether the object v has a member (Python's
// truth of a dict).
func nonEmptyObject(v []byte) bool {
	s := scanner{b: v}
	return kind(v) == '{' && s.space(1) < len(v) && v[s.space(1)] != '}'
}
