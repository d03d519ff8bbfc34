package workers

// selfExe is this very binary, even if an upgrade replaced its file.
const selfExe = "/proc/self/exe"
