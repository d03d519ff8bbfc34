//go:build bgtask_portable

package integration

// portableEnabled: the tests were built with the tag bgtask_portable, and build
// bgtask with it too, so that they run the paths macOS takes (docs/platforms.md).
const portableEnabled = true
