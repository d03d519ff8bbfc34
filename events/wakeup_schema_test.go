package events_test

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/bgtask/bgtask/events"
)

// The published schema of a wake-up names exactly the fields a Wakeup has, so the
// consumer contract in the docs cannot drift from the code.
func TestTheWakeupSchemaMatchesTheWakeup(t *testing.T) {
	data, err := os.ReadFile("../docs/wakeup.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatalf("docs/wakeup.schema.json: %v", err)
	}
	var fields, always []string
	typ := reflect.TypeFor[events.Wakeup]()
	for i := range typ.NumField() {
		name, opts, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		fields = append(fields, name)
		if opts != "omitempty" {
			always = append(always, name)
		}
	}
	var documented []string
	for name := range schema.Properties {
		documented = append(documented, name)
	}
	slices.Sort(fields)
	slices.Sort(documented)
	if !slices.Equal(fields, documented) {
		t.Fatalf("the schema's properties %v, the Wakeup's fields %v", documented, fields)
	}
	slices.Sort(always)
	slices.Sort(schema.Required)
	if !slices.Equal(always, schema.Required) {
		t.Fatalf("the schema requires %v; a Wakeup always has %v", schema.Required, always)
	}
}
