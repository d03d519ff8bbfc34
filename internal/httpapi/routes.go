package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/api"
)

// routes are every route of the server, each with its method: the document
// (openapi.json) lists the same, and a test holds the two to each other.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	for _, r := range s.table() {
		mux.Handle(r.pattern, r.handler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern == "" && strings.HasPrefix(r.URL.Path, "/v1/") {
			s.noRoute(w, r, mux)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// noRoute answers a request to the API that no route takes with the error
// object: 405 and the methods there are if the path has routes, else 404.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request, mux *http.ServeMux) {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" {
			allowed = append(allowed, m)
		}
	}
	if len(allowed) == 0 {
		s.fail(w, &api.Error{Code: 404, Message: "no route " + r.URL.Path + ": the routes are in /v1/openapi.json"})
		return
	}
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	s.fail(w, &api.Error{Code: 405, Message: fmt.Sprintf("%s %s: the method is not one of %s", r.Method, r.URL.Path, strings.Join(allowed, ", "))})
}

type route struct {
	pattern string
	handler http.Handler
}

// table is the routing table. The dashboard's pages are server-rendered from
// the same API calls (ui.go); a page of its own is one more row.
func (s *Server) table() []route {
	rows := []route{
		{"POST /v1/tasks", s.jsonRoute(s.register)},
		{"GET /v1/tasks", s.jsonRoute(s.list)},
		{"GET /v1/tasks/{id}", s.jsonRoute(s.get)},
		{"POST /v1/tasks/{id}/cancel", s.jsonRoute(s.cancelTask)},
		{"POST /v1/tasks/{id}/redeliver", s.jsonRoute(s.redeliver)},
		{"GET /v1/tasks/{id}/history", s.jsonRoute(s.history)},
		{"GET /v1/tasks/{id}/logs", http.HandlerFunc(s.logs)},
		{"GET /v1/workers", s.jsonRoute(s.workers)},
		{"GET /v1/targets", s.jsonRoute(s.targets)},
		{"GET /v1/targets/{name}", s.jsonRoute(s.target)},
		{"PUT /v1/targets/{name}", s.jsonRoute(s.setTarget)},
		{"GET /v1/targets/{name}/inbox", s.jsonRoute(s.inbox)},
		{"POST /v1/targets/{name}/inbox/ack", s.jsonRoute(s.ack)},
		{"GET /v1/events", http.HandlerFunc(s.eventStream)},
		{"POST /v1/login", s.jsonRoute(s.loginLink)},
		{"GET /v1/openapi.json", http.HandlerFunc(serveOpenAPI)},
		{"GET /login", http.HandlerFunc(s.login)},
		{"GET /{$}", http.HandlerFunc(s.taskPage)},
		{"GET /tasks/{id}", http.HandlerFunc(s.taskDetail)},
		{"POST /tasks/{id}/cancel", http.HandlerFunc(s.cancelForm)},
		{"POST /tasks/{id}/rerun", http.HandlerFunc(s.rerunForm)},
		{"POST /tasks/{id}/redeliver", http.HandlerFunc(s.redeliverForm)},
		{"GET /workers", http.HandlerFunc(s.workersPage)},
		{"GET /targets", http.HandlerFunc(s.targetsPage)},
		{"GET /audit", http.HandlerFunc(s.auditPage)},
		{"GET /ui/", http.StripPrefix("/ui/", http.FileServerFS(assets))},
	}
	if s.cfg.Metrics != nil {
		rows = append(rows, route{"GET /metrics", s.cfg.Metrics})
	}
	return rows
}

// reply is what a JSON handler answers: a value and its status (0: 200).
type reply struct {
	status int
	body   any
}

