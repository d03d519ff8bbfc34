package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bgtask/bgtask/engine"
)

// toolFunc does a tool's work on its arguments: the text a model reads, and the
// result, which is the call's structured content too.
type toolFunc[In, Out any] func(ctx context.Context, req *mcp.CallToolRequest, in In) (text string, out Out, err error)

// addTool adds a tool whose arguments are an In and whose result is an Out: its
// input schema (unless it has one) is In's. The arguments are decoded strictly
// (decodeArgs); a failure is a tool error with the API's error object.
//
// The tool declares no output schema. Its result is one of the API's views (the
// task view's schema alone is 8 KB), many of whose fields may be null, which a
// schema spells as a type array that some model providers' clients refuse; and
// a client checks each result of a tool that declares one, so a view whose JSON
// drifted from its schema would fail calls.
func addTool[In, Out any](m *mcp.Server, t *mcp.Tool, run toolFunc[In, Out]) {
	if t.InputSchema == nil {
		t.InputSchema = inputSchema[In]()
	}
	schema := t.InputSchema.(*jsonschema.Schema)
	m.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in In
		if err := decodeArgs(req.Params.Arguments, &in, schema.Properties); err != nil {
			return errorResult(err), nil
		}
		text, out, err := run(ctx, req, in)
		if err != nil {
			return errorResult(err), nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: out}, nil
	})
}

// inputSchema is In's JSON Schema: its fields, with their jsonschema tags as
// descriptions. An argument a caller does not give it leaves out, so none takes
// null. JSON passed on as it is (an origin, a webhook's body) is an object.
func inputSchema[In any]() *jsonschema.Schema {
	s, err := jsonschema.For[In](&jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[json.RawMessage](): {Type: "object"},
	}})
	if err != nil {
		panic(err) // the tools' own types: every tool is listed by the tests
	}
	withoutNull(s)
	return s
}

// withoutNull takes null out of the types of s and of the schemas in it.
func withoutNull(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if i := slices.Index(s.Types, "null"); i >= 0 {
		s.Types = slices.Delete(s.Types, i, i+1)
		if len(s.Types) == 1 {
			s.Type, s.Types = s.Types[0], nil
		}
	}
	for _, p := range s.Properties {
		withoutNull(p)
	}
	withoutNull(s.Items)
	withoutNull(s.AdditionalProperties)
}

// decodeArgs reads a tool's arguments into v and says what is wrong in the API's
// terms: the argument, and why. It refuses JSON the engine would (a repeated
// name, one nested too deep) and a name that is not one of args, exactly: the
// decoder would take "ID" for "id". A v that decodes itself (add's spec) checks
// its names itself.
func decodeArgs(args json.RawMessage, v any, names map[string]*jsonschema.Schema) error {
	if args = bytes.TrimSpace(args); len(args) == 0 || string(args) == "null" {
		return nil
	}
	if err := engine.CheckJSON(args, "arguments"); err != nil {
		return err
	}
	if _, own := v.(json.Unmarshaler); !own {
		if name := unknownName(args, names); name != "" {
			return &argError{name, "not an argument of this tool"}
		}
	}
	err := json.Unmarshal(args, v)
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, new(*argError)), errors.As(err, new(*engine.FieldError)):
		return err // an argument's own decoding named it
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return &argError{"arguments", fmt.Sprintf("want a JSON object, not a JSON %s", typeErr.Value)}
	case errors.As(err, &typeErr):
		return &argError{typeErr.Field, fmt.Sprintf("want a %s, not a JSON %s", typeErr.Type, typeErr.Value)}
	}
	return &argError{"arguments", err.Error()}
}

// unknownName is the first name of the object args that names is without, if
// any; args that are no object have none.
func unknownName(args json.RawMessage, names map[string]*jsonschema.Schema) string {
	dec := json.NewDecoder(bytes.NewReader(args))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		name, _ := tok.(string)
		if _, ok := names[name]; !ok {
			return name
		}
		var value json.RawMessage
		if dec.Decode(&value) != nil {
			return ""
		}
	}
	return ""
}
