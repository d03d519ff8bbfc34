package engine

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Placement limits which workers may take a task: every label it names must be one
// of the worker's labels, with the same value. No labels: any worker.
type Placement struct {
	Labels map[string]string `json:"labels,omitempty" jsonschema:"labels a worker must have"`
}

// HostLabel is the label every worker has: the host it runs on.
const HostLabel = "host"

// MaxLabels bounds the labels of a placement or a worker.
const MaxLabels = 16

// Compiled at their first use: their counted repetitions make them large
// programs, which every start of the binary, a client command's too, would build.
var (
	labelKey   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$`) })
	labelValue = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._:/@+-]{1,128}$`) })
)

// ValidateLabels checks a set of labels; field names the labels in errors (a spec's
// placement.labels, or a worker's --label).
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fieldErr(field, "%d labels is more than %d", len(labels), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if !labelKey().MatchString(k) {
			return fieldErr(field, "label name %q: use 1-63 letters, digits, '.', '_', '/' or '-', starting with a letter or digit", k)
		}
		if !labelValue().MatchString(labels[k]) {
			return fieldErr(field, "label %s=%q: the value must be 1-128 letters, digits or ._:/@+-", k, labels[k])
		}
	}
	return nil
}

func (p *Placement) validate() error {
	if p == nil {
		return nil
	}
	return ValidateLabels("placement.labels", p.Labels)
}

// Matches reports whether a worker with these labels may take the task.
func (p *Placement) Matches(labels map[string]string) bool {
	if p == nil {
		return true
	}
	for k, v := range p.Labels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// NamesAll reports whether the placement names each of these labels but host: an
// exclusive worker, kept for the tasks placed on its labels, takes only those.
// (That the values agree is Matches's part.)
func (p *Placement) NamesAll(labels map[string]string) bool {
	for k := range labels {
		if k == HostLabel {
			continue
		}
		if p == nil {
			return false
		}
		if _, ok := p.Labels[k]; !ok {
			return false
		}
	}
	return true
}

// Admits reports whether a worker with these labels may take the task: its labels
// match the placement and, if the worker is exclusive, the placement names them.
func (p *Placement) Admits(labels map[string]string, exclusive bool) bool {
	return p.Matches(labels) && (!exclusive || p.NamesAll(labels))
}

// ExclusiveLabels are the labels an exclusive worker is kept for: all but host.
func ExclusiveLabels(labels map[string]string) map[string]string {
	kept := maps.Clone(labels)
	delete(kept, HostLabel)
	return kept
}

// String is the placement as a person reads it: host=build-1, pool=blue.
func (p *Placement) String() string {
	if p == nil || len(p.Labels) == 0 {
		return ""
	}
	return FormatLabels(p.Labels)
}

// FormatLabels writes labels sorted by name: a=1, b=2.
func FormatLabels(labels map[string]string) string {
	parts := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ", ")
}

// Candidate is a worker as the scheduler sees it when it places a task.
type Candidate struct {
	ID     string
	Labels map[string]string
	// MaxTasks is its capacity; Load how many tasks it runs or has been offered.
	MaxTasks int
	Load     int
	// Accepting is false while it starts, drains or stops.
	Accepting bool
	// Exclusive: it takes only tasks whose placement names each of its labels but
	// host (bgtask worker --exclusive).
	Exclusive bool
}

// Choose picks the worker a task is offered to, or says why there is none.
//
// The rule: among the workers that accept tasks, match the placement (an exclusive
// worker: that names its labels) and have a free slot, the least loaded one relative to its capacity; a tie goes to the
// worker that the task's id hashes highest with (rendezvous hashing), so engine
// replicas that see the same fleet choose the same worker for the same task.
func Choose(s State, workers []Candidate) (string, string) {
	var best *Candidate
	var bestHash uint64
	matching, full := 0, 0
	var kept *Candidate // an exclusive worker whose labels match but are not named
	for i := range workers {
		w := &workers[i]
		if !s.Spec.Placement.Matches(w.Labels) {
			continue
		}
		if w.Exclusive && !s.Spec.Placement.NamesAll(w.Labels) {
			kept = cmp.Or(kept, w)
			continue
		}
		matching++
		if !w.Accepting {
			continue
		}
		if w.Load >= w.MaxTasks {
			full++
			continue
		}
		h := rendezvous(s.ID, w.ID)
		if best == nil || lessLoaded(w, best) || (sameLoad(w, best) && h > bestHash) {
			best, bestHash = w, h
		}
	}
	if best != nil {
		return best.ID, ""
	}
	return "", waitingReason(s.Spec.Placement, len(workers), matching, full, kept)
}

