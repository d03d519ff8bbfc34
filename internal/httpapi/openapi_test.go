package httpapi

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// The OpenAPI document lists every route the server registers, and no other.
func TestTheOpenAPIDocumentListsEveryRoute(t *testing.T) {
	h := start(t, func(c *Config) { c.Metrics = http.NotFoundHandler() })
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	r := h.do("GET", "/v1/openapi.json", "")
	if err := json.Unmarshal(r.body, &doc); r.status != 200 || err != nil || doc.OpenAPI == "" {
		t.Fatalf("GET /v1/openapi.json: %d, %v", r.status, err)
	}
	var documented, routed []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	for _, row := range h.srv.table() {
		method, path, _ := strings.Cut(row.pattern, " ")
		path = strings.TrimSuffix(path, "{$}")
		if strings.HasSuffix(path, "/") && path != "/" {
			path += "{path}" // a subtree: its files
		}
		routed = append(routed, method+" "+path)
	}
	slices.Sort(documented)
	slices.Sort(routed)
	if !slices.Equal(documented, routed) {
		t.Fatalf("the document lists\n%s\nthe server routes\n%s", strings.Join(documented, "\n"), strings.Join(routed, "\n"))
	}
}

// The document's parameters of GET /v1/tasks are the ones the route takes.
func TestTheOpenAPIDocumentListsTheListsParameters(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct{ Name, In string }
		}
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, p := range doc.Paths["/v1/tasks"]["get"].Parameters {
		if p.In == "query" {
			documented = append(documented, p.Name)
		}
	}
	if !slices.Equal(documented, listParams) {
		t.Fatalf("the document gives GET /v1/tasks the parameters %v, the route takes %v", documented, listParams)
	}
}
