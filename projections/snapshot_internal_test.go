package projections

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestFingerprintFollowsTheStateType(t *testing.T) {
	type v1 struct {
		ID string    `json:"id"`
		At time.Time `json:"at"`
	}
	type v2 struct {
		ID string    `json:"id"`
		At time.Time `json:"at"`
		N  int       `json:"n"`
	}
	type renamed struct {
		ID string    `json:"task_id"`
		At time.Time `json:"at"`
	}
	a := mustFingerprint(reflect.TypeFor[v1]())
	if a != mustFingerprint(reflect.TypeFor[v1]()) {
		t.Fatal("the fingerprint of one type changes")
	}
	for name, other := range map[string]string{"a field added": mustFingerprint(reflect.TypeFor[v2]()), "a key renamed": mustFingerprint(reflect.TypeFor[renamed]())} {
		if other == a {
			t.Errorf("%s: the fingerprint is the same", name)
		}
	}
}

func TestFingerprintRefusesFieldsJSONDoesNotCarry(t *testing.T) {
	type unexported struct {
		ID string `json:"id"`
		//lint:ignore U1000 the test needs an unexported field, which is never read
		cache []byte
	}
	type skipped struct {
		ID   string `json:"id"`
		Tmp  int    `json:"-"`
		Next *skipped
	}
	type anything struct {
		Payload fmt.Stringer `json:"payload"`
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[unexported](), reflect.TypeFor[skipped](), reflect.TypeFor[anything]()} {
		var b strings.Builder
		if err := describeType(&b, typ, map[reflect.Type]bool{}); err == nil {
			t.Errorf("%s: no error", typ)
		}
	}
}
