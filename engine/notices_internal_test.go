package engine

import (
	"testing"

	"github.com/bgtask/bgtask/events"
)

// A second attempt at delivering a notice is caught either by the inbox's dedupe
// window or by a search of the inbox: the age past which it searches lies well
// inside the window, so no attempt falls between the two.
func TestANoticeRetriedPastTheDedupeWindowIsSearchedFor(t *testing.T) {
	if noticeRecheckAfter > events.DefaultDuplicates/2 {
		t.Fatalf("notices are searched for past %v, with a dedupe window of %v: a retry in between is delivered twice", noticeRecheckAfter, events.DefaultDuplicates)
	}
}