func waitingReason(p *Placement, workers, matching, full int, kept *Candidate) string {
	who := "a worker"
	if p.String() != "" {
		who = "a worker with " + p.String()
	}
	switch {
	case workers == 0:
		return "waiting for " + who + ": no worker is connected"
	case matching == 0 && kept != nil:
		return fmt.Sprintf("waiting for %s: worker %s, which has these labels, is exclusive: it takes only tasks placed on %s",
			who, kept.ID, FormatLabels(ExclusiveLabels(kept.Labels)))
	case matching == 0:
		return "waiting for " + who + ": no live worker has these labels"
	case full == matching:
		return fmt.Sprintf("waiting for a free slot: the %s that can take it %s at capacity", plural(matching, "worker"), isAre(matching))
	case full == 0:
		return fmt.Sprintf("waiting for %s: the %s that can take it %s starting, draining or stopping", who, plural(matching, "worker"), isAre(matching))
	}
	return fmt.Sprintf("waiting for a free slot: of the %s that can take it, %d %s at capacity and the others are not taking tasks", plural(matching, "worker"), full, isAre(full))
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

// lessLoaded compares load/capacity without division.
func lessLoaded(a, b *Candidate) bool { return a.Load*b.MaxTasks < b.Load*a.MaxTasks }
func sameLoad(a, b *Candidate) bool   { return a.Load*b.MaxTasks == b.Load*a.MaxTasks }

func rendezvous(taskID, workerID string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(taskID))
	h.Write([]byte{0})
	h.Write([]byte(workerID))
	return h.Sum64()
}

// Turns remembers when each target, and each kind of a target, last got a slot, so
// that FairOrder can give the next one to whoever waited longest for a turn.
type Turns struct {
	n    uint64
	last map[string]uint64
}

// NewTurns returns turns where no one has been served yet.
func NewTurns() *Turns { return &Turns{last: map[string]uint64{}} }

func targetKey(s *State) string { return s.Spec.Target }
func kindKey(s *State) string   { return s.Spec.Target + "\x00" + s.Spec.Kind }

// Served records that a task's target and kind got a slot now.
func (t *Turns) Served(s State) {
	t.n++
	t.last[targetKey(&s)] = t.n
	t.last[kindKey(&s)] = t.n
}

// ActiveTurns are the targets and kinds that have a task waiting or running:
// the turns that Keep keeps.
type ActiveTurns map[string]bool

// Add counts the target and the kind of s as active.
func (a ActiveTurns) Add(s *State) { a[targetKey(s)], a[kindKey(s)] = true, true }

// Keep forgets the targets and kinds that are not active: one that comes back
// after that has had no turn that still matters.
func (t *Turns) Keep(active ActiveTurns) {
	for k := range t.last {
		if !active[k] {
			delete(t.last, k)
		}
	}
}

func (t *Turns) of(key string) uint64 {
	if t == nil {
		return 0
	}
	return t.last[key]
}

// FairOrder is the order in which waiting tasks get free slots. Targets take turns,
// one task each: first the target that was served least recently (never, first),
// and among those the one whose task has waited longest; within a target its kinds
// take turns the same way; within a kind the oldest task goes first. So a target
// (or a kind) with a thousand queued tasks delays another target's task by at most
// one task, never by its whole queue, even when only one slot is ever free.
func FairOrder(tasks []State, turns *Turns) []State {
	// Ordered by pointer: a State is large, and a pass orders every waiting task.
	sorted := make([]*State, len(tasks))
	for i := range tasks {
		sorted[i] = &tasks[i]
	}
	slices.SortFunc(sorted, func(a, b *State) int {
		if c := a.ArmedAt.Compare(b.ArmedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.Seq, b.Seq)
	})
	byTarget := groupInOrder(sorted, targetKey)
	sortByTurn(byTarget, turns)
	perTarget := make([][]*State, len(byTarget))
	for i, target := range byTarget {
		byKind := groupInOrder(target.tasks, kindKey)
		sortByTurn(byKind, turns)
		kinds := make([][]*State, len(byKind))
		for k, kind := range byKind {
			kinds[k] = kind.tasks
		}
		perTarget[i] = interleave(kinds)
	}
	out := make([]State, 0, len(tasks))
	for _, s := range interleave(perTarget) {
		out = append(out, *s)
	}
	return out
}

// group is tasks of one target, or of one kind of a target, oldest first.
type group struct {
	key   string
	tasks []*State
}

// sortByTurn puts the groups served least recently first, keeping the order of
// their oldest task among equals.
func sortByTurn(groups []group, turns *Turns) {
	slices.SortStableFunc(groups, func(a, b group) int {
		return cmp.Compare(turns.of(a.key), turns.of(b.key))
	})
}

// groupInOrder splits tasks by key, keeping their order, with the groups in the
// order of their first task.
func groupInOrder(tasks []*State, key func(*State) string) []group {
	index := map[string]int{}
	var groups []group
	for _, t := range tasks {
		k := key(t)
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, group{key: k})
		}
		groups[i].tasks = append(groups[i].tasks, t)
	}
	return groups
}

// interleave takes one task of each list in turn until all are empty.
func interleave(lists [][]*State) []*State {
	n := 0
	for _, l := range lists {
		n += len(l)
	}
	out := make([]*State, 0, n)
	for round := 0; len(out) < n; round++ {
		for _, l := range lists {
			if round < len(l) {
				out = append(out, l[round])
			}
		}
	}
	return out
}
