//go:build !bgtask_portable

package integration

const portableEnabled = false
