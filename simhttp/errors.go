package simhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
)

// apiError is an error with its vLLM status and type. Each API writes it
// in its own shape: OpenAI's {"error":{"message","type","param","code"}}
// (chat, completions, Responses, render, the rest) or Anthropic's
// {"type":"error","error":{"type","message"}} (/v1/messages).
type apiError struct {
	Status  int
	Type    string
	Message string
	Param   string // the field at fault, when known ("body.messages")
}

func (e *apiError) Error() string { return e.Message }

func badRequest(format string, args ...any) *apiError {
	return &apiError{Status: 400, Type: "BadRequestError", Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *apiError {
	return &apiError{Status: 404, Type: "NotFoundError", Message: fmt.Sprintf(format, args...)}
}

func unavailable(msg string) *apiError {
	return &apiError{Status: 503, Type: "ServiceUnavailableError", Message: msg}
}

func internal(msg string) *apiError {
	return &apiError{Status: 500, Type: "InternalServerError", Message: msg}
}

type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func (e *apiError) body() errorBody {
	b := errorBody{Error: errorInfo{Message: e.Message, Type: e.Type, Code: e.Status}}
	if e.Param != "" {
		b.Error.Param = &e.Param
	}
	return b
}

// writeError answers with e in OpenAI's shape.
func writeError(c *gin.Context, e *apiError) {
	if e == errGone {
		c.Abort()
		return
	}
	c.AbortWithStatusJSON(e.Status, e.body())
}

// anthropicError is vLLM's AnthropicErrorResponse
// (vllm/entrypoints/anthropic/protocol.py @00589e56).
type anthropicError struct {
	Type  string             `json:"type"`
	Error anthropicErrorInfo `json:"error"`
}

type anthropicErrorInfo struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// writeAnthropicError answers with e as vLLM's /v1/messages route does
// (translate_error_response, vllm/entrypoints/anthropic/api_router.py
// @01540b75): the ErrorResponse's status, and its type and message inside
// {"type":"error","error":{...}}. vLLM passes the OpenAI error type
// through ("BadRequestError", "NotFoundError"), not Anthropic's names.
func writeAnthropicError(c *gin.Context, e *apiError) {
	if e == errGone {
		c.Abort()
		return
	}
	c.AbortWithStatusJSON(e.Status, anthropicError{Type: "error", Error: anthropicErrorInfo{Type: e.Type, Message: e.Message}})
}

// decodeJSON is strict about syntax and lenient about unknown fields, as
// vLLM's pydantic models are for the extra fields clients send.
func decodeJSON(body []byte, v any) *apiError {
	if t := bytes.TrimSpace(body); len(t) == 0 || t[0] != '{' {
		return badRequest("invalid JSON body: expected an object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
			return typeError(body, te, reflect.TypeOf(v))
		}
		return badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("invalid JSON body: trailing data")
	}
	return nil
}

// vLLM answers a request whose field has the wrong type with FastAPI's
// RequestValidationError, which its handler turns into a 400 listing
// pydantic's errors:
//
//	{"error": {"message": "1 validation error:\n  {'type': 'list_type', 'loc': ('body', 'messages'),
//	  'msg': 'Input should be a valid list', 'input': 'hi'}", "type": "Bad Request",
//	  "param": "body.messages", "code": 400}}
//
// The simulator decodes with encoding/json, whose type errors name Go
// types; typeError rewrites them into that shape.

// pydanticKind is what pydantic calls a value kind: the error type and its
// message.
type pydanticKind struct{ typ, msg string }

// expectedKind maps the Go type that failed to decode to the JSON kind the
// field wants, as pydantic names it.
func expectedKind(t reflect.Type) (pydanticKind, func(any) bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return pydanticKind{"list_type", "Input should be a valid list"}, isKind[[]any]
	case reflect.String:
		return pydanticKind{"string_type", "Input should be a valid string"}, isKind[string]
	case reflect.Bool:
		return pydanticKind{"bool_type", "Input should be a valid boolean"}, isKind[bool]
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return pydanticKind{"int_type", "Input should be a valid integer"}, func(v any) bool {
			n, ok := v.(json.Number)
			_, err := n.Int64()
			return ok && err == nil
		}
	case reflect.Float32, reflect.Float64:
		return pydanticKind{"float_type", "Input should be a valid number"}, isKind[json.Number]
	default: // structs and maps: a JSON object
		return pydanticKind{"dict_type", "Input should be a valid dictionary"}, isKind[map[string]any]
	}
}

func isKind[T any](v any) bool { _, ok := v.(T); return ok }

// typeError is the pydantic-style 400 for a type error that decoding body
// into a t raised.
func typeError(body []byte, te *json.UnmarshalTypeError, t reflect.Type) *apiError {
	kind, fits := expectedKind(te.Type)
	path := memberPath(te.Field, t)
	var doc any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	loc, input, found := []any{"body"}, any(nil), false
	if dec.Decode(&doc) == nil {
		var l []any
		// Value is what encoding/json found ("string", "number 1.5"): it
		// tells a list given for an object from an object list's element.
		got, _, _ := strings.Cut(te.Value, " ")
		bad := func(v any) bool { return jsonKind(v) == got && !fits(v) }
		if l, input, found = locate(doc, path, bad); found {
			loc = append(loc, l...)
		}
	}
	if !found {
		for _, p := range path {
			loc = append(loc, p)
		}
	}
	if kind.typ == "int_type" {
		if n, ok := input.(json.Number); ok {
			if f, err := n.Float64(); err == nil && f != float64(int64(f)) {
				kind = pydanticKind{"int_from_float", "Input should be a valid integer, got a number with a fractional part"}
			}
		}
	}
	return validationError(kind, loc, input, found)
}

// memberPath is the body's member names on the path field (an
// UnmarshalTypeError's) into a t: encoding/json names the embedded
// structs a promoted field sits in too (openAIRequest.stream), and the
// body has no member for them.
func memberPath(field string, t reflect.Type) []string {
	if field == "" {
		return nil
	}
	var path []string
	for _, name := range strings.Split(field, ".") {
		for t != nil && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map) {
			t = t.Elem()
		}
		if t == nil || t.Kind() != reflect.Struct {
			t = nil
			path = append(path, name)
			continue
		}
		if f, ok := t.FieldByName(name); ok && f.Anonymous {
			t = f.Type
			continue
		}
		t = memberType(t, name)
		path = append(path, name)
	}
	return path
}

