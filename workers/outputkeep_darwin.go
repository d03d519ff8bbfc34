package workers

// emptyIfUnwritten keeps no file: macOS cannot tell whether another process has
// it open for writing.
func emptyIfUnwritten(string) (kept bool, err error) { return false, nil }
