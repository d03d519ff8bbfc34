package api

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/bgtask/bgtask/engine"
)

// MinIDPart is the fewest characters of a task's id that name it: a person
// may give a unique start of an id instead of all 36 characters.
const MinIDPart = 6

// CodeAmbiguous is the code of the error for a part of an id that several tasks'
// ids have: the request is well formed, and cannot be carried out as it is.
const CodeAmbiguous = 422

// maxMatches bounds the ids an ambiguous part's error lists.
const maxMatches = 10

// resolveID is the id of the task ref names: the whole id, a unique start of it
// of at least MinIDPart characters, or a unique end as the dashboard shows it,
// after "…" (or "..."). Every endpoint that takes a task's id resolves it here,
// so the CLI, the HTTP API and MCP all take the same.
func (s *Server) resolveID(ctx context.Context, ref string) (string, error) {
	if ref == "" {
		return "", &Error{Code: 400, Field: "id", Message: "id: required"}
	}
	if IsWholeID(ref) {
		return ref, nil // found (or not) as it is
	}
	match, err := idMatcher(ref)
	if err != nil {
		return "", err
	}
	ids, n := s.queries.MatchIDs(match, maxMatches)
	if n < 2 {
		// A task registered a moment ago may not be in the projection yet: with
		// it, a part that names one task now may name none, or two.
		last, err := s.store.LastSeq(ctx)
		if err != nil {
			return "", err
		}
		if err := s.queries.WaitFor(ctx, last); err != nil {
			return "", err
		}
		ids, n = s.queries.MatchIDs(match, maxMatches)
	}
	switch n {
	case 0:
		return "", fmt.Errorf("%w: no id %s", engine.ErrNotFound, describeRef(ref))
	case 1:
		return ids[0], nil
	}
	listed := strings.Join(ids, ", ")
	if n > len(ids) {
		listed += fmt.Sprintf(" and %d more", n-len(ids))
	}
	return "", &Error{Code: CodeAmbiguous, Field: "id", Matches: ids,
		Message: fmt.Sprintf("id: %d tasks' ids %s: %s; give more of it", n, describeRef(ref), listed)}
}

// IsWholeID reports whether ref has the form of a whole task id (a UUID), as
// opposed to a part of one.
func IsWholeID(ref string) bool {
	return len(ref) == 36 && uuid.Validate(ref) == nil
}

// idMatcher says which ids ref, a part of one, matches.
func idMatcher(ref string) (func(string) bool, error) {
	end, isEnd := cutEllipsis(ref)
	part := ref
	if isEnd {
		part = end
	}
	if len(part) < MinIDPart {
		return nil, &Error{Code: 400, Field: "id", Message: fmt.Sprintf(
			"id: %q is too short: give the whole id, or at least %d characters of its start (or of its end, after …)", ref, MinIDPart)}
	}
	if isEnd {
		return func(id string) bool { return strings.HasSuffix(id, end) }, nil
	}
	return func(id string) bool { return strings.HasPrefix(id, ref) }, nil
}

// cutEllipsis is ref without a leading "…" or "...", and whether it had one.
func cutEllipsis(ref string) (string, bool) {
	if end, ok := strings.CutPrefix(ref, "…"); ok {
		return end, true
	}
	return strings.CutPrefix(ref, "...")
}

// describeRef says what ref asks for of an id, for an error.
func describeRef(ref string) string {
	if end, ok := cutEllipsis(ref); ok {
		return fmt.Sprintf("ends with %q", end)
	}
	return fmt.Sprintf("starts with %q", ref)
}
