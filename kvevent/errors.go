package kvevent

import (
	"errors"
	"fmt"
)

// Decode failures carry one of these as their cause; test with errors.Is.
var (
	// ErrTruncated: the input ended inside a value, or a length header
	// claims more elements or bytes than remain.
	ErrTruncated = errors.New("truncated input")
	// ErrType: a value has a msgpack type the field cannot hold.
	ErrType = errors.New("unexpected msgpack type")
	// ErrRange: an integer does not fit the field (negative token id,
	// block size above MaxInt, ...).
	ErrRange = errors.New("value out of range")
	// ErrShape: the batch or an event lacks a required part (an empty
	// event array, a map event without "type", a batch without events).
	ErrShape = errors.New("malformed batch")
	// ErrDepth: values nest deeper than maxDepth.
	ErrDepth = errors.New("nesting too deep")
	// ErrTrailing: bytes follow the batch value.
	ErrTrailing = errors.New("trailing bytes after batch")
	// ErrFrames: a ZMQ message that is not [topic, seq(8 bytes), payload].
	ErrFrames = errors.New("malformed message frames")
	// ErrEncode: Encode was given a value it cannot put on the wire.
	ErrEncode = errors.New("cannot encode")
)

// DecodeError says where in a payload decoding failed.
type DecodeError struct {
	// Offset is the byte offset in the payload of the value that failed
	// (for truncated input: where the missing bytes should have been).
	Offset int
	// Event is the index of the event being decoded, or -1 outside events.
	Event int
	// Field is the wire field name being decoded, or "".
	Field string
	// Err is the cause; it wraps one of the ErrX values.
	Err error
}

func (e *DecodeError) Error() string {
	where := "batch"
	if e.Event >= 0 {
		where = fmt.Sprintf("event %d", e.Event)
	}
	if e.Field != "" {
		where += " " + e.Field
	}
	return fmt.Sprintf("decode %s at byte %d: %v", where, e.Offset, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }
