package prompt

import (
	"encoding/binary"
	"errors"
	"fmt"
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
// value to take (when not nil), with the bytes from the value on: take
// returns the value's length if it has read it whole and it is valid JSON,
// 0 to leave it to the scan. A 32k-token prompt's ids are then walked
// once, not once to validate and again to parse.
func scanObjectTaking(b []byte, member func(key, val []byte) error, take func(key, rest []byte) int) error {
	s := scanner{b: b, take: take}
	i := s.space(0)
	if i >= len(b) || b[i] != '{' {
		return s.fail(i, "want an object")
	}
	end, err := s.object(i, 1, member)
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
	b    []byte
	take func(key, rest []byte) int // top-level values only; may be nil
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
		return s.array(i, depth+1)
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

// object returns the end of the object starting at i, calling member (when
// not nil) for each of its members.
func (s scanner) object(i, depth int, member func(key, val []byte) error) (int, error) {
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
		vend := v
		if member != nil && s.take != nil {
			vend += s.take(s.b[i+1:kend-1], s.b[v:])
		}
		if vend == v {
			if vend, err = s.value(v, depth); err != nil {
				return vend, err
			}
		}
		if member != nil {
			if err := member(s.b[i+1:kend-1], s.b[v:vend]); err != nil {
				return vend, err
			}
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

func (s scanner) array(i, depth int) (int, error) {
	if depth > maxDepth {
		return i, s.fail(i, "nested too deeply")
	}
	i = s.space(i + 1)
	if i < len(s.b) && s.b[i] == ']' {
		return i + 1, nil
	}
	for {
		var err error
		if i, err = s.value(i, depth); err != nil {
			return i, err
		}
		i = s.space(i)
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
		for i+32 <= len(s.b) && plain32(s.b[i:i+32]) {
			i += 32
		}
		for i+8 <= len(s.b) && plain8(binary.LittleEndian.Uint64(s.b[i:])) {
			i += 8
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
// has-less-than word tricks); it is zero only when no byte is.
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
