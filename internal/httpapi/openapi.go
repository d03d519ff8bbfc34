package httpapi

import (
	_ "embed"
	"net/http"
)

// openAPI is the API's OpenAPI document; a test holds it to the routing table.
//
//go:embed openapi.json
var openAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPI)
}