// jsonRoute serves a JSON handler: its reply, or its error as the API's error object
// with the status of its code, within the request's budget.
func (s *Server) jsonRoute(h func(ctx context.Context, r *http.Request) (reply, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), requestBudget)
		defer cancel()
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(readTimeout))
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		out, err := h(ctx, r)
		if err != nil {
			s.fail(w, err)
			return
		}
		if out.status == 0 {
			out.status = http.StatusOK
		}
		writeJSON(w, out.status, out.body)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if raw, ok := v.(json.RawMessage); ok {
		_, _ = w.Write(append(raw, '\n'))
		return
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// errorBody is the NATS API's error object.
type errorBody struct {
	Error *api.Error `json:"error"`
}

// fail answers err as the API's error object.
func (s *Server) fail(w http.ResponseWriter, err error) {
	e := asError(err)
	// A request cancelled is a client that went away: nothing failed.
	if e.Code >= 500 && !errors.Is(err, context.Canceled) {
		s.log.Error("HTTP request failed", "err", err)
	}
	if e.Code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="bgtask"`)
	}
	writeJSON(w, httpStatus(e.Code), errorBody{Error: e})
}

// asError is err as the API's error object: the engine's own, or one for what
// went wrong on the way to it.
func asError(err error) *api.Error {
	var e *api.Error
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &tooBig):
		return &api.Error{Code: 413, Field: "request", Message: fmt.Sprintf("request: the body is over %d bytes", tooBig.Limit)}
	case errors.Is(err, api.ErrNoServer):
		return &api.Error{Code: 503, Message: err.Error()}
	case errors.Is(err, context.DeadlineExceeded):
		return &api.Error{Code: 504, Message: "no answer from the engine in time: " + err.Error()}
	}
	return &api.Error{Code: 500, Message: err.Error()}
}

// httpStatus is the HTTP status of an API error code (the codes are HTTP's).
func httpStatus(code int) int {
	if code < 400 || code > 599 {
		return http.StatusInternalServerError
	}
	return code
}

func badField(field, format string, args ...any) *api.Error {
	return &api.Error{Code: 400, Field: field, Message: field + ": " + fmt.Sprintf(format, args...)}
}

// body reads a request body of at most limit bytes.
func body(r *http.Request, limit int64) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, err
		}
		return nil, badField("request", "the body could not be read: %v", err)
	}
	return data, nil
}

// decodeBody reads a small JSON body into v, refusing unknown fields; an empty
// body leaves v as it is.
func decodeBody(r *http.Request, v any) error {
	data, err := body(r, maxSmallBody)
	if err != nil || len(data) == 0 {
		return err
	}
	if fe := engine.CheckJSON(data, "request"); fe != nil {
		var f *engine.FieldError
		if errors.As(fe, &f) {
			return &api.Error{Code: 400, Field: f.Field, Message: f.Error()}
		}
		return badField("request", "%v", fe)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badField("request", "not valid JSON: %v", err)
	}
	return nil
}

// query checks that a request's query names only the parameters a route knows,
// each once: a misspelt filter is an error, not a list of everything.
func query(r *http.Request, known ...string) (url.Values, error) {
	q := r.URL.Query()
	for name, values := range q {
		if !slices.Contains(known, name) {
			return nil, badField(name, "not a parameter of %s %s (it takes %v)", r.Method, r.URL.Path, known)
		}
		if len(values) > 1 {
			return nil, badField(name, "given %d times", len(values))
		}
	}
	return q, nil
}

// intParam reads an integer parameter of at least min; "" is def.
func intParam(q url.Values, name string, def, min int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		return 0, badField(name, "%q: want a whole number of at least %d", v, min)
	}
	return n, nil
}

func (s *Server) register(ctx context.Context, r *http.Request) (reply, error) {
	spec, err := body(r, maxSpecBody)
	if err != nil {
		return reply{}, err
	}
	out, err := s.api.Raw(ctx, api.SubjectRegister, spec)
	if err != nil {
		return reply{}, err
	}
	var reg api.Registered
	if err := json.Unmarshal(out, &reg); err != nil {
		return reply{}, fmt.Errorf("%s: unreadable reply: %w", api.SubjectRegister, err)
	}
	if reg.Created {
		return reply{http.StatusCreated, out}, nil
	}
	return reply{body: out}, nil
}

// list answers one page of the NATS API's list: its filters, limit and cursor.
func (s *Server) list(ctx context.Context, r *http.Request) (reply, error) {
	q, err := query(r, listParams...)
	if err != nil {
		return reply{}, err
	}
	lq, err := listQuery(q)
	if err != nil {
		return reply{}, err
	}
	return s.call(ctx, api.SubjectList, api.ListRequest{ListQuery: lq, Cursor: q.Get("cursor")})
}

// listFilters are the parameters of GET /v1/tasks that select tasks (the
// dashboard's list keeps them in its links); listParams are all it takes.
var (
	listFilters = []string{"state", "status", "delivery", "target", "kind", "label", "since", "until"}
	listParams  = append(slices.Clip(listFilters), "limit", "cursor")
)

// listQuery reads the list's filters and limit from a query; the engine checks
// the values that name things (a state, a status, a target, a label).
func listQuery(q url.Values) (engine.ListQuery, error) {
	lq := engine.ListQuery{Phase: engine.Phase(q.Get("state")), Status: q.Get("status"), Delivery: q.Get("delivery"),
		Target: q.Get("target"), Kind: q.Get("kind")}
	var err error
	if lq.Limit, err = intParam(q, "limit", 0, 0); err != nil {
		return lq, err
	}
	if lq.Since, err = timeParam(q, "since"); err != nil {
		return lq, err
	}
	if lq.Until, err = timeParam(q, "until"); err != nil {
		return lq, err
	}
	if v := q.Get("label"); v != "" {
		lq.Labels = map[string]string{}
		for kv := range strings.SplitSeq(v, ",") {
			k, val, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return lq, badField("label", "%q: want KEY=VALUE, several separated by commas", kv)
			}
			lq.Labels[k] = val
		}
		if err := engine.ValidateLabels("label", lq.Labels); err != nil {
			return lq, &api.Error{Code: 400, Field: "label", Message: err.Error()}
		}
	}
	return lq, nil
}

// timeParam reads a time in RFC 3339; "" is none.
func timeParam(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, badField(name, "%q: want a time in RFC 3339, such as 2026-12-01T09:30:00Z", v)
	}
	return t, nil
}

// call makes a NATS API request and answers its reply as the engine wrote it.
func (s *Server) call(ctx context.Context, subject string, req any) (reply, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return reply{}, err
	}
	out, err := s.api.Raw(ctx, subject, data)
	return reply{body: out}, err
}

func (s *Server) get(ctx context.Context, r *http.Request) (reply, error) {
	return s.call(ctx, api.SubjectGet, api.IDRequest{ID: r.PathValue("id")})
}

func (s *Server) cancelTask(ctx context.Context, r *http.Request) (reply, error) {
	var req struct {
		Reason string `json:"reason,omitempty"`
	}
	if err := decodeBody(r, &req); err != nil {
		return reply{}, err
	}
	return s.call(ctx, api.SubjectCancel, api.CancelRequest{ID: r.PathValue("id"), Reason: req.Reason})
}

// redeliver pushes a fired task's wake-up again, as bgtask redeliver: to the
// sink the body names, or to each that gave up, or, if none did, to each one.
func (s *Server) redeliver(ctx context.Context, r *http.Request) (reply, error) {
	var req struct {
		Sink *int `json:"sink,omitempty"`
	}
	if err := decodeBody(r, &req); err != nil {
		return reply{}, err
	}
	return s.call(ctx, api.SubjectRedeliver, api.RedeliverRequest{ID: r.PathValue("id"), Sink: req.Sink})
}

func (s *Server) history(ctx context.Context, r *http.Request) (reply, error) {
	return s.call(ctx, api.SubjectHistory, api.IDRequest{ID: r.PathValue("id")})
}

func (s *Server) workers(ctx context.Context, _ *http.Request) (reply, error) {
	out, err := s.api.Raw(ctx, api.SubjectWorkers, nil)
	return reply{body: out}, err
}

func checkTarget(name string) error {
	if !client.ValidName(name) {
		return badField("name", "%q: use 1-128 letters, digits, '-' or '_'", name)
	}
	return nil
}

// targetReply is a target's state with its name.
type targetReply struct {
	Name string `json:"name"`
	client.TargetState
}

func (s *Server) targets(ctx context.Context, _ *http.Request) (reply, error) {
	all, err := s.client.Targets(ctx)
	if err != nil {
		return reply{}, err
	}
	out := struct {
		Targets []targetReply `json:"targets"`
	}{Targets: []targetReply{}}
	for name, st := range all {
		out.Targets = append(out.Targets, targetReply{name, st})
	}
	slices.SortFunc(out.Targets, func(a, b targetReply) int { return strings.Compare(a.Name, b.Name) })
	return reply{body: out}, nil
}

func (s *Server) target(ctx context.Context, r *http.Request) (reply, error) {
	name := r.PathValue("name")
	if err := checkTarget(name); err != nil {
		return reply{}, err
	}
	st, err := s.client.Target(ctx, name)
	return reply{body: targetReply{name, st}}, err
}

// setTarget says a target is busy (for ttl, if given) or idle, as `bgtask target`.
func (s *Server) setTarget(ctx context.Context, r *http.Request) (reply, error) {
	name := r.PathValue("name")
	if err := checkTarget(name); err != nil {
		return reply{}, err
	}
	var req struct {
		State string `json:"state"`
		TTL   string `json:"ttl,omitempty"`
	}
	if err := decodeBody(r, &req); err != nil {
		return reply{}, err
	}
	var ttl time.Duration
	switch {
	case req.State != client.TargetBusy && req.State != client.TargetIdle:
		return reply{}, badField("state", "%q: want busy or idle", req.State)
	case req.TTL != "" && req.State != client.TargetBusy:
		return reply{}, badField("ttl", "only a busy state ends by itself")
	case req.TTL != "":
		var err error
		if ttl, err = time.ParseDuration(req.TTL); err != nil {
			return reply{}, badField("ttl", "%q: want a positive duration such as 10m", req.TTL)
		}
		if err := client.CheckBusyTTL(ttl); err != nil {
			return reply{}, badField("ttl", "%v", err)
		}
	}
	st, err := s.client.SetTarget(ctx, name, req.State, ttl)
	return reply{body: targetReply{name, st}}, err
}
