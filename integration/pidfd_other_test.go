//go:build !linux

package integration

import "testing"

func pidfdKeepsExits(*testing.T) bool { return false }
