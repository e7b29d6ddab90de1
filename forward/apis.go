package forward

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/prompt"
)

// routes are the paths the front routes, each the request shape of one
// API (docs/design.md D11): every other path goes to the local vLLM.
var routes = []struct {
	path string
	api  prompt.API
}{
	{"/v1/chat/completions", prompt.APIChat},
	{"/v1/completions", prompt.APICompletions},
	{"/v1/messages", prompt.APIMessages},
	{"/v1/responses", prompt.APIResponses},
}

// renderPath is the engine's render endpoint for an API (vLLM v0.29 for
// Messages, v0.30 for Responses; all behind --enable-scale-out in v0.30).
func renderPath(api prompt.API) string {
	switch api {
	case prompt.APIChat:
		return "/v1/chat/completions/render"
	case prompt.APICompletions:
		return "/v1/completions/render"
	case prompt.APIMessages:
		return "/v1/messages/render"
	case prompt.APIResponses:
		return "/v1/responses/render"
	}
	return ""
}

// anthropicError is Anthropic's error body, which /v1/messages clients
// (the Anthropic SDKs) parse: {"type":"error","error":{"type","message"}}.
type anthropicError struct {
	Type  string             `json:"type"`
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicType maps a status to Anthropic's error types
// (docs.anthropic.com "Errors").
func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestTimeout: // a 408 is the client's slow body
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	return "api_error"
}

// errorBody is the error of an API's own shape for status and msg.
func errorBody(api prompt.API, status int, msg string) any {
	if api == prompt.APIMessages {
		return anthropicError{Type: "error", Error: anthropicErrorBody{Type: anthropicType(status), Message: msg}}
	}
	return newAPIError(status, msg)
}

// storedPath is where a stored response is read (GET) or, under
// storedPath+"/cancel", canceled: both are the Responses API's.
const storedPath = "/v1/responses/:id"

// apiOf is the API of the request c is serving: its route's, chat when
// not routed. It is read off the path gin matched (under any group's
// prefix) rather than kept on c, which would cost a map per request for
// what only an error needs.
func apiOf(c *gin.Context) prompt.API {
	p := c.FullPath()
	for _, rt := range routes {
		if strings.HasSuffix(p, rt.path) {
			return rt.api
		}
	}
	if strings.HasSuffix(p, storedPath) || strings.HasSuffix(p, storedPath+"/cancel") {
		return prompt.APIResponses
	}
	return prompt.APIChat
}

// writeAPIError writes an error of api's shape.
func writeAPIError(w http.ResponseWriter, api prompt.API, status int, msg string) {
	b, err := json.Marshal(errorBody(api, status, msg))
	if err != nil {
		b = []byte(`{"error":{"message":"internal error","type":"InternalServerError","param":null,"code":500}}`)
		status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}
