package forward

import (
	"encoding/json"
	"net/http"

	"github.com/gin-gonic/gin"
)

// apiError is OpenAI's error body, the shape vLLM returns and clients parse.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func newAPIError(status int, msg string) apiError {
	return apiError{Error: apiErrorBody{Message: msg, Type: errorType(status), Code: status}}
}

// errorType maps a status to the type names vLLM uses.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLargeError"
	case http.StatusRequestTimeout:
		return "RequestTimeoutError"
	case http.StatusTooManyRequests:
		return "RateLimitError" // the OpenAI SDKs' name for a 429
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	case http.StatusBadGateway:
		return "BadGatewayError"
	}
	return "InternalServerError"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(`{"error":{"message":"internal error","type":"InternalServerError","param":null,"code":500}}`)
		status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// writeError answers c's request with an error of its API's shape.
func writeError(c *gin.Context, status int, msg string) {
	writeAPIError(c.Writer, apiOf(c), status, msg)
	c.Abort()
}
