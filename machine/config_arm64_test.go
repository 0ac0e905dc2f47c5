package machine

// defaultCmdlineWords are words the arm64 DefaultCmdline must hold.
var defaultCmdlineWords = []string{"console=ttyS0", "panic=-1", "quiet"}