// memberType is the type of the member name of the struct t, promoted
// members included (nil: none).
func memberType(t reflect.Type, name string) reflect.Type {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct:
			if m := memberType(f.Type, name); m != nil {
				return m
			}
		case tag == name || tag == "" && f.Name == name:
			return f.Type
		}
	}
	return nil
}

// validationError is the 400 vLLM's RequestValidationError handler sends
// for one pydantic error at loc, with its input when there is one. It is
// the OpenAI error shape on every path, /v1/messages included: the
// handler is the app's, not the route's.
func validationError(kind pydanticKind, loc []any, input any, hasInput bool) *apiError {
	entry := fmt.Sprintf("{'type': '%s', 'loc': %s, 'msg': %s", kind.typ, pyTuple(loc), pyString(kind.msg))
	if hasInput {
		entry += ", 'input': " + pyRepr(input, 0)
	}
	entry += "}"
	param := make([]string, len(loc))
	for i, l := range loc {
		param[i] = fmt.Sprint(l)
	}
	return &apiError{Status: 400, Type: "Bad Request", Message: "1 validation error:\n  " + entry,
		Param: strings.Join(param, ".")}
}

// missingField is pydantic's error for a required member the body lacks
// (the input is the whole body, as pydantic reports it).
func missingField(body []byte, field string) *apiError {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	ok := dec.Decode(&doc) == nil
	return validationError(pydanticKind{"missing", "Field required"}, []any{"body", field}, doc, ok)
}

// valueError is pydantic's error for a field validator that raised
// ValueError(msg) on input.
func valueError(field, msg string, input any) *apiError {
	return validationError(pydanticKind{"value_error", "Value error, " + msg}, []any{"body", field}, input, true)
}

// jsonKind names a decoded value's JSON kind as encoding/json's type
// errors do.
func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "null"
}

// locate finds the first value along path (object keys; arrays on the way
// are searched element by element, as encoding/json's Field omits their
// indices) that is bad, and returns its location and value.
func locate(v any, path []string, bad func(any) bool) ([]any, any, bool) {
	if arr, ok := v.([]any); ok && (len(path) > 0 || !bad(v)) {
		for i, e := range arr {
			if l, in, ok := locate(e, path, bad); ok {
				return append([]any{i}, l...), in, true
			}
		}
		if len(path) > 0 {
			return nil, nil, false
		}
	}
	if len(path) == 0 {
		return nil, v, bad(v)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, nil, false
	}
	e, ok := obj[path[0]]
	if !ok {
		return nil, nil, false
	}
	l, in, ok := locate(e, path[1:], bad)
	if !ok {
		return nil, nil, false
	}
	return append([]any{path[0]}, l...), in, true
}

// pyTuple prints a pydantic loc the way Python prints the tuple.
func pyTuple(loc []any) string {
	parts := make([]string, len(loc))
	for i, l := range loc {
		parts[i] = pyRepr(l, 0)
	}
	if len(parts) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// maxReprBytes bounds an echoed input, so a wrong-typed 1 MB prompt does
// not come back whole.
const maxReprBytes = 200

// pyRepr prints a decoded JSON value as Python's repr prints what the JSON
// parser made of it.
func pyRepr(v any, depth int) string {
	var s string
	switch v := v.(type) {
	case nil:
		s = "None"
	case bool:
		s = "False"
		if v {
			s = "True"
		}
	case json.Number:
		s = v.String()
	case int:
		s = strconv.Itoa(v)
	case string:
		s = pyString(v)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = pyRepr(e, depth+1)
		}
		s = "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		// Python keeps the JSON's key order; Go's map does not, so sort
		// for a stable message.
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = pyString(k) + ": " + pyRepr(v[k], depth+1)
		}
		s = "{" + strings.Join(parts, ", ") + "}"
	default:
		s = fmt.Sprint(v)
	}
	if depth == 0 && len(s) > maxReprBytes {
		s = s[:maxReprBytes] + "..."
	}
	return s
}

// pyString is Python's repr of a str: single quotes unless the text holds
// a single quote and no double quote.
func pyString(s string) string {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == rune(q):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}
